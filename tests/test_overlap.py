"""ag_gemm and gemm_rs on the CPU backend, against torch (gloo all-gather / reduce-scatter
plus matmul), on worlds of 2 and 3 ranks. One world per size runs every check
(``overlap_world`` below); each test asserts on its own section of the results."""

from __future__ import annotations

import secrets

import pytest
import torch
import torch.distributed as dist

from tests.conftest import assert_checks
from tests.worlds._checks import Checks

# bf16/fp16 outputs: within a few units in the last place of the largest value
ULPS = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3}


def _close(out, ref):
    """out (dtype) vs an fp32 reference: relative to the reference's scale, since partial
    sums rounded to 16 bits differ from fp32 by ulps of the *largest* value."""
    scale = ULPS[out.dtype] * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(out.float(), ref, rtol=2 * ULPS[out.dtype], atol=scale)
# (rows per rank, K, N): none a multiple of the CPU tiles (16 x 32 x 16)
SHAPES = [(25, 40, 72), (7, 37, 33)]


def _gathered(comm, a):
    parts = [torch.empty_like(a) for _ in range(comm.world_size)]
    dist.all_gather(parts, a, group=comm.cpu_group)
    return torch.cat(parts)


def _reduce_scattered(comm, full):
    total = full.clone()
    dist.all_reduce(total, group=comm.cpu_group)
    rows = full.shape[0] // comm.world_size
    return total[comm.rank * rows:(comm.rank + 1) * rows]


def _check_numerics(comm, checks, g):
    import commlab

    # world 2 runs everything; world 3 (odd world, odd chunk order) the fused kernels on
    # one shape per dtype, to stay inside the CI budget
    small = comm.world_size > 2
    for dtype in (torch.bfloat16, torch.float16):
        for rows, k, n in SHAPES[1:] if small else SHAPES:
            for algorithm in ("fused",) if small else ("fused", "sequential"):
                label = f"{dtype} rows={rows} k={k} n={n} {algorithm}"
                # every rank makes every call before any comparison can fail, so one
                # rank's failed check never leaves the others waiting in a collective
                calls = []
                for _ in range(3):  # repeated calls: epochs and both buffer slots
                    a = torch.randn(rows, k, generator=g).to(dtype)
                    b = torch.randn(k, n, generator=g).to(dtype)
                    out = commlab.ag_gemm(a, b, algorithm=algorithm)
                    calls.append((out, _gathered(comm, a.float()) @ b.float()))
                with checks.case("ag_gemm", label):
                    for out, ref in calls:
                        assert out.shape == (comm.world_size * rows, n) and out.dtype == dtype
                        _close(out, ref)
                calls = []
                for _ in range(3):
                    a = torch.randn(comm.world_size * rows, k, generator=g).to(dtype)
                    b = torch.randn(k, n, generator=g).to(dtype)
                    out = commlab.gemm_rs(a, b, algorithm=algorithm)
                    # the reference rounds each rank's partial product to dtype, as both
                    # "matmul then reduce-scatter" and the fused kernel's transfers do
                    partial = (a.float() @ b.float()).to(dtype).float()
                    calls.append((out, _reduce_scattered(comm, partial)))
                with checks.case("gemm_rs", label):
                    for out, ref in calls:
                        assert out.shape == (rows, n) and out.dtype == dtype
                        _close(out, ref)
    with checks.case("triton_gemm", "the fused kernels' GEMM alone matches torch"):
        from commlab.overlap import matmul

        for rows, k, n in SHAPES:
            a = torch.randn(rows, k, generator=g).bfloat16()
            b = torch.randn(k, n, generator=g).bfloat16()
            _close(matmul(comm, a, b), a.float() @ b.float())
            _close(matmul(comm, a, b.t().contiguous().t()), a.float() @ b.float())
    with checks.case("strided_weight", "b given as a transposed view"):
        a = torch.randn(9, 40, generator=g).bfloat16()
        bt = torch.randn(72, 40, generator=g).bfloat16()
        out = commlab.ag_gemm(a, bt.t())
        a2 = torch.randn(comm.world_size * 9, 40, generator=g).bfloat16()
        out2 = commlab.gemm_rs(a2, bt.t())
        _close(out, _gathered(comm, a.float()) @ bt.t().float())
        _close(out2, _reduce_scattered(comm, (a2.float() @ bt.t().float()).bfloat16().float()))


def _check_errors(comm, checks):
    import commlab
    from commlab.errors import CommlabUsageError, RankMismatchError

    def raises(exc, fn, *words):
        try:
            fn()
        except exc as e:
            for w in words:
                assert w in str(e), f"{w!r} not in error: {e}"
            return
        raise AssertionError(f"no {exc.__name__} raised")

    bf = torch.bfloat16
    with checks.case("errors", "rows not divisible by the world size (gemm_rs)"):
        w = comm.world_size
        raises(CommlabUsageError, lambda: commlab.gemm_rs(torch.ones(w + 1, 8, dtype=bf),
                                                          torch.ones(8, 8, dtype=bf)),
               "divisible", str(w + 1))
    with checks.case("errors", "K of a and b differ"):
        raises(CommlabUsageError, lambda: commlab.ag_gemm(torch.ones(4, 8, dtype=bf),
                                                          torch.ones(9, 8, dtype=bf)),
               "a.shape[1] must equal b.shape[0]")
    with checks.case("errors", "float32 is refused with the fix"):
        raises(CommlabUsageError, lambda: commlab.ag_gemm(torch.ones(4, 8), torch.ones(8, 8)),
               "float32", "bfloat16")
    with checks.case("errors", "shapes differ across ranks"):
        rows = 4 + comm.rank  # every rank differs
        raises(RankMismatchError, lambda: commlab.ag_gemm(torch.ones(rows, 8, dtype=bf),
                                                          torch.ones(8, 8, dtype=bf)))
    with checks.case("errors", "a bad rank makes every rank raise"):
        k = 9 if comm.rank == 1 else 8  # only rank 1 breaks the K rule
        raises(CommlabUsageError, lambda: commlab.gemm_rs(
            torch.ones(2 * comm.world_size, 8, dtype=bf), torch.ones(k, 8, dtype=bf)),
               "rank 1")
    with checks.case("errors", "the world still works after the errors"):
        a = torch.ones(3, 8, dtype=bf)
        out = commlab.ag_gemm(a, torch.ones(8, 5, dtype=bf))
        assert torch.equal(out.float(), torch.full((3 * comm.world_size, 5), 8.0))


def _check_trace(comm, checks, g):
    import commlab
    from commlab.trace import Span

    rows, k, n = 25, 40, 72
    commlab.trace.start()
    commlab.ag_gemm(torch.randn(rows, k, generator=g).bfloat16(),
                    torch.randn(k, n, generator=g).bfloat16(), algorithm="fused")
    commlab.gemm_rs(torch.randn(comm.world_size * rows, k, generator=g).bfloat16(),
                    torch.randn(k, n, generator=g).bfloat16(), algorithm="fused")
    spans = commlab.trace.stop()
    with checks.case("trace", "tile spans carry roles and program lanes"):
        tiles = [s for s in spans if isinstance(s, Span) and "tile" in s.meta]
        kinds = {(s.meta["op"], s.kind) for s in tiles}
        want = {("ag_gemm", "wait"), ("ag_gemm", "compute"), ("ag_gemm", "copy"),
                ("gemm_rs", "compute"), ("gemm_rs", "wait"), ("gemm_rs", "reduce")}
        assert want <= kinds, f"missing roles: {want - kinds}"
        assert all(s.lane.startswith("program ") for s in tiles), {s.lane for s in tiles}
    with checks.case("trace", "gemm_rs sends each peer's partial between its launches"):
        pushes = [s for s in spans if s.name == "gemm_rs:push"]
        assert len(pushes) == comm.world_size - 1 and all(s.kind == "copy" for s in pushes)
        rs = [s for s in tiles if s.meta["op"] == "gemm_rs"]
        own_first = min(s.meta["tile"] for s in rs if s.kind == "reduce")
        per_chunk = own_first // (comm.world_size - 1)
        own_start = min(s.start_us for s in rs if s.meta["tile"] >= own_first)
        # push c follows chunk c's launch; the own chunk starts after every push
        for c, push in enumerate(sorted(pushes, key=lambda s: s.start_us)):
            done = max(s.end_us for s in rs if s.meta["tile"] // per_chunk == c)
            assert done <= push.start_us + 1e-3, (c, done, push.start_us)
        assert max(s.end_us for s in pushes) <= own_start + 1e-3
        assert all(s.end_us >= s.start_us >= 0 and s.rank == comm.rank for s in tiles)
        comm_spans = {s.name for s in spans if s.kind == "comm"}
        assert {"ag_gemm", "gemm_rs"} <= comm_spans, comm_spans
    with checks.case("trace", "the local chunk is computed before any wait"):
        ag = [s for s in tiles if s.meta["op"] == "ag_gemm" and s.kind in ("wait", "compute")]
        n_local = (max(s.meta["tile"] for s in ag) + 1) // comm.world_size
        first_wait = min(s.start_us for s in ag if s.kind == "wait")
        local = [s for s in ag if s.kind == "compute" and s.meta["tile"] < n_local]
        assert len(local) == n_local and not any(
            s.kind == "wait" and s.meta["tile"] < n_local for s in ag)
        assert max(s.end_us for s in local) <= first_wait + 1e-3


def _check_pieces(comm, checks, g):
    """gemm_rs on a chunk of many row tiles: the partial goes in pieces, each flagged."""
    import triton

    import commlab
    from commlab.overlap import _buffers
    from commlab.overlap import _launch as oc
    from commlab.overlap.gemm_rs import MAX_PIECES, piece_tiles

    rows, k, n = 288, 16, 8  # 18 row tiles of 16 (one column tile): 2 per piece, 9 pieces
    a = torch.randn(comm.world_size * rows, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    out = commlab.gemm_rs(a, b, algorithm="fused")
    with checks.case("gemm_rs_pieces", "a partial chunk of 18 row tiles lands in 9 pieces"):
        _close(out, _reduce_scattered(comm, (a.float() @ b.float()).bfloat16().float()))
        ptiles = piece_tiles(comm, rows, n, 2, oc.CPU_TILE.BM)
        pieces = triton.cdiv(rows, ptiles * oc.CPU_TILE.BM)
        assert (ptiles, pieces) == (2, 9), (ptiles, pieces)
        bufs = _buffers.buffers(comm, "gemm_rs", rows, n, torch.bfloat16, MAX_PIECES)  # cached
        for src in range(comm.world_size):
            if src != comm.rank:  # written by src's producer: one flag per piece
                assert bufs.flags[src, :pieces].tolist() == [bufs.epoch] * pieces
                assert not bufs.flags[src, pieces:].any()


def _check_split_tail(comm, checks, g):
    """The kernels as on a GPU with 5 or 7 SMs: the tiles of a partial last wave are
    split into parts of K, one per program, and combined by whichever finishes last."""
    import commlab
    from commlab.overlap import _launch as oc
    from commlab.overlap import matmul
    from commlab.trace import Span

    rows, k, n = 16, 1100, 72  # 3 tiles per chunk, 18 K iterations of 64 (the last ragged)
    w = comm.world_size
    saved = oc.CPU_PROGRAMS
    split = set()
    counted = 0  # split launches whose arrival counters were checked
    try:
        for progs in (5, 7):
            oc.CPU_PROGRAMS = progs
            for op, tiles in (("ag_gemm", 3 * w), ("gemm_rs", 3), ("matmul", 3)):
                if oc.schedule(comm, oc.CPU_TILE, tiles, k).split:
                    split.add(op)
            with checks.case("split_tail", f"{progs} programs"):
                a = torch.randn(rows, k, generator=g).bfloat16()
                b = torch.randn(k, n, generator=g).bfloat16()
                _close(commlab.ag_gemm(a, b, algorithm="fused"),
                       _gathered(comm, a.float()) @ b.float())
                a2 = torch.randn(w * rows, k, generator=g).bfloat16()
                _close(commlab.gemm_rs(a2, b, algorithm="fused"),
                       _reduce_scattered(comm, (a2.float() @ b.float()).bfloat16().float()))
                _close(matmul(comm, a, b), a.float() @ b.float())
                # the counters the split launches above used (ag_gemm: 3 W tiles,
                # gemm_rs per launch and matmul: 3), each back at zero
                for t in (3 * w, 3):
                    sched = oc.schedule(comm, oc.CPU_TILE, t, k)
                    if sched.split:
                        _, cnt = oc.tail_workspace(comm, sched, oc.CPU_TILE)
                        assert cnt.numel() >= sched.programs
                        assert not cnt.any(), "arrival counters must be back at zero"
                        counted += 1
        with checks.case("split_tail", "every op ran with a split tail"):
            assert split == {"ag_gemm", "gemm_rs", "matmul"}, split
            assert counted, "no split launch had its counters checked"
        with checks.case("split_tail", "a tile computed in parts shows on several lanes"):
            oc.CPU_PROGRAMS = 5 if w == 2 else 7  # ag_gemm's 3 W tiles: a split tail
            commlab.trace.start()
            commlab.ag_gemm(torch.randn(rows, k, generator=g).bfloat16(),
                            torch.randn(k, n, generator=g).bfloat16(), algorithm="fused")
            spans = commlab.trace.stop()
            lanes: dict = {}
            for s in spans:
                if isinstance(s, Span) and s.kind == "compute" and "tile" in s.meta:
                    lanes.setdefault(s.meta["tile"], set()).add(s.lane)
            assert sorted(lanes) == list(range(3 * w)), sorted(lanes)
            assert any(len(v) > 1 for v in lanes.values()), lanes
            used = {ln for v in lanes.values() for ln in v}
            assert used <= {f"program {i}" for i in range(oc.CPU_PROGRAMS)}, used
    finally:
        oc.CPU_PROGRAMS = saved


def overlap_world(comm, seed):
    g = torch.Generator().manual_seed(seed + comm.rank)
    checks = Checks(comm.rank)
    if comm.world_size == 2:
        _check_pieces(comm, checks, g)
    _check_numerics(comm, checks, g)
    _check_split_tail(comm, checks, g)
    _check_errors(comm, checks)
    _check_trace(comm, checks, g)
    return checks.result()


@pytest.fixture(scope="module")
def results():
    from commlab.testing import WorldError, run_world

    cache: dict[int, object] = {}

    def get(world_size: int):
        if world_size not in cache:
            seed = secrets.randbelow(1 << 30)
            try:
                cache[world_size] = run_world(overlap_world, world_size, args=(seed,),
                                              timeout=240, env={"COMMLAB_TIMEOUT": "60"})
            except WorldError as e:
                cache[world_size] = e
            print(f"world {world_size}: seed={seed}")
        if isinstance(cache[world_size], WorldError):
            pytest.fail(str(cache[world_size]), pytrace=False)
        return cache[world_size]

    return get


WORLDS = [2, 3]


@pytest.mark.parametrize("world_size", WORLDS)
def test_ag_gemm_matches_all_gather_then_matmul(results, world_size):
    assert_checks(results(world_size), "ag_gemm")


@pytest.mark.parametrize("world_size", WORLDS)
def test_gemm_rs_matches_matmul_then_reduce_scatter(results, world_size):
    assert_checks(results(world_size), "gemm_rs")


@pytest.mark.parametrize("world_size", WORLDS)
def test_weights_given_as_transposed_views_work(results, world_size):
    assert_checks(results(world_size), "strided_weight")


@pytest.mark.parametrize("world_size", WORLDS)
def test_bad_arguments_raise_clear_errors_on_every_rank(results, world_size):
    assert_checks(results(world_size), "errors")


@pytest.mark.parametrize("world_size", WORLDS)
def test_tile_timeline_records_roles_per_program(results, world_size):
    assert_checks(results(world_size), "trace")


@pytest.mark.parametrize("world_size", WORLDS)
def test_the_fused_kernels_gemm_alone_matches_torch(results, world_size):
    assert_checks(results(world_size), "triton_gemm")


@pytest.mark.parametrize("world_size", WORLDS)
def test_a_partial_last_wave_split_along_k_gives_the_same_result(results, world_size):
    assert_checks(results(world_size), "split_tail")


def test_only_a_partial_last_wave_is_split_and_into_equal_parts_of_k():
    from types import SimpleNamespace

    from commlab.overlap import _launch as oc

    gpu = SimpleNamespace(backend="cuda", device="cuda:0")
    oc._SMS["cuda:0"] = 132
    try:
        t = oc.GPU_TILE
        # 8B all-gather GEMM, M=8192: 3584 tiles = 27 waves + 20 tiles; 64 K iterations
        s = oc.schedule(gpu, t, 3584, 4096)
        assert (s.programs, s.dp_tiles, s.split) == (132, 3564, 6)  # 132 // 20
        assert s.trace_rows == 3584 + 132
        assert oc.schedule(gpu, t, 132 * 4, 4096).split == 0  # full waves
        assert oc.schedule(gpu, t, 132 + 70, 4096).split == 0  # last wave over half full
        assert oc.schedule(gpu, t, 132 + 10, 4096).split == 8  # at most 8 parts
        assert oc.schedule(gpu, t, 132 + 10, 640).split == 2  # >= 4 K iterations a part
        few = oc.schedule(gpu, t, 32, 7168)  # fewer tiles than SMs: each in 4 parts
        assert (few.programs, few.dp_tiles, few.split) == (132, 0, 4)
        laptop = SimpleNamespace(backend="cpu", device="cpu")  # plans for a GPU it lacks
        assert oc.schedule(laptop, t, 3584, 4096, sms=132) == s
        oc.SPLIT_TAIL = False
        assert oc.schedule(gpu, t, 3584, 4096) == oc.Schedule(132, 3584, 3584, 0)
    finally:
        oc.SPLIT_TAIL = True
        del oc._SMS["cuda:0"]


def test_gemm_rs_sends_partials_in_pieces_of_at_least_4_mib_and_at_most_16():
    from types import SimpleNamespace

    from commlab.overlap.gemm_rs import piece_tiles

    gpu = SimpleNamespace(backend="cuda")
    # (rows, N) of bf16 -> row tiles of 128 per piece
    assert piece_tiles(gpu, 256, 4096, 2, 128) == 2  # 2 MiB: one piece
    assert piece_tiles(gpu, 4096, 4096, 2, 128) == 4  # 32 MiB: 8 pieces of 4 row tiles
    assert piece_tiles(gpu, 8192, 8192, 2, 128) == 4  # 128 MiB: capped at 16 pieces
    assert piece_tiles(gpu, 1000, 136, 2, 128) == 8  # tiny: one piece of every row tile


def test_pieces_of_a_partial_chunk_land_with_their_own_flags(results):
    assert_checks(results(2), "gemm_rs_pieces")


def test_launch_options_change_the_schedule_inside_the_block_and_restore_it_after_an_error(
        monkeypatch):
    from types import SimpleNamespace

    from commlab import overlap
    from commlab.overlap import _launch

    # tile_config follows the device's arch: this fake GPU is an H100/H200
    monkeypatch.setattr(_launch, "current_target",
                        lambda c: ("cpu", 0) if c.backend == "cpu" else ("cuda", 90))

    gpu = SimpleNamespace(backend="cuda", device="cuda:0")
    cpu = SimpleNamespace(backend="cpu", device="cpu")
    small = overlap.TileConfig(64, 64, 64, 8, 4, 3)
    _launch._SMS["cuda:0"] = 132
    try:
        assert overlap.schedule(gpu, overlap.GPU_TILE, 3584, 4096).split == 6
        with pytest.raises(RuntimeError, match="inside"):
            with overlap.launch_options(gpu_tile=small, split_tail=False, cpu_programs=5):
                assert _launch.tile_config(gpu) == small
                assert overlap.schedule(gpu, overlap.GPU_TILE, 3584, 4096).split == 0
                assert overlap.schedule(cpu, overlap.CPU_TILE, 12, 64).programs == 5
                raise RuntimeError("inside")
        assert _launch.tile_config(gpu) == overlap.GPU_TILE
        assert overlap.schedule(gpu, overlap.GPU_TILE, 3584, 4096).split == 6
        assert overlap.schedule(cpu, overlap.CPU_TILE, 12, 64).programs == 12  # one per tile
    finally:
        del _launch._SMS["cuda:0"]
