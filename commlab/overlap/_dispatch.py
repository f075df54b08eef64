"""When the fused kernels run: the measured rule behind ``algorithm="auto"``.

Overlap hides the communication behind the GEMM, but the fused kernel pays for it with a
Triton GEMM instead of cuBLAS and with tiles that wait. It pays when the hidden
communication is worth more than that: at large M. The thresholds below come from
``bench/gpu_overlap.py`` on 2xH200 (bf16, Llama-3 8B/70B tensor-parallel MLP shapes,
W=2): the smallest M from which the fused kernel beat the sequential path at every
measured shape.

Measured 2026-11-30, 2xH200, torch 2.11 / triton 3.6, device time (calls queued), µs,
median of 3 interleaved rounds (bench/results/overlap-2xh200-w2.json, commit 0c51d21).
"NCCL seq" = NCCL collective + torch.matmul, "cl seq" = commlab's collective + torch.matmul
(what auto runs below the threshold), "triton" = the fused kernels' GEMM alone:

    op       model      M  NCCL seq   cl seq    fused    torch   comm   cuBLAS   triton
    ag_gemm  8B       512     122.5    106.3     97.4    115.9   29.7     89.3     91.4
    ag_gemm  8B      2048     367.7    347.0    319.7    365.5   57.0    314.2    314.3
    ag_gemm  8B      8192    1398.0   1358.1   1277.4   1287.5  161.7   1219.8   1254.0
    ag_gemm  70B      512     375.3    359.0    378.4    386.6   39.2    337.8    348.4
    ag_gemm  70B     2048    1329.2   1299.3   1244.8   1289.6   94.8   1213.4   1216.8
    gemm_rs  8B       512      70.1     58.0    146.7     79.2   26.5     43.1     73.3
    gemm_rs  8B      2048     207.4    190.3    162.0    186.6   53.6    154.5    154.1
    gemm_rs  8B      8192     777.1    738.0    643.9    697.7  168.6    602.8    614.4
    gemm_rs  70B      512     190.4    177.3    278.8    197.2   35.1    157.1    154.9
    gemm_rs  70B     2048     704.9    677.1    621.8    665.6   96.8    600.6    599.6

From M=2048 (M up to 16384 in the records) the fused kernels are the fastest of all at
every measured shape: 3-22% faster than NCCL + matmul, 4-15% faster than cl seq, 0.8-13%
faster than PyTorch's fused ops. At M=512 a chunk has too few tiles for 132 SMs
(gemm_rs 8B: 32 per launch, K=7168, no split-K: its Triton GEMM alone takes 73 µs
where cuBLAS takes 43), so the fused kernels lose up to 2.5x against cl seq, except
ag_gemm 8B, where fused wins by 8%; auto keeps one threshold per op
rather than a rule fitted to one shape. Below it, auto runs "cl seq": 4-17% faster
than NCCL + matmul and 7-27% faster than PyTorch's fused ops at M=512.

The CPU backend always runs the fused kernels (it exists to show how they work).
Inside a CUDA-graph capture auto runs the sequential path: the fused kernels number
their calls on the host, which a replay would freeze.
"""

from __future__ import annotations

import torch

from commlab.runtime.communicator import Communicator

# op -> smallest M (total rows) at which "fused" beat "sequential" on 2xH200
MIN_FUSED_M = {"ag_gemm": 2048, "gemm_rs": 2048}


def choose(op: str, comm: Communicator, m: int, n: int, k: int) -> str:
    """"fused" or "sequential" for this shape; identical on every rank (the shape
    was agreed on first)."""
    if comm.backend == "cpu":
        return "fused"
    if torch.cuda.is_current_stream_capturing():
        return "sequential"  # the fused kernels number calls on the host: not replayable
    return "fused" if m >= MIN_FUSED_M[op] else "sequential"
