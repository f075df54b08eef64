"""Compile (variant, target) jobs in this process and print one JSON line per job.

    python -m tests.compile_targets.worker CACHE_DIR VARIANT@TARGET ...

Sets ``TRITON_INTERPRET=0`` and ``COMMLAB_BACKEND=cuda`` before commlab is imported, so the
kernels are defined in compiled mode. Figures are cached in CACHE_DIR by the hash Triton
gives the source (the kernel and every jit function it calls, its constexprs, argument
types and attributes), the target and the options: a rerun compiles only what changed.
Triton's own cache lives in CACHE_DIR/triton.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

FIGURES = 3  # bump when what is read from a binary changes: cached figures are re-read


def _nvidia_figures(kernel) -> dict:
    import triton

    nvbin = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(nvbin / "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    # one line per function in the cubin: the kernel's figures are the largest
    regs = max(int(x) for x in re.findall(r"REG:(\d+)", usage))
    local = max(int(x) for x in re.findall(r"LOCAL:(\d+)", usage))
    # STACK: the ABI call frames of functions ptxas did not inline; like LOCAL (spills,
    # local arrays) it lives in local memory, per thread
    stack = max(int(x) for x in re.findall(r"STACK:(\d+)", usage))
    return {"registers": regs, "spill_bytes": local + stack, "shared_bytes": kernel.metadata.shared,
            "detail": {"local_bytes": local, "stack_bytes": stack}}


def _amd_figures(kernel) -> dict:
    text = kernel.asm["amdgcn"]

    def field(name: str) -> int:
        m = re.search(rf"^\s*-?\s*\.{name}:\s+(\d+)", text, re.M)
        return int(m.group(1)) if m else 0

    vgpr, agpr = field("vgpr_count"), field("agpr_count")
    return {"registers": vgpr + agpr, "spill_bytes": field("private_segment_fixed_size"),
            "shared_bytes": kernel.metadata.shared,
            "detail": {"vgpr": vgpr, "agpr": agpr, "sgpr": field("sgpr_count"),
                       "vgpr_spills": field("vgpr_spill_count"),
                       "sgpr_spills_to_vgpr_lanes": field("sgpr_spill_count"),
                       "scratch_bytes": field("private_segment_fixed_size")}}


class _Stderr:
    """Capture what the compilers print on file descriptor 2 (LLVM's assembler errors
    go there, not into the exception)."""

    def __enter__(self):
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile(mode="w+")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read()
        self.file.close()


def _error_text(e: BaseException, stderr: str) -> str:
    """The lines that say why (assembler/ptxas errors, Triton's compile error)."""
    text = (str(e).strip() or type(e).__name__) + "\n" + stderr
    lines = list(dict.fromkeys(ln.strip() for ln in text.splitlines() if ln.strip()))
    keep = [ln for ln in lines if re.search(r"error|Error|rejected|unsupported|mov\.", ln)]
    out = (keep or lines)[:8]
    return f"{type(e).__name__}: " + " | ".join(s.strip() for s in out)[:1500]


def main(argv: list[str]) -> int:
    cache = Path(argv[0])
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["COMMLAB_BACKEND"] = "cuda"
    os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9's default, without its warning
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tests.compile_targets.kernels import specs
    from tests.compile_targets.matrix import TARGETS

    by_target: dict[str, dict] = {}
    figures = cache / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    for job in argv[1:]:
        variant, target_name = job.rsplit("@", 1)
        if target_name not in by_target:
            by_target[target_name] = specs(target_name)
        spec, target = by_target[target_name][variant], TARGETS[target_name]
        src = ASTSource(fn=spec.fn, signature=spec.signature(), constexprs=spec.consts,
                        attrs=spec.attrs())
        opts = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
        key = (f"{src.hash()[:24]}-f{FIGURES}-{target_name}-w{spec.num_warps}"
               f"s{spec.num_stages}-{triton.__version__}")
        hit = figures / f"{key}.json"
        if hit.exists():
            rec = json.loads(hit.read_text())
            # two variants can be one compile on a target (no TMA: the same pointer path)
            rec.update(variant=variant, cached=True)
        else:
            t0 = time.perf_counter()
            rec = {"variant": variant, "target": target_name, "kernel": spec.fn.__name__,
                   "num_warps": spec.num_warps, "num_stages": spec.num_stages,
                   "constexprs": {k: v for k, v in spec.consts.items()}}
            err = None
            with _Stderr() as captured:
                try:
                    k = triton.compile(src, target=GPUTarget(target.backend, target.arch,
                                                             target.warp_size), options=opts)
                except Exception as e:  # the compile error is the result
                    err = e
            if err is None:
                rec.update(ok=True, error="",
                           **(_nvidia_figures(k) if target.backend == "cuda" else _amd_figures(k)))
                rec["fits"] = rec["shared_bytes"] <= target.shared_limit
            else:
                rec.update(ok=False, fits=False, error=_error_text(err, captured.text))
                if os.environ.get("COMPILE_TARGETS_TRACEBACK"):
                    traceback.print_exception(err, file=sys.stderr)
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            rec["shared_limit"] = target.shared_limit
            hit.write_text(json.dumps(rec))
            rec["cached"] = False
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
