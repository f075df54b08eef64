"""When the fused kernels run: the measured rule behind ``algorithm="auto"``.

Overlap hides the communication behind the GEMM, but the fused kernel pays for it with a
Triton GEMM instead of cuBLAS and with tiles that wait. It pays when the hidden
communication is worth more than that. ``MIN_FUSED_M`` holds, per op, the smallest
measured M from which the fused kernel beat the sequential path at every measured shape
(2xH200, bf16, Llama-3 8B/70B tensor-parallel MLP shapes, W=2, ``python -m
commlab.bench.overlap``, bench/results/overlap-2xh200-w2.json; the table is in README.md's
results):

- ag_gemm: fused is the fastest at every measured M, 512 to 16384.
- gemm_rs: fused from M=2048. At M=512 a row chunk has 32 tiles per launch for 132 SMs,
  and even split along K the two launches and the waits cost more than the 26.0 µs of
  reduce-scatter they hide (8B: fused 82.9 µs against 57.2 for commlab's reduce-scatter
  after torch.matmul), so auto runs the sequential path there.

The CPU backend always runs the fused kernels (it exists to show how they work).
Inside a CUDA-graph capture auto runs the sequential path: the fused kernels number
their calls on the host, which a replay would freeze.
"""

from __future__ import annotations

import torch

from commlab import trace
from commlab.overlap._args import refuse_capture
from commlab.runtime import Communicator

# op -> smallest measured M (total rows) from which "fused" beat "sequential" on 2xH200
MIN_FUSED_M = {"ag_gemm": 512, "gemm_rs": 2048}


def choose(op: str, comm: Communicator, m: int, n: int, k: int) -> str:
    """"fused" or "sequential" for this shape; identical on every rank (the shape
    was agreed on first)."""
    if comm.backend == "cpu":
        return "fused"
    if torch.cuda.is_current_stream_capturing():
        return "sequential"  # the fused kernels number calls on the host: not replayable
    return "fused" if m >= MIN_FUSED_M[op] else "sequential"


def run(op: str, comm: Communicator, a: torch.Tensor, b: torch.Tensor, algorithm: str, *,
        m: int, nbytes: int, sequential, fused) -> torch.Tensor:
    """The public ops' common path once their arguments are agreed: pick the algorithm,
    run ``sequential(comm, a, b)`` or ``fused(comm, a, b)`` (inside a trace span of
    ``nbytes`` communicated, its tile spans decoded after it)."""
    algo = choose(op, comm, m, b.shape[1], a.shape[1]) if algorithm == "auto" else algorithm
    if algo == "sequential":  # (its collective records its own span)
        return sequential(comm, a, b)
    if algorithm == "fused":  # (auto chose fused only outside a capture)
        refuse_capture(op, comm)
    with trace.collective(op, nbytes, algo, comm.device):
        out, decode = fused(comm, a.contiguous(), b)
    if decode is not None:
        decode()
    return out
