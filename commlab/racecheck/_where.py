"""Naming things in messages: the kernel line of an access, a symmetric byte range, a
flag, a program, the schedule's seed."""

from __future__ import annotations

from commlab._interpreter import blocked


def kernel_line() -> str:
    """``file:LINE`` of the innermost frame that is kernel code (not Triton, not the
    device language's own helpers, not the checker)."""
    return blocked.kernel_line()


def region(heap, owner: int, lo: int, hi: int) -> str:
    """The symmetric tensor (or reserved region) holding bytes [lo, hi) of ``owner``."""
    lay = heap.layout
    if lo >= lay.arena:
        blk = heap.arena.block_at(lo)
        if blk is not None:
            start, size = blk
            return (f"the symmetric tensor at heap offset {start:#x} ({size} B) on rank "
                    f"{owner}, bytes {lo - start}..{hi - start - 1}")
        return f"rank {owner}'s heap bytes {lo:#x}..{hi - 1:#x} (no live tensor)"
    for name, start in (("scratch", lay.scratch), ("flags", lay.flags),
                        ("signal pad", lay.signal_pad)):
        if lo >= start:
            return f"rank {owner}'s {name} bytes {lo - start}..{hi - start - 1}"
    return f"rank {owner}'s heap bytes {lo:#x}..{hi - 1:#x}"


def schedule(chk) -> str:
    """Under shuffle=True, the sentence naming the seed (it replays the schedule)."""
    if chk.seed is None:
        return ""
    return (f" Schedule: shuffle seed {chk.seed}; commlab.racecheck(shuffle=True, "
            f"seed={chk.seed}) runs the same program order again.")


def program(idx):
    """A program id as messages and graphs show it: x on a 1-D grid, else [x, y, z]."""
    return idx[0] if idx[1] == 0 and idx[2] == 0 else list(idx)


def flag(heap, off: int) -> str:
    """The int32 flag at heap offset ``off``: its symmetric tensor and index, or the
    reserved region and slot (barrier mailboxes live in the signal pad)."""
    lay = heap.layout
    if off >= lay.arena:
        blk = heap.arena.block_at(off)
        if blk is None:
            return "no live tensor"
        start, size = blk
        return f"int32 [{(off - start) // 4}] of the symmetric tensor at {start:#x}, {size} B"
    for name, start in (("scratch", lay.scratch), ("flags", lay.flags),
                        ("signal pad", lay.signal_pad)):
        if off >= start:
            return f"{name} int32 [{(off - start) // 4}]"
    return "reserved heap bytes"
