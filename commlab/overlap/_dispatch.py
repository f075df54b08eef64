"""When the fused kernels run: the measured rule behind ``algorithm="auto"``.

Overlap hides the communication behind the GEMM, but the fused kernel pays for it with a
Triton GEMM instead of cuBLAS and with tiles that wait. It pays when the hidden
communication is worth more than that. The thresholds below come from
``bench/gpu_overlap.py`` on 2xH200 (bf16, Llama-3 8B/70B tensor-parallel MLP shapes,
W=2): the smallest measured M from which the fused kernel beat the sequential path at
every measured shape.

Measured 2026-11-30, 2xH200, torch 2.11 / triton 3.6, device time (calls queued), µs,
median of 5 interleaved rounds (bench/results/overlap-2xh200-w2.json, commit 86348d5,
with the partial last wave split along K). "NCCL seq" = NCCL collective + torch.matmul,
"cl seq" = commlab's collective + torch.matmul (what auto runs below the threshold),
"triton" = the fused kernels' GEMM alone:

    op       model      M  NCCL seq   cl seq    fused    torch   comm   cuBLAS   triton
    ag_gemm  8B       512     122.0    106.2     97.4    114.8   29.8     88.9     91.1
    ag_gemm  8B      2048     365.3    344.0    316.4    361.6   57.1    310.9    310.9
    ag_gemm  8B      8192    1392.1   1350.3   1251.9   1278.5  162.6   1209.5   1224.9
    ag_gemm  70B      512     370.9    353.3    349.1    377.3   39.5    331.5    318.5
    ag_gemm  70B     2048    1321.0   1288.6   1235.9   1273.6   95.9   1201.1   1211.4
    gemm_rs  8B       512      70.2     57.3     89.6     78.6   26.5     42.4     53.6
    gemm_rs  8B      2048     208.5    190.3    161.0    185.7   53.9    153.2    152.6
    gemm_rs  8B      8192     773.6    733.8    638.4    693.3  169.8    598.1    608.8
    gemm_rs  70B      512     188.9    175.9    197.1    195.3   35.2    155.1    152.7
    gemm_rs  70B     2048     699.3    670.9    618.0    661.0   97.0    594.6    596.5

ag_gemm: fused is the fastest at every measured M (512 to 16384): 1-8% faster than cl
seq at M=512 (70B by 1.2%, within the rounds' spread; in the previous run, before the
split tail, fused lost there: 378.4 against 359.0, bench/results/history/
overlap-2xh200-w2-0c51d21.json). gemm_rs: from M=2048 fused is the fastest of all
(6-15% faster than cl seq); at M=512 a row chunk has 32 tiles per launch for 132 SMs,
and even split four ways along K (its GEMM alone: 53.6 µs, cuBLAS 42.4) the two launches
and the waits cost more than the 26.5 µs they hide, so auto runs "cl seq" there: 7-18%
faster than NCCL + matmul and 10-27% faster than PyTorch's fused op.

The CPU backend always runs the fused kernels (it exists to show how they work).
Inside a CUDA-graph capture auto runs the sequential path: the fused kernels number
their calls on the host, which a replay would freeze.
"""

from __future__ import annotations

import torch

from commlab.runtime.communicator import Communicator

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
