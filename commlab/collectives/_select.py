"""``algorithm="auto"``: which all-reduce algorithm to run for a message.

Before any tuning, documented defaults: one-shot up to 256 KiB (latency-bound: one
barrier round and one pass), two-shot above (each rank moves 2·N·(W-1)/W instead of
N·(W-1)). ``commlab.tune()`` replaces these with a measured table keyed by
(op, dtype, world size, topology fingerprint); see ``commlab.tuning``.
"""

from __future__ import annotations

ONE_SHOT_MAX_BYTES = 256 * 1024


def choose_all_reduce(comm, dtype, nbytes: int) -> str:
    try:
        from commlab.tuning import lookup
    except ImportError:  # tuning is optional
        lookup = None
    if lookup is not None:
        algo = lookup(comm, "all_reduce", dtype, nbytes)
        if algo:
            return algo
    if comm.world_size <= 2 or nbytes <= ONE_SHOT_MAX_BYTES:
        return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES else "two_shot"
    return "two_shot"
