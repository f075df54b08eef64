"""``algorithm="auto"``: which algorithm to run for a message.

A measured tuning table wins when there is one (``commlab.tune()``, keyed by op, dtype,
world size and topology fingerprint; see ``commlab.tuning``). Before any tuning, these
documented defaults, from bench/results/2xh200-smoke.txt (2xH200, bf16):

- two ranks: one-shot up to 2 MiB (graph mode 1 MiB: 9.7 us against two-shot's 11.5),
  two-shot above (16 MiB: 58.9 us against 63.9);
- more ranks: one-shot up to 256 KiB (it sends (W-1)·N per rank), two-shot above;
- CPU backend: one-shot up to 64 KiB, two-shot above (the interpreter's cost is per
  element touched, and one-shot touches W·N).

all_gather, all_to_all, broadcast: ``direct`` (SM pushes) below COPY_ENGINE_MIN_BYTES
of output, ``copy_engine`` from there on CUDA (a copy engine moves 389-394 GB/s per
direction on 2xH200 where SM stores reach 355: bench/results/link-ceiling-2xh200.txt;
below a few MiB the copy engine's per-copy latency and the extra launches lose). The
CPU backend always uses ``direct`` (the path that shows the device language).
"""

from __future__ import annotations

from commlab.tuning import lookup

ONE_SHOT_MAX_BYTES = 256 * 1024
ONE_SHOT_MAX_BYTES_TWO_RANKS = 2 * 1024 * 1024


ONE_SHOT_MAX_BYTES_CPU = 64 * 1024


def default_all_reduce(world_size: int, nbytes: int, backend: str = "cuda") -> str:
    if backend == "cpu":  # interpreter: cost is per element touched; one-shot touches W·N
        return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES_CPU else "two_shot"
    limit = ONE_SHOT_MAX_BYTES_TWO_RANKS if world_size <= 2 else ONE_SHOT_MAX_BYTES
    return "one_shot" if nbytes <= limit else "two_shot"


def choose_all_reduce(comm, dtype, nbytes: int) -> str:
    return lookup(comm, "all_reduce", dtype, nbytes) or default_all_reduce(
        comm.world_size, nbytes, comm.backend)


COPY_ENGINE_MIN_BYTES = 32 << 20


def default_move(nbytes: int, backend: str = "cuda") -> str:
    return "copy_engine" if backend == "cuda" and nbytes >= COPY_ENGINE_MIN_BYTES else "direct"


def choose_move(comm, op: str, dtype, nbytes: int) -> str:
    """all_gather / all_to_all / broadcast; ``nbytes`` is the output's size."""
    return lookup(comm, op, dtype, nbytes) or default_move(nbytes, comm.backend)
