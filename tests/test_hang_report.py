"""The hang report's description of one blocked rank, from its faulthandler dump."""

from __future__ import annotations

from commlab.engine._report import describe_stack

SITE = "/usr/lib/python3/site-packages/commlab"
DUMP = f"""Thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/runtime/_beats.py", line 50 in _run
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/runtime/_control.py", line 300 in agree
  File "{SITE}/collectives/_host.py", line 80 in run
  File "{SITE}/collectives/all_reduce.py", line 40 in all_reduce
  File "/tmp/ipykernel_123/In7_4567.py", line 3 in <module>
"""


def test_the_cells_thread_is_described_though_a_commlab_thread_is_dumped_first():
    text, inside = describe_stack(3, DUMP)
    assert inside
    assert "[rank 3] blocked in commlab.all_reduce" in text, text
    assert "waiting at the agreement block" in text, text
