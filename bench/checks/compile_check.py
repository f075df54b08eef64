"""Compile the overlapped kernels for Hopper (sm_90) without a GPU and print their
registers, spills and shared memory: a cheap check, before any device time, that a
change to the tile loop did not push the 128x256 accumulator into local memory.

    TRITON_INTERPRET=0 python bench/checks/compile_check.py [IR_DIR]   # needs triton's ptxas

With IR_DIR, each kernel's TTGIR goes there too (is the K loop pipelined: async TMA
copies and ``isAsync`` warp-group dots inside it?).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before commlab decides on the interpreter

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from commlab.overlap import (  # noqa: E402
    GPU_TILE,
    MAX_PIECES,
    ag_gemm_kernel,
    gemm_kernel,
    gemm_rs_kernel,
)

T = GPU_TILE
DESC = {"a": f"tensordesc<bf16[{T.BM},{T.BK}]>", "b": f"tensordesc<bf16[{T.BK},{T.BN}]>",
        "out": f"tensordesc<bf16[{T.BM},{T.BN}]>",
        "inbox": f"tensordesc<bf16[1,{T.BM},{T.BN}]>"}
COMMON = dict(BM=T.BM, BN=T.BN, BK=T.BK, GROUP_M=T.GROUP_M, EVEN_K=True, USE_TMA=True,
              B_TRANS=False, OUT_TMA=True)


def signature(fn, consts, types):
    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in consts else types.get(name, "i32")
    return sig


KERNELS = {
    "gemm": (gemm_kernel, COMMON, {"a_src": DESC["a"], "b_src": DESC["b"], "out": DESC["out"],
                                   "ws_ptr": "*fp32", "cnt_ptr": "*i32"}),
    "ag_gemm": (ag_gemm_kernel, dict(COMMON, TRACE=False),
                {"a_src": DESC["a"], "b_src": DESC["b"], "out": DESC["out"],
                 "gathered_src": DESC["a"], "ws_ptr": "*fp32", "cnt_ptr": "*i32",
                 "flags_ptr": "*i32", "ctx": "*i64", "trace_ptr": "*i64"}),
    **{f"gemm_rs (own{label})": (
        gemm_rs_kernel, dict(COMMON, TRACE=False, OWN=True, MAXP=MAX_PIECES, IN_TMA=in_tma),
        {"a_src": DESC["a"], "b_src": DESC["b"], "out": DESC["out"],
         "inbox": DESC["inbox"] if in_tma else "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
         "flags_ptr": "*i32", "ctx": "*i64", "trace_ptr": "*i64"})
       for label, in_tma in ((", tma partials", True), (", loaded partials", False))},
}


def main() -> int:
    nvbin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    bad = 0
    for name, (fn, consts, types) in KERNELS.items():
        src = ASTSource(fn=fn, signature=signature(fn, consts, types),
                        constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=T.num_warps, num_stages=T.num_stages))
        if len(sys.argv) > 1:
            os.makedirs(sys.argv[1], exist_ok=True)
            with open(os.path.join(sys.argv[1], f"{fn.__name__}.ttgir"), "w") as f:
                f.write(k.asm["ttgir"])
        path = f"/tmp/commlab-{fn.__name__}.cubin"
        with open(path, "wb") as f:
            f.write(k.asm["cubin"])
        usage = subprocess.run([os.path.join(nvbin, "cuobjdump"), "-res-usage", path],
                               capture_output=True, text=True).stdout
        regs = int(re.search(r"REG:(\d+)", usage).group(1))
        local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
        bad += local > 0
        asyncs = k.asm["ttgir"].count("isAsync = true")
        print(f"{name:26s} regs {regs:3d}  spill (local) {local:5d} B  "
              f"shared {k.metadata.shared:6d} B  async dots {asyncs}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
