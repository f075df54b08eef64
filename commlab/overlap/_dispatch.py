"""When the fused kernels run: the measured rule behind ``algorithm="auto"``.

Overlap hides the communication behind the GEMM, but the fused kernel pays for it with a
Triton GEMM instead of cuBLAS and with tiles that wait. It pays when the hidden
communication is worth more than that: at large M. The thresholds below come from
``bench/gpu_overlap.py`` on 2xH200 (bf16, Llama-3 8B/70B tensor-parallel MLP shapes,
W=2): the smallest M at which the fused kernel was faster than NCCL + torch.matmul.

Measured 2026-11-30, 2xH200, torch 2.11 / triton 3.6, device time (calls queued), us:

    op       model      M    sequential  fused   torch fused   comm only
    ag_gemm  8B       512       122.8    250.0      115.6         29.7
    ag_gemm  8B      2048       369.9    324.1      366.8         57.0
    ag_gemm  8B      8192      1407.1   1314.4     1303.8        161.1
    ag_gemm  70B    16384     11871.0  11436.5    11709.2        581.2
    gemm_rs  8B       512        73.4    281.1       79.0         26.7
    gemm_rs  8B      2048       208.8    180.4      186.6         53.2
    gemm_rs  70B     8192      2843.0   2617.5     2682.6        315.7

At M=512 there are too few tiles to fill 132 SMs (gemm_rs 8B: 64 tiles, K=7168, no
split-K), so the fused kernels lose 2-4x there; from M=2048 they win by 4-14%.

The CPU backend always runs the fused kernels: it exists to show how they work.
"""

from __future__ import annotations

from commlab.runtime.communicator import Communicator

# op -> smallest M (total rows) at which "fused" beat "sequential" on 2xH200
MIN_FUSED_M = {"ag_gemm": 2048, "gemm_rs": 2048}


def choose(op: str, comm: Communicator, m: int, n: int, k: int) -> str:
    """"fused" or "sequential" for this shape; identical on every rank (the shape
    was agreed on first)."""
    if comm.backend == "cpu":
        return "fused"
    return "fused" if m >= MIN_FUSED_M[op] else "sequential"
