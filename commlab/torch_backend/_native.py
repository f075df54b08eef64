"""torch.distributed's collectives on commlab's kernels (the public collectives API).

Each function does one dist op in place, the way torch defines it, for a group that
spans the whole world. Rules torch checks locally (output sizes, dtypes) are published
through commlab's agreement, so a rank that breaks one raises the same error on every
rank instead of leaving its peers waiting.
"""

from __future__ import annotations

import torch

# from the op modules: mypy reads ``commlab.collectives.all_gather`` as the submodule
from commlab.collectives.all_gather import all_gather
from commlab.collectives.all_reduce import all_reduce
from commlab.collectives.all_to_all import all_to_all
from commlab.collectives.broadcast import broadcast
from commlab.collectives.reduce_scatter import reduce_scatter
from commlab.runtime import Signature
from commlab.torch_backend import _into
from commlab.torch_backend._bitcast import NATIVE, from_words, to_words
from commlab.torch_backend._reduce import finish_avg, in_kernel, reduce_rows


def _dt(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def agree(comm, what: str, error: str = "", **fields) -> None:
    """One agreement on this dist-level call: the dtype and shape as torch sees them (the
    kernels may see bit-cast words), or this rank's local error, raised on every rank."""
    comm.control.agree(Signature(what, fields, error))


def check(comm, what: str, error: str) -> None:
    """Raise ``error`` on every rank when any rank found one (costs nothing when none did
    on the kernels' own path: their agreement carries the error instead)."""
    if error:
        agree(comm, what, error)


# --- helpers: every rank's tensor, for any dtype ----------------------------------------


def gather_rows(comm, t: torch.Tensor) -> torch.Tensor:
    """``[W, *t.shape]``: every rank's ``t`` in rank order (commlab's all-gather)."""
    W = comm.world_size
    if t.dtype in NATIVE:
        return all_gather(t.reshape(1, -1)).view(W, *t.shape)
    w, per = to_words(t, 1)
    return from_words(all_gather(w), per, t.dtype, (W, *t.shape))


def exchange_rows(comm, t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as W rows; row j of the result is rank j's row ``me`` (all-to-all)."""
    W = comm.world_size
    if t.dtype in NATIVE:
        return all_to_all(t.reshape(W, -1))
    w, per = to_words(t, W)
    return from_words(all_to_all(w), per, t.dtype, (W, -1))


# --- the ops ------------------------------------------------------------------------


def all_reduce_(comm, t: torch.Tensor, name: str, algorithm: str = "auto") -> None:
    if name == "sum" and t.dtype in NATIVE and t.is_contiguous():
        _into.all_reduce_(t, "sum", algorithm)  # the common call: reduced into t
        return
    if in_kernel(name, t.dtype):
        kernel_op = "sum" if name == "avg" else name
        if t.is_contiguous():
            y = _into.all_reduce_(t, kernel_op, algorithm)
        else:
            y = all_reduce(t, op=kernel_op, algorithm=algorithm)
        if name == "avg":
            y = finish_avg(y, comm.world_size)
        if y.data_ptr() != t.data_ptr():  # not reduced in place (or AVG on integers)
            t.copy_(y)
        return
    agree(comm, "dist.all_reduce", dtype=_dt(t.dtype), shape=tuple(t.shape), op=name)
    t.copy_(reduce_rows(gather_rows(comm, t), name))


def broadcast_(comm, t: torch.Tensor, src: int) -> None:
    native = t.dtype in NATIVE
    if not native:
        agree(comm, "dist.broadcast", dtype=_dt(t.dtype), shape=tuple(t.shape), src=src)
    if native:
        if t.is_contiguous():
            _into.broadcast_(t, src)
            return
        y = broadcast(t, src=src)
        if comm.rank != src:
            t.copy_(y)
        return
    w, per = to_words(t, 1)
    y = broadcast(w, src=src)
    if comm.rank != src:
        t.copy_(from_words(y, per, t.dtype, t.shape))


def _sizes(op: str, W: int, out: torch.Tensor, inp: torch.Tensor, whole: str) -> str:
    """The rule of the *_tensor forms: one dtype, and the ``whole`` side ("output" for a
    gather, "input" for a reduce-scatter) holds world size times the other's elements."""
    if out.dtype != inp.dtype:
        return (f"{op}: output dtype {_dt(out.dtype)} differs from input dtype "
                f"{_dt(inp.dtype)}; pass an output of the input's dtype")
    big, bn, small, sn = ((out, "output", inp, "input") if whole == "output"
                          else (inp, "input", out, "output"))
    if big.numel() != W * small.numel():
        return (f"{op}: {bn} has {big.numel()} elements, but world size {W} x {sn} "
                f"{small.numel()} = {W * small.numel()}; size the {bn} to match")
    return ""


def all_gather_into_(comm, out: torch.Tensor, inp: torch.Tensor) -> None:
    W, n, dtype = comm.world_size, inp.numel(), inp.dtype
    if (dtype in NATIVE and out.dtype == dtype and out.numel() == W * n
            and _into.writable(out, inp)):
        _into.all_gather(inp.reshape(1, n), out.view(W, n))  # the common call
        return
    err = _sizes("all_gather_into_tensor", W, out, inp, whole="output")
    check(comm, "all_gather", err)
    if inp.dtype not in NATIVE:
        agree(comm, "dist.all_gather", dtype=_dt(inp.dtype), shape=tuple(inp.shape))
    elif _into.writable(out, inp):
        _into.all_gather(inp.reshape(1, -1), out.view(comm.world_size, inp.numel()))
        return
    out.copy_(gather_rows(comm, inp).view(out.shape))


def all_gather_list_(comm, outs: list, inp: torch.Tensor) -> None:
    W = comm.world_size
    err = ""
    if len(outs) != W:
        err = f"all_gather: output list has {len(outs)} tensors; pass world size ({W}) tensors"
    elif any(o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
        err = (f"all_gather: every output tensor must match the input ({inp.numel()} "
               f"elements of {_dt(inp.dtype)}); size the outputs like the input")
    check(comm, "all_gather", err)
    if inp.dtype not in NATIVE:
        agree(comm, "dist.all_gather", dtype=_dt(inp.dtype), shape=tuple(inp.shape))
    rows = gather_rows(comm, inp)
    for o, r in zip(outs, rows.unbind(0), strict=True):
        o.copy_(r.view(o.shape))


def reduce_scatter_into_(comm, out: torch.Tensor, inp: torch.Tensor, name: str) -> None:
    W, k, dtype = comm.world_size, out.numel(), out.dtype
    if (name == "sum" and dtype in NATIVE and inp.dtype == dtype and inp.numel() == W * k
            and _into.writable(out, inp)):
        _into.reduce_scatter(inp.reshape(W, k), "sum", out.view(1, k))  # the common call
        return
    err = _sizes("reduce_scatter_tensor", W, out, inp, whole="input")
    check(comm, "reduce_scatter", err)
    if not in_kernel(name, inp.dtype):
        agree(comm, "dist.reduce_scatter", dtype=_dt(inp.dtype), shape=tuple(inp.shape),
              op=name)
        out.copy_(reduce_rows(exchange_rows(comm, inp), name).view(out.shape))
        return
    kernel_op = "sum" if name == "avg" else name
    if _into.writable(out, inp):
        y = _into.reduce_scatter(inp.reshape(W, -1), kernel_op, out.view(1, out.numel()))
    else:
        y = reduce_scatter(inp.reshape(W, -1), op=kernel_op)
    if name == "avg":
        y = finish_avg(y, W)
    if y.data_ptr() != out.data_ptr():  # not written in place (or AVG on integers)
        out.copy_(y.view(out.shape))


def all_to_all_even_(comm, out: torch.Tensor, inp: torch.Tensor) -> None:
    W, n, dtype = comm.world_size, inp.numel(), inp.dtype
    if (dtype in NATIVE and out.dtype == dtype and out.numel() == n and n % W == 0
            and _into.writable(out, inp)):
        _into.all_to_all(inp.reshape(W, n // W), out.view(W, n // W))  # the common call
        return
    err = ""
    if out.dtype != inp.dtype or out.numel() != inp.numel() or inp.numel() % W:
        err = (f"all_to_all_single: input ({inp.numel()} x {_dt(inp.dtype)}) and output "
               f"({out.numel()} x {_dt(out.dtype)}) must have the same dtype and size, "
               f"divisible by the world size {W}; pass split sizes for uneven chunks")
    check(comm, "all_to_all", err)
    if inp.dtype not in NATIVE:
        agree(comm, "dist.all_to_all", dtype=_dt(inp.dtype), shape=tuple(inp.shape))
    elif _into.writable(out, inp):
        _into.all_to_all(inp.reshape(W, -1), out.view(W, inp.numel() // W))
        return
    out.copy_(exchange_rows(comm, inp).view(out.shape))


# --- to or from one rank: every rank runs the kernels, the root keeps what torch defines ---


def reduce_(comm, t: torch.Tensor, name: str, dst: int, algorithm: str = "auto") -> None:
    """``dist.reduce``: an all-reduce whose result only ``dst`` keeps (the others' tensors
    stay as they were)."""
    all_reduce_(comm, t if comm.rank == dst else t.clone(), name, algorithm)


def _root_list_error(comm, op: str, arg: str, role: str, items: list, ref: torch.Tensor,
                     ref_name: str, root: int) -> str:
    """The root's rule for gather_list / scatter_list: world-size many tensors, each
    like ``ref`` ("" on other ranks or when it holds)."""
    W = comm.world_size
    if comm.rank != root:
        return ""
    if len(items) != W:
        return f"{op}: {arg} has {len(items)} tensors on the {role}; pass world size ({W})"
    if any(t.numel() != ref.numel() or t.dtype != ref.dtype for t in items):
        return (f"{op}: every {arg} tensor must match the {ref_name} ({ref.numel()} "
                f"elements of {_dt(ref.dtype)}); size them like the {ref_name}")
    return ""


def gather_(comm, outs: list, inp: torch.Tensor, dst: int) -> None:
    """``dist.gather``: an all-gather whose rows only ``dst`` copies out."""
    err = _root_list_error(comm, "gather", "gather_list", "root", outs, inp, "input", dst)
    check(comm, "gather", err)
    agree(comm, "dist.gather", dtype=_dt(inp.dtype), shape=tuple(inp.shape), dst=dst)
    rows = gather_rows(comm, inp)
    if comm.rank == dst:
        for o, r in zip(outs, rows.unbind(0), strict=True):
            o.copy_(r.view(o.shape))


def scatter_(comm, out: torch.Tensor, ins: list, src: int) -> None:
    """``dist.scatter``: ``src`` broadcasts its whole list, each rank keeps its row."""
    W = comm.world_size
    err = _root_list_error(comm, "scatter", "scatter_list", "source", ins, out, "output", src)
    check(comm, "scatter", err)
    agree(comm, "dist.scatter", dtype=_dt(out.dtype), shape=tuple(out.shape), src=src)
    if comm.rank == src:
        rows = torch.stack([t.reshape(-1) for t in ins]) if ins else out.new_empty(W, 0)
    else:
        rows = out.new_empty(W, out.numel())
    broadcast_(comm, rows, src)
    out.copy_(rows[comm.rank].view(out.shape))
