"""Every setting that shapes the heap or the protocol is agreed at ``commlab.init``.

A rank with another ``scratch_size`` puts its inboxes elsewhere, one with another
``COMMLAB_ROUNDS`` cuts messages differently: sums come out wrong and then a wait hangs.
So before the heap is built every rank publishes its values (one all-gather over the
bootstrap's gloo group) and every rank raises the same ``CommlabUsageError`` naming each
differing setting and every rank's value. Settings that only change how fast one rank
works (the interpreter's fast paths, the hang report's grace) may differ.
"""

from __future__ import annotations

import torch.distributed as dist

from commlab import _config
from commlab.errors import CommlabUsageError

# environment settings every rank must share (name -> why, for the message)
SHARED_ENV = {
    "COMMLAB_ROUNDS": "the collectives' pipeline depth",
    "COMMLAB_AGREE_AHEAD": "whether repeated calls run ahead of the agreement",
    "COMMLAB_FAST_LAUNCH": "whether calls use cached launch plans",
    "COMMLAB_HOSTS": "how the world splits into hosts",
    "COMMLAB_HEAP": "which heap the world builds",
    "COMMLAB_TORCH_BACKEND": "whether torch.distributed runs on commlab",
    "COMMLAB_TUNING_DIR": "the tuning tables algorithm='auto' reads",
}


def _ranks(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"


def settings(params: dict) -> dict:
    """This rank's values: the init parameters given, then the shared environment."""
    return {**params, **{name: _config.raw(name) for name in SHARED_ENV}}


def differences(values: list[dict]) -> list[str]:
    """One sentence per setting whose value differs across ranks (``values[r]``: rank
    r's ``settings``), each rank's value shown."""
    out = []
    for key in values[0]:
        seen: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            seen.setdefault(repr(v.get(key)), []).append(r)
        if len(seen) > 1:
            why = f" ({SHARED_ENV[key]})" if key in SHARED_ENV else ""
            each = ", ".join(f"{_ranks(rs)}: {v}" for v, rs in seen.items())
            out.append(f"{key}{why} differs across ranks ({each})")
    return out


def agree_settings(world, params: dict) -> None:
    """Raise the same CommlabUsageError on every rank when a setting differs (collective
    over the world's gloo group; one rank's world: nothing to agree)."""
    if world.world_size == 1:
        return
    values: list = [None] * world.world_size
    dist.all_gather_object(values, settings(params), group=world.cpu_group)
    diffs = differences(values)
    if diffs:
        raise CommlabUsageError(
            f"commlab.init: {'; '.join(diffs)}; pass the same init arguments and set the "
            f"same COMMLAB_* variables on every rank")
