"""``algorithm="auto"``: which algorithm to run for a message.

A measured tuning table wins when there is one (``commlab.tune()``, keyed by op, dtype,
world size and topology fingerprint; see ``commlab.tuning``). Before any tuning, these
documented defaults, from bench/results/2xh200-smoke.txt (2xH200, bf16):

- two ranks: one-shot up to 2 MiB (graph mode 1 MiB: 9.7 us against two-shot's 11.5),
  two-shot above (16 MiB: 58.9 us against 63.9);
- more ranks: one-shot up to 256 KiB (it sends (W-1)·N per rank), two-shot above;
- CPU backend (Triton's interpreter with commlab's fast path, 2 cores, fp32): one-shot
  up to 1 MiB (two ranks: 4 MiB), two-shot above. Each call pays a fixed cost of
  interpreted scalar ops and waits, least for one-shot's single signal round (4 ranks,
  64 KiB: one-shot 36 ms, two-shot 83, ring 99); one-shot's extra W·N bytes only tell
  from a few MiB: 4 ranks, 1 MiB 41 ms against two-shot's 79, 4 MiB a tie, 16 MiB
  two-shot 1.7x faster; 2 ranks, 4 MiB one-shot 18 ms against 26
  (``torchrun -m commlab.bench --backend cpu --ops all_reduce --sizes ...``).

all_gather, all_to_all, broadcast: ``direct`` (SM pushes), except inside a CUDA-graph
capture, where the tuning table may pick ``copy_engine``. Measured on 2xH200, bf16
(bench/results/2xh200-w2.json): captured in graphs, the copy engines won only at 1 GiB
(all_gather 1589 against 1615 µs, all_to_all 1597 against 1634, broadcast 2971 against
3073); called eagerly they lost everywhere (1 GiB all_gather 2297 against 1797 µs;
likely the host work of enqueuing two copies per chunk and peer, not measured). The CPU
backend always uses ``direct`` (the path that shows the device language).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ONE_SHOT_MAX_BYTES = 256 * 1024
ONE_SHOT_MAX_BYTES_TWO_RANKS = 2 * 1024 * 1024


ONE_SHOT_MAX_BYTES_CPU = 1024 * 1024
ONE_SHOT_MAX_BYTES_CPU_TWO_RANKS = 4 * 1024 * 1024


def default_all_reduce(world_size: int, nbytes: int, backend: str = "cuda") -> str:
    if backend == "cpu":  # interpreter: a fixed cost per launch, least for one-shot
        limit = ONE_SHOT_MAX_BYTES_CPU_TWO_RANKS if world_size <= 2 else ONE_SHOT_MAX_BYTES_CPU
        return "one_shot" if nbytes <= limit else "two_shot"
    limit = ONE_SHOT_MAX_BYTES_TWO_RANKS if world_size <= 2 else ONE_SHOT_MAX_BYTES
    return "one_shot" if nbytes <= limit else "two_shot"


# (comm, op, dtype, nbytes) -> the measured winner or None; commlab.tuning installs its
# table lookup here when it is imported (``import commlab`` does), so collectives never
# import the measuring layer above them.
_tuned: Callable | None = None


def use_tuning(lookup: Callable | None) -> None:
    """Make ``auto`` ask ``lookup(comm, op, dtype, nbytes)`` before the defaults."""
    global _tuned
    _tuned = lookup


def _lookup(comm, op: str, dtype, nbytes: int) -> str | None:
    return _tuned(comm, op, dtype, nbytes) if _tuned is not None else None


def choose_all_reduce(comm, dtype, nbytes: int) -> str:
    return _lookup(comm, "all_reduce", dtype, nbytes) or default_all_reduce(
        comm.world_size, nbytes, comm.backend)


def choose_move(comm, op: str, dtype, nbytes: int) -> str:
    """all_gather / all_to_all / broadcast; ``nbytes`` is the output's size. The tuning
    table (measured in CUDA graphs) is consulted only while a graph is being captured."""
    if comm.backend != "cuda" or not torch.cuda.is_current_stream_capturing():
        return "direct"
    return _lookup(comm, op, dtype, nbytes) or "direct"


def choose(comm, op: str, dtype, nbytes: int, algorithms: tuple[str, ...]) -> str:
    """What ``algorithm="auto"`` runs for ``op`` (of ``algorithms``, its bodies)."""
    if len(algorithms) == 1:
        return algorithms[0]
    if op == "all_reduce":
        return choose_all_reduce(comm, dtype, nbytes)
    return choose_move(comm, op, dtype, nbytes)


def capturing_auto(comm, algorithm: str) -> bool:
    """An auto call inside a CUDA-graph capture: it must choose afresh (choose_move), not
    replay a launch plan an eager call of the same shape left behind."""
    return (algorithm == "auto" and comm.backend == "cuda"
            and torch.cuda.is_current_stream_capturing())
