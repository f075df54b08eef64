"""What every collective shares: argument rules, cross-rank agreement, staging, launch
shapes, and the small device helpers (fp32 accumulation, the reduction op)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import commlab.language as cl
from commlab import _config
from commlab.collectives._measure import measured as _measured
from commlab.runtime._control import Signature
from commlab.runtime.communicator import Communicator, get_communicator
from commlab.runtime.heap import MAX_BARRIER_BLOCKS

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
OPS = {"sum": 0, "max": 1, "min": 2}
MAX_PROGRAMS = MAX_BARRIER_BLOCKS  # signal-pad rows and epoch slots: one per program


def dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


@dataclass
class Call:
    """A validated collective call, identical on every rank once ``agree`` returned."""

    comm: Communicator
    op_name: str
    x: torch.Tensor
    seq: int
    sig: Signature | None = None


def _choices(options) -> str:
    return ", ".join(map(repr, options))


def check_local(comm: Communicator, x, algorithm, algorithms: tuple[str, ...],
                params: dict, shape_rule=None) -> str:
    """Return the first rule this rank's call breaks, or "" (the text states the fix).

    ``params``: "op" (a reduction) and "src" (a rank) are checked whatever their value,
    so ``op=None`` is refused here, on every rank, like any other bad value."""
    if not isinstance(x, torch.Tensor):
        return f"expected a torch.Tensor, got {type(x).__name__}; pass a tensor"
    if x.dtype not in DTYPES:
        return (f"dtype {dtype_name(x.dtype)} is not supported; use one of "
                f"{', '.join(dtype_name(d) for d in DTYPES)} (e.g. x.float())")
    if comm.backend == "cuda" and x.device != comm.device:
        return f"tensor is on {x.device} but this rank's device is {comm.device}; pass x.to(comm.device)"
    if comm.backend == "cpu" and x.device.type != "cpu":
        return f"tensor is on {x.device} but the backend is 'cpu'; pass x.cpu()"
    if "op" in params and not (isinstance(params["op"], str) and params["op"] in OPS):
        return f"op must be one of {_choices(OPS)}, got {params['op']!r}"
    if not (isinstance(algorithm, str) and algorithm in algorithms):
        return f"algorithm must be one of {_choices(algorithms)}, got {algorithm!r}"
    src = params.get("src", 0)
    if not (isinstance(src, int) and not isinstance(src, bool) and 0 <= src < comm.world_size):
        return f"src must be a rank in 0..{comm.world_size - 1}, got {src!r}"
    if shape_rule is not None:
        return shape_rule(x, comm.world_size)
    return ""


def needs_dim(x: torch.Tensor, world: int) -> str:
    """Shape rule: at least one dimension (the output concatenates along dim 0)."""
    if x.dim() == 0:
        return "needs a tensor with at least one dimension, got a 0-d tensor; pass x.reshape(1)"
    return ""


def split_dim0(x: torch.Tensor, world: int) -> str:
    """Shape rule: dim 0 splits into ``world`` equal chunks."""
    if x.dim() == 0:
        return "needs a tensor with at least one dimension, got a 0-d tensor; pass x.reshape(1)"
    if x.shape[0] % world:
        return (f"dim 0 ({x.shape[0]}) must be divisible by the world size "
                f"({world}); pad dim 0 to a multiple of {world}")
    return ""


def agree(op_name: str, x, local_error: str, **fields) -> Call:
    """Check this call against every rank's; raise the same clear error everywhere."""
    comm = get_communicator()
    sig_fields = dict(fields)
    if isinstance(x, torch.Tensor):
        sig_fields = {"shape": tuple(x.shape), "dtype": dtype_name(x.dtype), **sig_fields}
    sig = Signature(op_name, sig_fields, local_error)
    seq = comm.control.agree(sig)
    return Call(comm, op_name, x, seq, sig)


def comm_or_raise() -> Communicator:
    return get_communicator()


_NO_TRACE = contextlib.nullcontext()


def traced(op: str, nbytes: int, algorithm: str, device, x=None, comm=None):
    """Around a call's launches: its call records noted (``_measure``), a "comm" span
    while a trace is recording, the ``commlab:<op>`` event under torch.profiler; a shared
    no-op when none of them is on."""
    m = _measured(comm, op, nbytes, algorithm, device, x)
    return _NO_TRACE if m is None else m


# --- launch shapes ----------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    programs: int
    block: int
    num_warps: int


def launch_for(comm: Communicator, n: int) -> Launch:
    """How many programs and how many elements each moves per step.

    CPU (interpreter): one program with blocks of up to 1M elements, since every op is
    one numpy call plus a fixed Python overhead (4-rank 1M fp32 all-reduce: two-shot
    828 ms with 64K blocks, 415 ms with 1M blocks, gloo 21-24 ms, on 2 cores).
    CUDA: enough programs to keep the copy engines of NVLink busy, capped by the
    signal pad's rows.
    """
    cap = MAX_PROGRAMS
    if comm.backend == "cpu":
        block = 1 << 20  # the interpreter's cost is per op: few, wide ops (4 MiB fp32)
        return Launch(1, min(block, max(16, triton.next_power_of_2(max(n, 1)))), 4)
    # Small messages: 2048-element blocks over few programs keep the latency down. From
    # 1M elements on, 8192-element blocks on 256 programs keep the most bytes in flight
    # over NVLink (bench/probes/gpu_sweep.py on 2xH200: two-shot bf16 1 GiB 3149 us = 341 GB/s
    # busbw, against 3253-3583 us with smaller shapes), with 8 warps: a kernel that only
    # pushes, both ranks at once, moved 350 GB/s per direction with 8 warps and 338 with
    # 16 (bench/probes/gpu_link_ceiling.py, bench/results/link-ceiling-2xh200.txt).
    if n >= _GPU_BIG:
        block, warps, programs = _GPU_BLOCK_BIG, _GPU_WARPS_BIG, _GPU_PROGRAMS
    else:
        block, warps, programs = _GPU_BLOCK, _GPU_WARPS, _GPU_PROGRAMS
    blocks = max(1, math.ceil(n / block))
    return Launch(min(cap, blocks, programs), block, warps)


# GPU launch shapes (a sweep patches these names; bench/probes/gpu_sweep.py)
_GPU_BIG = 1 << 20
_GPU_BLOCK = 2048
_GPU_WARPS = 8
_GPU_BLOCK_BIG = 8192
_GPU_WARPS_BIG = 8
_GPU_PROGRAMS = 256


def rounds_for(comm: Communicator, n: int, cfg: Launch) -> int:
    """Pipeline depth for the push kernels: one slice per ~4 blocks of each program,
    at most 8 (``COMMLAB_ROUNDS`` forces a depth: tests exercise the pipeline on CPU)."""
    forced = _config.get("COMMLAB_ROUNDS")
    if forced:
        return forced
    if comm.backend != "cuda":
        return 1
    return max(1, min(8, n // (cfg.block * cfg.programs) // 4))


def slot_elems(comm: Communicator, elem_size: int, slots: int) -> int:
    """Elements per slot when the scratch is cut into ``slots`` equal slots, a multiple of
    64 so every slot starts 16-byte aligned (what the kernels' vector accesses need)."""
    return comm.scratch_bytes // (slots * elem_size) // 64 * 64


# --- device helpers ---------------------------------------------------------------


@triton.jit
def combine(a, b, OP: tl.constexpr):
    """a (op) b for the reduction ``OP``: 0 sum, 1 max, 2 min."""
    if OP == 0:
        return a + b
    elif OP == 1:
        return tl.maximum(a, b)
    else:
        return tl.minimum(a, b)


@triton.jit
def load_acc(ptr, mask):
    """Load for accumulation: floats widen to fp32 (the interpreter also gets bf16
    arithmetic wrong), int32 stays int32."""
    v = tl.load(ptr, mask=mask, other=0)
    if v.dtype.is_floating():
        v = v.to(tl.float32)
    return v


@triton.jit
def peer_ptr(ptr, peer, ctx):
    """``cl.symm_at`` for a scalar base pointer, with the alignment hint the compiler
    needs to keep 16-byte loads (heap blocks and inbox slots are 16-byte aligned)."""
    return tl.multiple_of(cl.symm_at(ptr, peer, ctx), 16)
