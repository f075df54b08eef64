"""Communication overlapped with compute, inside Triton kernels.

    out = commlab.ag_gemm(a_shard, w)     # all_gather(a_shard) @ w
    out = commlab.gemm_rs(a, w_shard)     # reduce_scatter(a @ w_shard)

GEMM tiles wait on per-chunk (ag_gemm) or per-piece (gemm_rs) signals, so the GEMM
starts on what is already here and the transfers (copy engines on GPU) run underneath
it. With a trace recording, every tile's roles (wait, copy, compute, reduce) become
spans on lanes "sm N" (GPU) or "program N" (CPU) for ``commlab.widgets.show_timeline``.

For benchmarks and notebooks: ``matmul`` (the fused kernels' GEMM without the
communication), ``schedule`` with ``TileConfig``/``GPU_TILE``/``CPU_TILE`` (how a
persistent launch covers its tiles), ``launch_options`` (run under another tile
configuration, without the split tail, or on CPU as a GPU with n SMs), and the kernels
themselves for compiling them ahead (``bench/gpu_checks/compile_check.py``).
"""

from commlab.overlap import _hier  # noqa: F401 (registers the paths across hosts)
from commlab.overlap._gemm import gemm_kernel, matmul
from commlab.overlap._launch import (
    CPU_TILE,
    GPU_TILE,
    Schedule,
    TileConfig,
    launch_options,
    schedule,
)
from commlab.overlap.ag_gemm import ag_gemm, ag_gemm_kernel
from commlab.overlap.gemm_rs import MAX_PIECES, gemm_rs, gemm_rs_kernel

__all__ = [
    "ag_gemm", "gemm_rs",
    # for benchmarks and notebooks
    "CPU_TILE", "GPU_TILE", "MAX_PIECES", "Schedule", "TileConfig", "ag_gemm_kernel",
    "gemm_kernel", "gemm_rs_kernel", "launch_options", "matmul", "schedule",
]
