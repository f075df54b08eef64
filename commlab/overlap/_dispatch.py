"""When the fused kernels run: the measured rule behind ``algorithm="auto"``.

Overlap hides the communication behind the GEMM, but the fused kernel pays for it with a
Triton GEMM instead of cuBLAS and with tiles that wait. It pays when the hidden
communication is worth more than that. The thresholds below come from
``bench/gpu_overlap.py`` on 2xH200 (bf16, Llama-3 8B/70B tensor-parallel MLP shapes,
W=2): the smallest measured M from which the fused kernel beat the sequential path at
every measured shape.

Measured 2026-11-30, 2xH200, torch 2.11 / triton 3.6, device time (calls queued), µs,
median of 5 interleaved rounds (bench/results/overlap-2xh200-w2.json, commit 4f4708a,
with the partial last wave split along K). "NCCL seq" = NCCL collective + torch.matmul,
"cl seq" = commlab's collective + torch.matmul (what auto runs below the threshold),
"triton" = the fused kernels' GEMM alone:

    op       model      M  NCCL seq   cl seq    fused    torch   comm   cuBLAS   triton
    ag_gemm  8B       512     122.2    106.5     97.8    115.7   29.8     89.4     91.2
    ag_gemm  8B      2048     366.5    344.8    317.0    362.5   56.9    311.8    311.3
    ag_gemm  8B      8192    1392.7   1353.2   1254.5   1280.4  161.0   1210.6   1229.3
    ag_gemm  70B      512     374.0    357.1    356.6    384.3   39.0    335.2    320.0
    ag_gemm  70B     2048    1324.3   1293.4   1240.5   1283.3   93.9   1204.8   1213.6
    gemm_rs  8B       512      70.0     57.2     82.9     79.3   26.0     42.5     53.6
    gemm_rs  8B      2048     207.9    190.1    160.5    186.1   53.2    153.6    152.7
    gemm_rs  8B      8192     774.3    735.1    638.1    696.4  167.9    598.2    610.3
    gemm_rs  70B      512     189.8    176.0    196.5    198.6   34.9    155.8    153.5
    gemm_rs  70B     2048     701.9    672.1    618.0    662.9   95.6    596.8    596.8

ag_gemm: fused is the fastest at every measured M (512 to 16384): at M=512 8% faster
than cl seq for 8B and level with it for 70B (356.6 against 357.1; in the run before
the split tail, fused lost there: 378.4 against 359.0, bench/results/history/
overlap-2xh200-w2-0c51d21.json). gemm_rs: from M=2048 fused is the fastest of all
(8-16% faster than cl seq); at M=512 a row chunk has 32 tiles per launch for 132 SMs,
and even split four ways along K (its GEMM alone: 53.6 µs, cuBLAS 42.5) the two launches
and the waits cost more than the 26.0 µs they hide, so auto runs "cl seq" there: 7-18%
faster than NCCL + matmul and 11-28% faster than PyTorch's fused op.

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
