"""Write your own collective: a ring all-gather from commlab's device primitives.

When it wins: it does not, against commlab.all_gather's direct push on a fully connected
node (NVLink/NVSwitch, or the CPU backend): a ring needs W-1 dependent steps where a
direct push (every rank stores its input into every peer's inbox at once) needs one. It
is the right shape where only neighbours are linked (a ring of PCIe switches, a chain of
hosts), and the simplest collective that shows every primitive: symmetric stores,
signals that count, and waits.

    row me of my buffer = x                      # host: stage the input
    tell the left neighbour: "you may write into my buffer"
    for s in 0 .. W-2:
        r = me - s                               # the row I forward at step s
        if s > 0: wait until step counter >= s   # row r arrived from the left at s-1
        copy row r into the right neighbour's buffer (symm_at stores)
        bump the right neighbour's step counter  # notify(add): "row r is there"
    wait until step counter >= W-1               # the last row (me + 1) arrived

Every call adds W-1 to each counter, so call number ``epoch`` waits for
``epoch·(W-1) + s``: the flags never need resetting between calls.

    import commlab
    from ring_all_gather import ring_all_gather
    comm = commlab.init()
    y = ring_all_gather(x)        # == commlab.all_gather(x), rows in rank order
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import commlab  # noqa: F401  (before the kernel: picks Triton's interpreter on CPU)
import commlab.language as cl

STEP = 0  # flags[STEP]: rows delivered into my buffer, bumped by the left neighbour
READY = 1  # flags[READY]: the right neighbour's buffer may be written (call number + 1)


@triton.jit
def ring_all_gather_kernel(
    # Symmetric buffers
    buf_ptr,  # [W, N]: row me holds our input on entry, every row on exit
    flags_ptr,  # [2] int32: STEP counter, READY credit (see the module docstring)
    ctx,
    # Sizes
    N,  # elements per rank
    EPOCH,  # calls made before this one (signals only grow)
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    right = (me + 1) % world
    left = (me + world - 1) % world
    step0 = EPOCH * (world - 1)  # STEP's value when this call starts
    # --- our buffer is free (the host copied the last call's rows out): let the left
    # neighbour write into it
    cl.notify(flags_ptr + 1, left, ctx, EPOCH + 1, sig_op="set")
    cl.wait(flags_ptr + 1, EPOCH + 1)  # the right neighbour's buffer is free for us
    for s in range(0, world - 1):
        row = (me + world - s) % world
        # --- row `row` reached us at step s - 1 (our own row is here from the start)
        if s > 0:
            cl.wait(flags_ptr, step0 + s)
        # --- forward it: same offsets in the right neighbour's buffer
        src = buf_ptr + row.to(tl.int64) * N
        dst = cl.symm_at(src, right, ctx)
        for start in range(0, N, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < N
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
        # --- release: the row's stores are visible to the right neighbour before the bump
        cl.notify(flags_ptr, right, ctx, 1, sig_op="add")
    # --- the last row (me + 1) arrived: the buffer holds every rank's input
    cl.wait(flags_ptr, step0 + world - 1)


class _RingState:
    """Per communicator: the symmetric flags and how many calls were made."""

    def __init__(self, comm):
        self.comm = comm
        self.flags = commlab.symmetric_zeros((2,), torch.int32)  # collective
        self.epoch = 0


_STATE: dict[int, _RingState] = {}


def _state(comm) -> _RingState:
    st = _STATE.get(id(comm))
    if st is None or st.comm is not comm:  # first call, or after finalize() + init()
        st = _STATE[id(comm)] = _RingState(comm)
    return st


def ring_all_gather(x: torch.Tensor, *, block: int = 4096) -> torch.Tensor:
    """Gather ``x`` from every rank along dim 0, in rank order, around a ring.

    Collective: every rank calls it with the same shape and dtype (the symmetric
    allocation below checks that and raises on every rank otherwise).
    x: [M, ...] per rank; returns [W * M, ...], a new tensor."""
    comm = commlab.get_communicator()
    if x.dim() == 0:
        raise commlab.CommlabUsageError(
            "ring_all_gather: x is 0-d; pass a tensor with a dim 0, e.g. x.reshape(1)")
    st = _state(comm)
    world, n = comm.world_size, x.numel()
    # --- allocate: a [W, N] symmetric buffer (same offset on every rank)
    buf = commlab.symmetric_empty((world, n), dtype=x.dtype)
    buf[comm.rank].copy_(x.reshape(-1))  # x: [M, ...] -> row me: [N]
    # --- launch: one program walks the whole ring
    if n:
        ring_all_gather_kernel[(1,)](buf, st.flags, comm.context, n, st.epoch,
                                     BLOCK=min(block, triton.next_power_of_2(n)))
        st.epoch += 1
    return buf.reshape(world * x.shape[0], *x.shape[1:]).clone()  # out: [W * M, ...]


# --- rank functions for commlab.testing.run_world (the notebook and the tests use them)


def check_against_torch_distributed(comm, sizes=(1, 7, 1037), repeats: int = 3) -> list[str]:
    """Compare ring_all_gather with torch.distributed.all_gather (gloo on CPU) on fresh
    random data; return one line per case (empty list = all matched)."""
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(1234 + comm.rank)
    problems = []
    for n in sizes:
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for rep in range(repeats):
                x = (torch.randn(n, 3, generator=gen) * 100).to(dtype)
                got = ring_all_gather(x)
                parts = [torch.empty_like(x) for _ in range(comm.world_size)]
                dist.all_gather(parts, x)
                if not torch.equal(got, torch.cat(parts)):
                    problems.append(f"rank {comm.rank}: n={n} {dtype} call {rep} differs")
    return problems


def time_against_all_gather(comm, sizes=(256, 4096, 65536), iters: int = 5) -> list[dict]:
    """Median time per call of ring_all_gather and commlab.all_gather at each size."""
    import statistics
    import time

    rows = []
    for n in sizes:
        x = torch.randn(n)
        for name, fn in (("ring_all_gather", ring_all_gather),
                         ("commlab.all_gather", commlab.all_gather)):
            fn(x)  # warm-up
            times = []
            for _ in range(iters):
                commlab.barrier()
                t0 = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t0)
            rows.append({"impl": name, "bytes": 4 * n, "ms": 1e3 * statistics.median(times)})
    return rows
