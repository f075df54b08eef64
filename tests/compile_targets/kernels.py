"""Each variant of matrix.VARIANTS as (kernel, argument types, constexprs, options), at the
launch shapes commlab's host code uses: ``collectives._common.launch_for`` /
``rounds_for`` for the collectives, ``overlap._launch.tile_config`` (GPU_TILE) for the
GEMMs, ``linkbench._launch``'s block for the peer copy.

Import only with ``TRITON_INTERPRET=0`` and ``COMMLAB_BACKEND=cuda`` set (worker.py does):
the kernels must be defined in compiled mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import triton
import triton.language as tl

import commlab.language as cl
from commlab.collectives import _common as cc
from commlab.collectives._copy_engine import (
    MAX_CHUNKS,
    ce_begin_kernel,
    ce_copy_out_kernel,
    ce_end_barrier_kernel,
)
from commlab.collectives.all_gather import all_gather_kernel
from commlab.collectives.all_to_all import all_to_all_kernel
from commlab.collectives.barrier import barrier_kernel
from commlab.collectives.broadcast import broadcast_kernel
from commlab.collectives.one_shot_all_reduce import one_shot_all_reduce_kernel
from commlab.collectives.reduce_scatter import reduce_scatter_kernel
from commlab.collectives.ring_all_reduce import ring_all_reduce_kernel
from commlab.collectives.two_shot_all_reduce import two_shot_all_reduce_kernel
from commlab.overlap import _launch as oc
from commlab.overlap._gemm import gemm_kernel
from commlab.overlap.ag_gemm import ag_gemm_kernel
from commlab.overlap.gemm_rs import MAX_PIECES, gemm_rs_kernel
from commlab.topology.linkbench import peer_copy_kernel
from tests.compile_targets.matrix import TARGETS, VARIANTS, Target


@dataclass
class Spec:
    fn: object  # the JITFunction
    types: dict  # argument name -> Triton type ("*bf16", "i32", "tensordesc<...>")
    consts: dict = field(default_factory=dict)  # constexpr name -> value
    num_warps: int = 4
    num_stages: int = 3

    def signature(self) -> dict:
        sig = {}
        for name in self.fn.arg_names:
            if name in self.consts:
                sig[name] = "constexpr"
            elif name in self.types:
                sig[name] = self.types[name]
            else:
                raise KeyError(f"{self.fn.__name__}: no type for argument {name!r}")
        return sig

    def attrs(self) -> dict:
        """Pointers 16-byte aligned, as every launch passes them (heap blocks and torch
        allocations are; collectives._launch keys its cache on it)."""
        return {(i,): [["tt.divisibility", 16]]
                for i, name in enumerate(self.fn.arg_names)
                if self.types.get(name, "").startswith("*")}


@triton.jit
def language_primitives_kernel(x_ptr, flag_ptr, out_ptr, ctx, BLOCK: tl.constexpr):
    """Every primitive of commlab.language once (the collectives use them in
    combinations; this keeps each one in the matrix on its own)."""
    me = cl.rank(ctx)
    world = cl.num_ranks(ctx)
    peer = (me + 1) % world
    offs = tl.arange(0, BLOCK)
    v = tl.load(cl.symm_at(x_ptr, peer, ctx) + offs)  # scalar pointer, then offsets
    tl.store(cl.symm_at(x_ptr + offs, peer, ctx), v)  # a block of pointers
    cl.notify(flag_ptr, peer, ctx, 1, sig_op="set")
    cl.notify(flag_ptr + 1, peer, ctx, 1, sig_op="add")
    cl.wait(flag_ptr, 1)
    cl.wait(flag_ptr + 1, 1, ctx)  # with a wait record (GPU)
    cl.barrier(ctx)
    tl.store(cl.flags(ctx) + tl.program_id(0), me)
    tl.store(out_ptr + offs, v)


_GPU = SimpleNamespace(backend="cuda")  # what launch_for / rounds_for read
SMALL, BIG = 64 << 10, 64 << 20  # elements: below and above _common._GPU_BIG (1M)


def _shape(n: int) -> tuple[cc.Launch, int]:
    cfg = cc.launch_for(_GPU, n)
    return cfg, cc.rounds_for(_GPU, n, cfg)


def _collectives() -> dict[str, Spec]:
    out = {}
    for label, n in (("small", SMALL), ("big", BIG)):
        cfg, rounds = _shape(n)
        w = cfg.num_warps
        b = "*bf16"
        buf = {"x_ptr": b, "out_ptr": b, "scratch_ptr": b, "ctx": "*i64"}
        out[f"one_shot_all_reduce[{label}]"] = Spec(
            one_shot_all_reduce_kernel, {**buf, "N": "i32", "CAP": "i32"},
            {"OP": 0, "BLOCK": cfg.block}, w)
        out[f"two_shot_all_reduce[{label}]"] = Spec(
            two_shot_all_reduce_kernel, {**buf, "N": "i32", "CH": "i32"},
            {"OP": 0, "BLOCK": cfg.block, "ROUNDS": rounds}, w)
        out[f"ring_all_reduce[{label}]"] = Spec(
            ring_all_reduce_kernel, {**buf, "N": "i32", "CHUNK": "i32"},
            {"OP": 0, "BLOCK": cfg.block}, w)
        out[f"all_gather[{label}]"] = Spec(
            all_gather_kernel, {**buf, "N": "i32", "CAP": "i32", "N_TOTAL": "i32", "COL": "i32"},
            {"BLOCK": cfg.block, "ROUNDS": rounds}, w)
        cols = {"COLS": "i32", "CAP": "i32", "C": "i32", "COL": "i32"}
        out[f"reduce_scatter[{label}]"] = Spec(
            reduce_scatter_kernel, {**buf, **cols},
            {"OP": 0, "BLOCK": cfg.block, "ROUNDS": rounds}, w)
        out[f"all_to_all[{label}]"] = Spec(
            all_to_all_kernel, {**buf, **cols}, {"BLOCK": cfg.block, "ROUNDS": rounds}, w)
        out[f"broadcast[{label}]"] = Spec(
            broadcast_kernel, {**buf, "N": "i32", "CAP": "i32", "SRC": "i32"},
            {"BLOCK": cfg.block, "ROUNDS": rounds}, w)
        out[f"ce_copy_out[{label}]"] = Spec(
            ce_copy_out_kernel,
            {"own_ptr": b, "out_ptr": b, "inbox_ptr": b, "state_ptr": "*i32", "ctx": "*i64",
             **{k: "i32" for k in ("N", "CAP", "OUT_STRIDE", "CHUNK", "NCHUNK", "SRC")}},
            {"FLAGS": 1, "MAXC": MAX_CHUNKS, "BLOCK": cfg.block}, w)
    cfg, _ = _shape(SMALL)
    for label, t, op in (("fp32,max", "*fp32", 1), ("int32", "*i32", 0)):
        out[f"one_shot_all_reduce[small,{label}]"] = Spec(
            one_shot_all_reduce_kernel,
            {"x_ptr": t, "out_ptr": t, "scratch_ptr": t, "ctx": "*i64", "N": "i32", "CAP": "i32"},
            {"OP": op, "BLOCK": cfg.block}, cfg.num_warps)
    # the copy-engine protocol's one-program kernels and the barrier launch with 1 warp
    # (_copy_engine.exchange); barrier() itself launches barrier_kernel[(1,)] (4 warps)
    out["barrier_kernel"] = Spec(barrier_kernel, {"ctx": "*i64"}, {}, 4)
    out["ce_begin"] = Spec(ce_begin_kernel, {"state_ptr": "*i32"}, {}, 1)
    out["ce_end_barrier"] = Spec(ce_end_barrier_kernel, {"ctx": "*i64"}, {}, 1)
    out["linkbench_peer_copy"] = Spec(  # linkbench._launch on GPU: 4096-element blocks, 8 warps
        peer_copy_kernel, {"src_ptr": "*i32", "dst_ptr": "*i32", "ctx": "*i64", "peer": "i32",
                           "n": "i32"}, {"BLOCK": 4096}, 8)
    out["language_primitives"] = Spec(
        language_primitives_kernel, {"x_ptr": "*bf16", "flag_ptr": "*i32", "out_ptr": "*bf16",
                                     "ctx": "*i64"}, {"BLOCK": 1024}, 4)
    return out


def _gemms(target: Target) -> dict[str, Spec]:
    """As the host launches them on ``target`` (overlap._launch: the tile, TMA only where
    the target has it, else the same call on pointers; the trace clock)."""
    t = oc.tile_for_target(target.backend, target.arch)
    has_tma = oc.tma_for_target(target.backend, target.arch)
    clock = oc.trace_clock_for(target.backend, target.arch)
    desc = {"a": f"tensordesc<bf16[{t.BM},{t.BK}]>", "b": f"tensordesc<bf16[{t.BK},{t.BN}]>",
            "out": f"tensordesc<bf16[{t.BM},{t.BN}]>",
            "inbox": f"tensordesc<bf16[1,{t.BM},{t.BN}]>"}
    ints = {k: "i32" for k in ("M", "N", "K", "ROWS", "stride_bk", "stride_bn", "DP_TILES",
                               "SPLIT", "epoch", "chunk_idx", "PIECE_TILES", "TRACE_ROWS")}
    side = {"ws_ptr": "*fp32", "cnt_ptr": "*i32", "flags_ptr": "*i32", "ctx": "*i64",
            "trace_ptr": "*i64"}
    ptrs = {"a_src": "*bf16", "b_src": "*bf16", "out": "*bf16"}
    tma = {"a_src": desc["a"], "b_src": desc["b"], "out": desc["out"]} if has_tma else ptrs
    meta = dict(BM=t.BM, BN=t.BN, BK=t.BK, GROUP_M=t.GROUP_M, B_TRANS=False)
    fast = dict(meta, EVEN_K=True, USE_TMA=has_tma, OUT_TMA=has_tma)
    inbox = desc["inbox"] if has_tma else "*bf16"
    opts = dict(num_warps=t.num_warps, num_stages=t.num_stages)

    def spec(fn, types, consts):
        return Spec(fn, {**ints, **side, **types}, consts, **opts)

    out = {
        "gemm[tma]": spec(gemm_kernel, tma, fast),
        # misaligned rows or K % BK != 0: pointers and masked K (mma_tile, store_tile)
        "gemm[pointers]": spec(gemm_kernel, ptrs, dict(meta, EVEN_K=False, USE_TMA=False,
                                                       OUT_TMA=False)),
    }
    for label, trace in (("tma", False), ("tma,trace", True)):
        gathered = desc["a"] if has_tma else "*bf16"
        out[f"ag_gemm[{label}]"] = spec(ag_gemm_kernel, {**tma, "gathered_src": gathered},
                                        dict(fast, TRACE=clock if trace else 0))
    rs = dict(fast, MAXP=MAX_PIECES)
    out["gemm_rs[own,tma partials]"] = spec(gemm_rs_kernel, {**tma, "inbox": inbox},
                                            dict(rs, OWN=True, IN_TMA=has_tma, TRACE=0))
    out["gemm_rs[own,loaded partials]"] = spec(gemm_rs_kernel, {**tma, "inbox": "*bf16"},
                                               dict(rs, OWN=True, IN_TMA=False, TRACE=0))
    out["gemm_rs[peer chunk]"] = spec(gemm_rs_kernel, {**tma, "inbox": inbox},
                                      dict(rs, OWN=False, IN_TMA=has_tma, TRACE=0))
    out["gemm_rs[own,tma partials,trace]"] = spec(gemm_rs_kernel, {**tma, "inbox": inbox},
                                                  dict(rs, OWN=True, IN_TMA=has_tma, TRACE=clock))
    return out


def specs(target: str) -> dict[str, Spec]:
    """Every variant by name as launched on ``target``; fails when matrix.VARIANTS and
    this file disagree."""
    out = {**_collectives(), **_gemms(TARGETS[target])}
    missing, extra = set(VARIANTS) - set(out), set(out) - set(VARIANTS)
    if missing or extra:
        raise KeyError(f"matrix.VARIANTS and kernels.py disagree: not built {sorted(missing)}, "
                       f"not listed {sorted(extra)}; add the name to both")
    return out
