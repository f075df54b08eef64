"""Which NVML NVLink counter reads are safe on this machine? Each case runs in its own
process (a crash inside NVML must not take the others down) and prints its exit code.

    python bench/checks/nvml_probe.py

Cases read NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (138/139) with the link index as
scope id for GPU 0, 20 times: all links in one call, one link (2 fields) per call, one
field per call, and the all-links call after commlab.topology.discover().
"""

from __future__ import annotations

import subprocess
import sys

CASE = r"""
import sys, pynvml
case = sys.argv[1]
if case.startswith("discover"):
    from commlab import topology as T
    T.discover()
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
n = 0
for lk in range(pynvml.NVML_NVLINK_MAX_LINKS):
    try:
        pynvml.nvmlDeviceGetNvLinkState(h, lk)
        n = lk + 1
    except pynvml.NVMLError:
        break
fields = [(f, lk) for lk in range(n) for f in (138, 139)]
for _ in range(20):
    if case.endswith("all"):
        vals = [pynvml.nvmlDeviceGetFieldValues(h, fields)]
    elif case.endswith("link"):
        vals = [pynvml.nvmlDeviceGetFieldValues(h, fields[i:i + 2]) for i in range(0, len(fields), 2)]
    else:
        vals = [pynvml.nvmlDeviceGetFieldValues(h, [f]) for f in fields]
v = [x for arr in vals for x in arr]
print(case, "links", n, "ok", sum(x.nvmlReturn == 0 for x in v), "of", len(v),
      "first", [x.value.ullVal for x in v[:4]])
pynvml.nvmlShutdown()
"""

for case in ("all", "per_link", "per_field", "discover_all"):
    r = subprocess.run([sys.executable, "-c", CASE, case], capture_output=True, text=True,
                       timeout=60)
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    print(f"{case:14s} exit {r.returncode}: {' | '.join(tail)}", flush=True)
