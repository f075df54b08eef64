"""``python -m commlab.run``'s flags: torchrun's names (dashes or underscores), checked
before anything starts; each refusal states the rule, the value and the fix."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from commlab.errors import CommlabUsageError


@dataclass
class RunConfig:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int | None  # None: one host, a free port is picked
    max_restarts: int  # how many replacement workers this launcher may start
    command: list[str] = field(default_factory=list)  # argv after the interpreter
    grace_s: float = 10.0  # after forwarding SIGINT/SIGTERM, before SIGKILL
    linger_s: float = 30.0  # node 0 keeps the store for the other nodes' launchers

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def _flag(parser: argparse.ArgumentParser, name: str, **kw) -> None:
    """``--a-b`` and ``--a_b``, as torchrun accepts both."""
    parser.add_argument(f"--{name}", f"--{name.replace('-', '_')}", **kw)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m commlab.run",
        description="Start ranks like torchrun, but keep the store and the survivors alive "
                    "when a worker dies, and start replacements that join the running world.")
    _flag(p, "nproc-per-node", default="1", help="workers on this host (default 1)")
    _flag(p, "nnodes", default="1", help="hosts, each running one launcher (default 1)")
    _flag(p, "node-rank", type=int, default=0, help="this host's index, 0..nnodes-1")
    _flag(p, "master-addr", default=None,
          help="address of node 0, where its launcher serves the store (one host: 127.0.0.1)")
    _flag(p, "master-port", type=int, default=None,
          help="the store's port (one host: a free port by default)")
    _flag(p, "rdzv-endpoint", default=None, help="HOST:PORT, instead of --master-addr/-port")
    _flag(p, "max-restarts", type=int, default=0,
          help="replacement workers this launcher may start after workers die (default 0)")
    p.add_argument("--standalone", action="store_true",
                   help="one host, a free port (the default with --nnodes 1)")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module (python -m TARGET)")
    _flag(p, "grace", type=float, default=10.0,
          help="seconds workers get after a forwarded SIGINT/SIGTERM before SIGKILL")
    p.add_argument("target", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def _count(flag: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise CommlabUsageError(
            f"commlab.run: --{flag} must be a whole number, got {value!r}"
            f"{' (a MIN:MAX range is torchrun elastic rendezvous)' if ':' in value else ''}; "
            f"give the number of {'hosts' if flag == 'nnodes' else 'workers'}, e.g. "
            f"--{flag} 2: ranks that leave and join need no range here") from None
    if n < 1:
        raise CommlabUsageError(f"commlab.run: --{flag} must be at least 1, got {n}")
    return n


def parse(argv: list[str]) -> RunConfig:
    """The checked configuration (CommlabUsageError for anything that cannot start)."""
    a = parser().parse_args(argv)
    nproc, nnodes = _count("nproc-per-node", a.nproc_per_node), _count("nnodes", a.nnodes)
    if not 0 <= a.node_rank < nnodes:
        raise CommlabUsageError(
            f"commlab.run: --node-rank must be in 0..{nnodes - 1} for --nnodes {nnodes}, got "
            f"{a.node_rank}; give each host's launcher its own index")
    addr, port = a.master_addr, a.master_port
    if a.rdzv_endpoint:
        if addr or port is not None:
            raise CommlabUsageError("commlab.run: give --rdzv-endpoint or --master-addr/"
                                    "--master-port, not both")
        host, sep, p = a.rdzv_endpoint.rpartition(":")
        if not sep or not host or not p.isdigit():
            raise CommlabUsageError(
                f"commlab.run: --rdzv-endpoint must be HOST:PORT, got {a.rdzv_endpoint!r}; "
                f"e.g. --rdzv-endpoint 10.0.0.1:29400")
        addr, port = host, int(p)
    if nnodes > 1 and (not addr or port is None):
        raise CommlabUsageError(
            f"commlab.run: --nnodes {nnodes} needs node 0's address and the store's port on "
            f"every host (--master-addr A --master-port P, or --rdzv-endpoint A:P); got "
            f"{addr or 'no address'} and {port if port is not None else 'no port'}")
    if port is not None and not 0 < port < 65536:
        raise CommlabUsageError(f"commlab.run: --master-port must be in 1..65535, got {port}")
    if a.max_restarts < 0:
        raise CommlabUsageError(
            f"commlab.run: --max-restarts must be 0 or more, got {a.max_restarts}")
    if a.grace < 0:
        raise CommlabUsageError(f"commlab.run: --grace must be 0 or more, got {a.grace:g}")
    command = (["-m", a.target] if a.module else [a.target]) + list(a.args)
    return RunConfig(nproc, nnodes, a.node_rank, addr or "127.0.0.1", port, a.max_restarts,
                     command, grace_s=a.grace)
