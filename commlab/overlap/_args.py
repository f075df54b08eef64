"""The overlapped ops' argument rules, checked on this rank and agreed with every
rank before anything launches; and the refusal to be captured in a CUDA graph."""

from __future__ import annotations

import torch

from commlab.collectives._common import agree, dtype_name
from commlab.errors import CommlabUsageError
from commlab.runtime import Communicator

DTYPES = (torch.bfloat16, torch.float16)
ALGORITHMS = ("auto", "fused", "sequential")


def refuse_capture(op: str, comm: Communicator) -> None:
    """The fused kernels number their calls on the host (epochs in kernel arguments and
    copy-engine flag writes), which a CUDA-graph replay would freeze: refuse to be
    captured rather than read stale chunks."""
    if comm.backend == "cuda" and torch.cuda.is_current_stream_capturing():
        raise CommlabUsageError(
            f"{op}(algorithm='fused') cannot be captured in a CUDA graph: it numbers its "
            f"calls on the host, and a replay would reuse the captured numbers; inside "
            f"graphs pass algorithm='sequential' (or 'auto', which runs it there)")


def check_gemm_args(op: str, comm: Communicator, a, b, algorithm: str,
                    *, rows_divisible: bool) -> str:
    """The first rule (a, b) break on this rank, or "" (the text says the fix)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() != 2:
            return f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape it to a matrix"
        if t.dtype not in DTYPES:
            return (f"{name} has dtype {dtype_name(t.dtype)}; supported: bfloat16, float16 "
                    f"(pass {name}.bfloat16())")
        if comm.backend == "cuda" and t.device != comm.device:
            return (f"{name} is on {t.device} but this rank's device is {comm.device}; "
                    f"pass {name}.to(comm.device)")
        if comm.backend == "cpu" and t.device.type != "cpu":
            return f"{name} is on {t.device} but the backend is 'cpu'; pass {name}.cpu()"
    if a.dtype != b.dtype:
        return (f"a is {dtype_name(a.dtype)} but b is {dtype_name(b.dtype)}; "
                f"pass both in one dtype")
    if a.shape[1] != b.shape[0]:
        return (f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a.shape[1] must equal "
                f"b.shape[0] (the K dimension)")
    if min(a.shape[0], a.shape[1], b.shape[1]) == 0:
        return f"empty matrix (a {tuple(a.shape)}, b {tuple(b.shape)}); pass non-empty shapes"
    if rows_divisible and a.shape[0] % comm.world_size:
        return (f"a has {a.shape[0]} rows, not divisible by the world size "
                f"({comm.world_size}); pad M to a multiple of {comm.world_size}")
    if algorithm not in ALGORITHMS:
        return f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {algorithm!r}"
    return ""


def agree_args(op: str, comm: Communicator, a, b, algorithm: str, *,
               rows_divisible: bool) -> None:
    """Check (a, b, algorithm) on this rank and agree on them with every rank: the same
    clear error everywhere, before anything launches, when any rank's arguments break a
    rule."""
    err = check_gemm_args(op, comm, a, b, algorithm, rows_divisible=rows_divisible)
    fields = {}
    if not err:
        fields = {"a": tuple(a.shape), "b": tuple(b.shape), "dtype": str(a.dtype)}
    agree(op, None, err, algorithm=algorithm, **fields)
