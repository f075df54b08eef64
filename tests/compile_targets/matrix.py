"""The compile matrix as plain data: importable without Triton deciding anything.

Targets are what ``triton.backends.compiler.GPUTarget`` takes; ``shared_limit`` is the most
shared memory (LDS) one block may use there, from the vendors' documents: CUDA C
Programming Guide, "Technical Specifications per Compute Capability" (8.0: 163 KiB, 9.0
and 10.0: 227 KiB per block, opt-in); AMD's GPU specifications table in the ROCm docs
(MI300X / CDNA3: 64 KiB LDS, MI355X / CDNA4: 160 KiB). A kernel that compiles but needs
more fails at launch (Triton's OutOfResources), so the check asks for both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    backend: str  # GPUTarget backend: "cuda" | "hip"
    arch: int | str  # compute capability or gfx name
    warp_size: int
    gpus: str  # the products this stands for
    shared_limit: int  # bytes of shared memory / LDS per block


TARGETS = {t.name: t for t in (
    Target("sm_80", "cuda", 80, 32, "NVIDIA A100", 163 * 1024),
    Target("sm_90", "cuda", 90, 32, "NVIDIA H100/H200", 227 * 1024),
    Target("sm_100", "cuda", 100, 32, "NVIDIA B200", 227 * 1024),
    Target("gfx942", "hip", "gfx942", 64, "AMD MI300X", 64 * 1024),
    Target("gfx950", "hip", "gfx950", 64, "AMD MI355X", 160 * 1024),
)}

# Every kernel variant the check compiles (kernels.py builds each one by this name).
# "[small]"/"[big]": collectives._common.launch_for below and above _common._GPU_BIG
# elements (2048-element blocks; 8192-element blocks with rounds_for's pipeline depth).
VARIANTS = (
    "language_primitives",
    "barrier_kernel",
    "one_shot_all_reduce[small]", "one_shot_all_reduce[big]",
    "one_shot_all_reduce[small,fp32,max]", "one_shot_all_reduce[small,int32]",
    "two_shot_all_reduce[small]", "two_shot_all_reduce[big]",
    "ring_all_reduce[small]", "ring_all_reduce[big]",
    "all_gather[small]", "all_gather[big]",
    "reduce_scatter[small]", "reduce_scatter[big]",
    "broadcast[small]", "broadcast[big]",
    "all_to_all[small]", "all_to_all[big]",
    "ce_begin", "ce_copy_out[small]", "ce_copy_out[big]", "ce_end_barrier",
    "linkbench_peer_copy",
    "gemm[tma]", "gemm[pointers]",
    "ag_gemm[tma]", "ag_gemm[tma,trace]",
    "gemm_rs[own,tma partials]", "gemm_rs[own,loaded partials]", "gemm_rs[peer chunk]",
    "gemm_rs[own,tma partials,trace]",
)

# The GEMM variants each take 10-50 s per target to compile cold (the rest 1-7 s): the
# default test run compiles each GEMM kernel once per target, in the variant that holds
# the most code (the traced ones carry the untraced body too); these are marked slow
# (scripts/test.sh leaves them out; ``python -m tests.compile_targets`` compiles them).
SLOW_VARIANTS = (
    "gemm[pointers]", "ag_gemm[tma]", "gemm_rs[own,tma partials]",
    "gemm_rs[own,loaded partials]", "gemm_rs[peer chunk]",
)

# Kernels that never run on a GPU, so they are not compiled for one.
NOT_GPU = {
    "ag_push_kernel": "CPU producer of ag_gemm: on GPUs the copy engines push "
                      "(overlap/ag_gemm.py _push_cuda)",
}

# (variant, target) -> why it does not compile today (xfail, strict: fixing it flips it).
# Empty: the traced GEMMs once failed on AMD (inline PTX); _tiles.stamp's clock is now
# chosen per target.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def pairs(variants=VARIANTS) -> list[tuple[str, str]]:
    return [(v, t) for v in VARIANTS if v in variants for t in TARGETS]
