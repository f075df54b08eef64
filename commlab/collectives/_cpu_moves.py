"""Host twins of the all_gather, reduce_scatter, broadcast and all_to_all kernels (CPU
backend, ``commlab._interpreter.twins``): each kernel's program 0 with whole-range
copies, for the one-program launches without pipelining that the CPU backend makes;
anything else (and anything a checker watches) runs in the interpreter.
"""

from __future__ import annotations

from commlab._interpreter import twins
from commlab.collectives._cpu_sync import PHASES, Program, reduce_into
from commlab.collectives.all_gather import all_gather_kernel
from commlab.collectives.all_to_all import all_to_all_kernel
from commlab.collectives.broadcast import broadcast_kernel
from commlab.collectives.reduce_scatter import reduce_scatter_kernel


def _program(grid, ROUNDS, ctx) -> Program | None:
    if grid != (1, 1, 1) or ROUNDS != 1:
        return None
    p = Program(ctx)
    return p if p.usable() else None


def all_gather_twin(grid, x_ptr, out_ptr, scratch_ptr, ctx, N, CAP, N_TOTAL, COL, BLOCK,
                    ROUNDS):
    p = _program(grid, ROUNDS, ctx)
    if p is None:
        return False
    me, world, out = p.me, p.world, out_ptr.view(-1)
    n = p.begin_call()
    inbox = (n % 2) * world * CAP
    # --- push our piece into every peer's inbox and our own output row
    out[me * N_TOTAL + COL:me * N_TOTAL + COL + N].copy_(x_ptr[:N])
    for peer in p.peers:
        p.remote(scratch_ptr, inbox + me * CAP, N, peer).copy_(x_ptr[:N])
    p.signal_all(n * PHASES + 1)
    # --- the peers' pieces landed; copy them into their rows
    p.wait_all(n * PHASES + 1)
    for src in p.peers:
        out[src * N_TOTAL + COL:src * N_TOTAL + COL + N].copy_(
            p.local(scratch_ptr, inbox + src * CAP, N))
    p.end_call(n)
    return True


def reduce_scatter_twin(grid, x_ptr, out_ptr, scratch_ptr, ctx, COLS, CAP, C, COL, OP,
                        BLOCK, ROUNDS):
    p = _program(grid, ROUNDS, ctx)
    if p is None:
        return False
    me, world, x = p.me, p.world, x_ptr.view(-1)
    n = p.begin_call()
    inbox = (n % 2) * world * CAP
    # --- push chunk c of our input to rank c
    for c in p.peers:
        p.remote(scratch_ptr, inbox + me * CAP, COLS, c).copy_(x[c * C + COL:c * C + COL + COLS])
    p.signal_all(n * PHASES + 1)
    # --- every share of our chunk landed; reduce it (ours first, then peers in ring order)
    p.wait_all(n * PHASES + 1)
    parts = [x[me * C + COL:me * C + COL + COLS]] + [
        p.local(scratch_ptr, inbox + s * CAP, COLS) for s in p.peers]
    reduce_into(out_ptr.view(-1)[COL:COL + COLS], parts, OP)
    p.end_call(n)
    return True


def broadcast_twin(grid, x_ptr, out_ptr, scratch_ptr, ctx, N, CAP, SRC, BLOCK, ROUNDS):
    p = _program(grid, ROUNDS, ctx)
    if p is None:
        return False
    me = p.me
    n = p.begin_call()
    base = n * PHASES
    inbox = (n % 2) * CAP
    if me == SRC:
        p.wait_all(base - 2 * PHASES + 1, 0)  # call n-2 done: this half is free
        out_ptr[:N].copy_(x_ptr[:N])
        for peer in p.peers:
            p.remote(scratch_ptr, inbox, N, peer).copy_(x_ptr[:N])
        p.signal_all(base + 1, 1)  # the data is in every inbox
    else:
        p.wait_from(SRC, base + 1, 1)
        out_ptr[:N].copy_(p.local(scratch_ptr, inbox, N))
    p.signal_all(base + 1, 0)  # acknowledge: we are done with call n's inboxes
    p.end_call(n)
    return True


def all_to_all_twin(grid, x_ptr, out_ptr, scratch_ptr, ctx, COLS, CAP, C, COL, BLOCK, ROUNDS):
    p = _program(grid, ROUNDS, ctx)
    if p is None:
        return False
    me, world = p.me, p.world
    x, out = x_ptr.view(-1), out_ptr.view(-1)
    n = p.begin_call()
    inbox = (n % 2) * world * CAP
    # --- push chunk c to rank c; keep our own chunk
    out[me * C + COL:me * C + COL + COLS].copy_(x[me * C + COL:me * C + COL + COLS])
    for c in p.peers:
        p.remote(scratch_ptr, inbox + me * CAP, COLS, c).copy_(x[c * C + COL:c * C + COL + COLS])
    p.signal_all(n * PHASES + 1)
    # --- every chunk sent to us landed; copy each into its row
    p.wait_all(n * PHASES + 1)
    for s in p.peers:
        out[s * C + COL:s * C + COL + COLS].copy_(p.local(scratch_ptr, inbox + s * CAP, COLS))
    p.end_call(n)
    return True


twins.register(all_gather_kernel, all_gather_twin)
twins.register(reduce_scatter_kernel, reduce_scatter_twin)
twins.register(broadcast_kernel, broadcast_twin)
twins.register(all_to_all_kernel, all_to_all_twin)
