"""``python -m commlab.run``: torchrun's flags, a launcher that survives its workers.

    python -m commlab.run --nproc-per-node 4 --max-restarts 1 train.py --epochs 3
    # two hosts: one launcher each
    python -m commlab.run --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr 10.0.0.1 --master-port 29400 train.py

Use it instead of torchrun for worlds whose ranks may leave and join: torchrun's agent
ends every worker when one fails and restarts them all from a checkpoint; this launcher
keeps its store (node 0 serves it) and the surviving workers running, reports the lost
worker, and while ``--max-restarts`` allows starts a replacement that joins
(``COMMLAB_JOIN=1`` makes its ``commlab.init()`` a ``commlab.init(join=True)``).
SIGINT/SIGTERM are forwarded to every worker by pid; no worker outlives the launcher.
"""

from __future__ import annotations

import sys

from commlab.errors import CommlabUsageError


def main(argv: list[str] | None = None) -> int:
    """Run the launcher with ``argv`` (default ``sys.argv[1:]``); returns its exit status."""
    from commlab.run._agent import Launcher
    from commlab.run._args import parse

    try:
        cfg = parse(sys.argv[1:] if argv is None else argv)
        return Launcher(cfg).run()
    except CommlabUsageError as e:
        sys.stderr.write(f"{e}\n")
        return 2


__all__ = ["main"]
