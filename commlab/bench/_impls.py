"""What the benchmark runs: inputs, the trusted reference, and every implementation.

Implementations, side by side for each op:

* ``commlab:<algorithm>`` — commlab's collectives (all_reduce: every algorithm including
  ``auto``; the other ops have one algorithm, ``direct``). Each call includes commlab's
  host-side agreement (a few µs of Python) in eager mode; in graph mode that agreement
  ran once, at capture, and replays launch only the staging copies and kernels.
* ``nccl`` (``gloo`` on the CPU backend) — torch.distributed on the same process group.
* ``torch_symm_mem:<algorithm>`` — PyTorch's symmetric-memory ops, CUDA only, found by
  name at run time (torch 2.11 and 2.13 both have ``one_shot_all_reduce``,
  ``two_shot_all_reduce_``, ``_low_contention_all_gather`` and
  ``_low_contention_reduce_scatter``). Their input already lives in a symmetric buffer,
  as in PyTorch's own use. No ``multimem_*`` op is ever used: NVLink multicast stays off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import commlab
from commlab.bench._records import OPS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int32": torch.int32}
COMMLAB_ALGORITHMS = {"all_reduce": ("one_shot", "two_shot", "ring", "auto"),
                      "all_gather": ("direct", "copy_engine", "auto"),
                      "all_to_all": ("direct", "copy_engine", "auto"),
                      "broadcast": ("direct", "copy_engine", "auto")}


@dataclass
class Prepared:
    """A ready-to-time call: ``call()`` runs the collective once and returns its output;
    ``reset()`` (if any) restores an input the call modifies in place."""

    call: Callable[[], torch.Tensor]
    reset: Callable[[], object] | None = None  # its return value is ignored


@dataclass
class Impl:
    """One implementation of one op. ``prepare(comm, x)`` does the setup that is not
    timed (copy into a symmetric buffer, allocate outputs) and returns a Prepared."""

    name: str
    op: str
    prepare: Callable[..., Prepared]
    modes: tuple = ("eager", "graph")
    backends: tuple = ("cpu", "cuda")
    notes: dict = field(default_factory=dict)
    # An optional impl that raises (an op PyTorch lacks for this size or dtype) or gives
    # a wrong result (torch's low-contention reduce-scatter at 1 GiB on 2xH200) is skipped
    # with the reason; a commlab impl that does either is a failure.
    optional: bool = False


# --- inputs and the reference -----------------------------------------------------


def input_numel(op: str, nbytes: int, elem: int, world: int) -> tuple[int, int]:
    """(elements of each rank's input, total bytes as nccl-tests counts them).

    all_gather's ``bytes`` is the gathered output, so each rank contributes bytes/W;
    reduce_scatter and all_to_all split their input in W chunks, so it is rounded to a
    multiple of W elements (at least W)."""
    n = max(1, nbytes // elem)
    if op == "all_gather":
        per = max(1, n // world)
        return per, per * world * elem
    if op in ("reduce_scatter", "all_to_all"):
        n = max(world, n // world * world)
    return n, n * elem


def make_input(op: str, nbytes: int, dtype: torch.dtype, comm, seed: int):
    """Fresh random data, different on every rank (never zeros)."""
    n, total = input_numel(op, nbytes, torch.tensor([], dtype=dtype).element_size(),
                           comm.world_size)
    g = torch.Generator(device=comm.device).manual_seed(seed * 1009 + comm.rank * 7919 + nbytes)
    if dtype.is_floating_point:  # generated where it lives: 1 GiB on the host takes seconds
        x = torch.randn(n, generator=g, device=comm.device, dtype=torch.float32).to(dtype)
    else:
        x = torch.randint(-1000, 1000, (n,), generator=g, device=comm.device, dtype=dtype)
    return x, total


def _dist_call(op: str, comm, x: torch.Tensor) -> Prepared:
    """torch.distributed on comm.group (NCCL for CUDA tensors, gloo for CPU ones)."""
    g, w = comm.group, comm.world_size
    if op == "all_reduce":
        y = x.clone()
        return Prepared(lambda: (dist.all_reduce(y, group=g), y)[1], lambda: y.copy_(x))
    if op == "broadcast":
        y = x.clone()
        return Prepared(lambda: (dist.broadcast(y, src=0, group=g), y)[1], lambda: y.copy_(x))
    if op == "all_gather":
        out = torch.empty(w * x.numel(), dtype=x.dtype, device=x.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return Prepared(lambda: (gather(out, x, group=g), out)[1])
    if op == "reduce_scatter":
        out = torch.empty(x.numel() // w, dtype=x.dtype, device=x.device)
        return Prepared(lambda: (dist.reduce_scatter_tensor(out, x, group=g), out)[1])
    if op == "all_to_all":
        out = torch.empty_like(x)
        return Prepared(lambda: (dist.all_to_all_single(out, x, group=g), out)[1])
    raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")


def reference(op: str, comm, x: torch.Tensor) -> torch.Tensor:
    """The answer the library people trust gives (NCCL on GPU, gloo on CPU). gloo has
    no reduce_scatter on CPU tensors: there the reference is all_reduce + our chunk."""
    if op == "reduce_scatter" and comm.backend == "cpu":
        full = _dist_call("all_reduce", comm, x).call()
        return full.chunk(comm.world_size)[comm.rank].clone()
    return _dist_call(op, comm, x).call().clone()


# --- the implementations ----------------------------------------------------------


def _commlab(op: str, algorithm: str) -> Impl:
    def prepare(comm, x):
        if op == "all_reduce":
            return Prepared(lambda: commlab.all_reduce(x, algorithm=algorithm))
        if op == "broadcast":
            return Prepared(lambda: commlab.broadcast(x, src=0, algorithm=algorithm))
        fn = getattr(commlab, op)
        if op in COMMLAB_ALGORITHMS:
            return Prepared(lambda: fn(x, algorithm=algorithm))
        return Prepared(lambda: fn(x))

    return Impl(f"commlab:{algorithm}", op, prepare)


def _baseline(op: str, backend: str) -> Impl:
    name = "nccl" if backend == "cuda" else "gloo"
    backends = (backend,)
    if op == "reduce_scatter" and backend == "cpu":
        def prepare(comm, x):  # gloo lacks reduce_scatter_tensor: time what users would do
            return Prepared(lambda: reference(op, comm, x))
        return Impl(name, op, prepare, backends=backends,
                    notes={"cpu": "gloo all_reduce + local chunk (gloo has no reduce_scatter)"})
    return Impl(name, op, lambda comm, x: _dist_call(op, comm, x), backends=backends)


class _SymmBuffer:
    """One PyTorch symmetric-memory allocation per process, grown on demand, that the
    torch_symm_mem implementations copy their input into (outside the timed region)."""

    buf: torch.Tensor | None = None

    @classmethod
    def view(cls, comm, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed._symmetric_memory as symm_mem

        nbytes = x.numel() * x.element_size()
        if cls.buf is None or cls.buf.numel() < nbytes:
            cls.buf = None
            torch.cuda.empty_cache()
            cls.buf = symm_mem.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=comm.device)
            symm_mem.rendezvous(cls.buf, comm.group.group_name)
        return cls.buf[:nbytes].view(x.dtype)


def _symm_ops(op: str) -> list[Impl]:
    """PyTorch symmetric-memory ops that exist in this torch, never multimem ones."""
    have = lambda name: hasattr(torch.ops.symm_mem, name)  # noqa: E731
    out = []

    def make(algorithm, body, in_place=False, modes=("eager", "graph")):
        def prepare(comm, x):
            sym = _SymmBuffer.view(comm, x)
            sym.copy_(x)
            name = comm.group.group_name
            reset = (lambda: sym.copy_(x)) if in_place else None
            return Prepared(lambda: body(sym, name), reset)
        out.append(Impl(f"torch_symm_mem:{algorithm}", op, prepare, modes=modes,
                        backends=("cuda",), optional=True))

    ops = torch.ops.symm_mem
    if op == "all_reduce":
        if have("one_shot_all_reduce"):
            make("one_shot", lambda s, g: ops.one_shot_all_reduce(s, "sum", g))
        if have("two_shot_all_reduce_"):
            make("two_shot", lambda s, g: ops.two_shot_all_reduce_(s, "sum", g), in_place=True)
    # The low-contention ops fork work onto side streams that they do not join back
    # inside a capture (torch 2.11: "capturing stream has unjoined work"), and the failed
    # capture leaves the caching allocator asserting at exit: time them eagerly only.
    eager = ("eager",)
    if op == "all_gather" and have("_low_contention_all_gather"):
        make("low_contention", lambda s, g: ops._low_contention_all_gather(s, g), modes=eager)
    if op == "reduce_scatter" and have("_low_contention_reduce_scatter"):
        make("low_contention", lambda s, g: ops._low_contention_reduce_scatter(s, "sum", g),
             modes=eager)
    return out


def implementations(op: str, backend: str) -> list[Impl]:
    """Every implementation of ``op`` on this backend, baseline first."""
    impls = [_baseline(op, backend)]
    impls += [_commlab(op, a) for a in COMMLAB_ALGORITHMS.get(op, ("direct",))]
    if backend == "cuda":
        impls += _symm_ops(op)
    return impls
