"""Communication overlapped with compute, inside Triton kernels.

    out = commlab.ag_gemm(a_shard, w)     # all_gather(a_shard) @ w
    out = commlab.gemm_rs(a, w_shard)     # reduce_scatter(a @ w_shard)

GEMM tiles wait on per-chunk (ag_gemm) or per-piece (gemm_rs) signals, so the GEMM
starts on what is already here and the transfers (copy engines on GPU) run underneath
it. With a trace
recording, every tile's roles (wait, copy, compute, reduce) become spans on lanes
"sm N" (GPU) or "program N" (CPU) for ``commlab.widgets.show_timeline``.
"""

from commlab.overlap.ag_gemm import ag_gemm
from commlab.overlap.gemm_rs import gemm_rs

__all__ = ["ag_gemm", "gemm_rs"]
