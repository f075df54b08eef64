"""When the fused kernels run: the measured rule behind ``algorithm="auto"``.

Overlap hides the communication behind the GEMM, but the fused kernel pays for it with a
Triton GEMM instead of cuBLAS and with tiles that wait. It pays when the hidden
communication is worth more than that: at large M. The thresholds below come from
``bench/gpu_overlap.py`` on 2xH200 (bf16, Llama-3 8B/70B tensor-parallel MLP shapes,
W=2): the smallest M at which the fused kernel was faster than NCCL + torch.matmul.

Measured 2026-11-30, 2xH200, torch 2.11 / triton 3.6, device time (calls queued), µs
(bench/results/overlap-2xh200-w2.json, commit 02166d0):

    op       model      M    sequential  fused   torch fused   comm only
    ag_gemm  8B       512       121.6    272.2      115.6         29.7
    ag_gemm  8B      2048       365.5    317.8      362.6         57.1
    ag_gemm  8B      8192      1384.4   1281.0     1278.4        159.2
    ag_gemm  70B    16384     11926.7  11442.1    11394.9        563.1
    gemm_rs  8B       512        83.2    224.1       78.2         26.8
    gemm_rs  8B      2048       207.6    209.1      186.5         54.1
    gemm_rs  70B     8192      2800.8   2688.4     2626.9        312.1

At M=512 there are too few tiles to fill 132 SMs (gemm_rs 8B: 64 tiles, K=7168, no
split-K), so the fused kernels lose up to 2.7x there. From M=2048 ag_gemm wins by 4-13%;
gemm_rs is between 0.7% slower and 4% faster than sequential (within the 3% that auto
may cost), so the rule keeps it at the same threshold.

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
    import torch

    if torch.cuda.is_current_stream_capturing():
        return "sequential"  # the fused kernels number calls on the host: not replayable
    return "fused" if m >= MIN_FUSED_M[op] else "sequential"
