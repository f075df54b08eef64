"""``%topology`` and ``%linkbench``: see the machine a world runs on, and measure it.

    In [1]: %load_ext commlab
    In [2]: %topology --sample 8xh100-nvswitch --route ring
    In [3]: %dist_start -n 2
    In [4]: %topology                  # the world's ranks and links (measured on CPU)
    In [5]: %linkbench --sizes 4K,64K,1M
    linkbench: 100%|██████████| 3/3 sizes

Both run their measurements on the world's ranks through
``commlab.engine.current_world().apply``; without a world, ``%topology`` discovers this
machine and ``%linkbench -n 2`` measures on a temporary CPU world. In a world across
hosts ``%topology`` draws each host as a box around its ranks with the network link
between the hosts' NICs (``commlab.topology.of_world``), and ``%linkbench`` measures
the pairs on different hosts with send/recv, on their own colour scale.
"""

from __future__ import annotations

import argparse
import threading

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from commlab.topology.routes import ROUTES

from ._args import usage_errors

LAST: dict = {}  # the last topology / linkbench result, for reuse from code
_SAMPLER = None


def parse_size(text: str) -> int:
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try:
        n = int(float(s[:-1] if mul > 1 else s) * mul)
    except ValueError:
        raise ValueError(f"expected sizes like 4K,64K,1M, got {text!r}") from None
    if n < 16 or n % 16:
        raise ValueError(f"each size must be a multiple of 16 bytes, got {text!r} ({n} B)")
    return n


def size_list(text: str) -> list[int]:
    try:
        return sorted({parse_size(t) for t in text.split(",") if t.strip()})
    except ValueError as e:  # argparse shows ArgumentTypeError's text, not ValueError's
        raise argparse.ArgumentTypeError(str(e)) from None


size_list.__name__ = "size list"


_usage = usage_errors


def _world_or_none():
    try:
        from commlab.engine import world_or_none
    except ImportError:  # the notebook extras (ipyparallel, psutil) are not installed
        return None
    return world_or_none()


def _spawn_world(fn, n: int, args: tuple, progress_total: int | None = None, desc: str = ""):
    """Run ``fn(comm, *args, queue)`` on a temporary CPU world; the progress line (after
    ~2 s) follows rank 0's (done, total) messages."""
    import queue as _queue

    import torch.multiprocessing as mp

    from commlab.testing import run_world
    from commlab.widgets import Progress

    q = mp.get_context("spawn").Queue()
    box: dict = {}

    def run():
        try:
            box["rows"] = run_world(fn, n, args=args + (q,), backend="cpu")
        except BaseException as e:  # handed to the notebook thread below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    with Progress(desc or f"temporary world of {n} ranks", total=progress_total,
                  unit="pair") as bar:
        while t.is_alive():
            try:
                done, total = q.get(timeout=0.2)
                bar.step(done, total, "pairs measured")
            except _queue.Empty:
                pass
        t.join()
    if "error" in box:
        raise box["error"]
    return box["rows"]


@magics_class
class ObserveMagics(Magics):
    @magic_arguments()
    @argument("--load", metavar="FILE", help="explore a topology saved as JSON")
    @argument("--sample", metavar="NAME",
              help="a shipped topology: 2xh200-nv18, 8xh100-nvswitch, 4xpcie")
    @argument("--local", action="store_true",
              help="discover this machine even when a world is running")
    @argument("-n", type=int, default=None, metavar="N",
              help="no world running: describe a temporary CPU world of N ranks")
    @argument("--route", choices=sorted(ROUTES), default=None,
              help="highlight the links this collective algorithm uses")
    @argument("--save", metavar="FILE", help="also save the topology as JSON")
    @argument("--live", action="store_true",
              help="paint NVLink traffic (NVML per-link counters, 10 Hz) on the edges")
    @argument("--stop", action="store_true", help="stop painting live traffic")
    @argument("--text", action="store_true", help="print the topo -m matrix only")
    @line_magic
    @_usage
    def topology(self, line):
        """Show the topology explorer: graph, ``topo -m`` matrix, per-link detail, routes.

            In [1]: %topology --sample 2xh200-nv18 --route ring
            In [2]: %topology --load cluster.json
            In [3]: %topology            # the running world (or this machine)
        """
        global _SAMPLER
        args = parse_argstring(self.topology, line)
        if args.stop:
            if _SAMPLER is not None:
                _SAMPLER.stop()
                _SAMPLER = None
            print("live NVLink painting stopped")
            return None
        topo = self._topology(args)
        LAST["topology"] = topo
        if args.save:
            print(f"saved {topo.save(args.save)}")
        if args.text:
            from commlab.topology import format_matrix

            print(topo.summary())
            print(format_matrix(topo))
            return None
        from commlab.widgets import TopologyExplorer

        x = TopologyExplorer(topo, route=args.route or "")
        if args.live:
            _SAMPLER = self._live(topo, x)
        LAST["explorer"] = x
        return x

    def _topology(self, args):
        from commlab import topology as T

        if args.load:
            return T.Topology.load(args.load)
        if args.sample:
            return T.sample(args.sample)
        world = None if args.local else _world_or_none()
        if world is not None:  # every rank builds it (hosts, NICs, measured links): rank 0's
            return world.apply(T.call_with_comm, T.of_world)[0]
        if args.n:
            return _world_topo(_spawn_world(T.probe_with_queue, args.n, ()))
        return T.discover()

    def _live(self, topo, explorer):
        global _SAMPLER
        from commlab.topology import nvml_available

        if not nvml_available():
            raise UsageError("--live needs NVIDIA GPUs and NVML (nvidia-ml-py); this machine "
                             "has none. Explore recorded traffic-free topologies with --sample")
        from commlab.topology.nvlink_counters import NvlinkSampler

        if _SAMPLER is not None:
            _SAMPLER.stop()
        return NvlinkSampler(topo, explorer.set_rates, on_error=explorer.show_error).start()

    @magic_arguments()
    @argument("--sizes", type=size_list, default=None, metavar="4K,64K,1M",
              help="message sizes (default: 4K..1M on CPU, 64K..256M on GPU)")
    @argument("--iters", type=int, default=None, help="timed runs per point (median)")
    @argument("--methods", default="triton,memcpy",
              help="triton (Triton copy kernel over cl.symm_at), memcpy (copy engine on GPU)")
    @argument("-n", type=int, default=None, metavar="N",
              help="no world running: measure on a temporary CPU world of N ranks")
    @argument("--load", metavar="FILE", help="show a saved result instead of measuring")
    @argument("--save", metavar="FILE", help="also save the result as JSON")
    @line_magic
    @_usage
    def linkbench(self, line):
        """Measure every ordered pair of ranks over a size sweep; show a heatmap (GB/s and %
        of peak) and the bandwidth-vs-size curves.

            In [1]: %dist_start -n 2
            In [2]: %linkbench --sizes 4K,64K,1M
        """
        from commlab.topology import LinkBenchResult
        from commlab.widgets import LinkBenchView

        args = parse_argstring(self.linkbench, line)
        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
        if args.load:
            res = LinkBenchResult.load(args.load)
        else:
            res = self._measure(args.sizes, args.iters, methods, args.n)
        LAST["linkbench"] = res
        if args.save:
            print(f"saved {res.save(args.save)}")
        return LinkBenchView(res)

    def _measure(self, sizes, iters, methods, n):
        from commlab.topology.linkbench import METHODS

        bad = [m for m in methods if m not in METHODS]
        if bad:
            raise UsageError(f"--methods: {bad[0]!r} is not a method; use "
                             f"{','.join(METHODS)}")
        world = _world_or_none()
        if world is not None:
            return _measure_on_world(world, sizes, iters, methods)
        if not n:
            raise UsageError("no world is running: start one with %dist_start -n 2, or pass "
                             "-n 2 to measure on a temporary CPU world")
        from commlab.topology import LinkBenchResult, bench_and_info

        k = len(sizes) if sizes else 5
        outs = _spawn_world(bench_and_info, n, (sizes, iters, methods),
                            progress_total=k * len(methods) * n * n, desc="linkbench")
        return LinkBenchResult.from_rows([o["row"] for o in outs])


def _world_topo(outs):
    from commlab.topology import LinkBenchResult, world_topology

    infos = [o["info"] for o in outs]
    bench = None
    if all("row" in o for o in outs):
        bench = LinkBenchResult.from_rows([o["row"] for o in outs])
    return world_topology(infos, bench)


def _measure_on_world(world, sizes, iters, methods):
    """One ``apply`` per size, so the progress line (after ~2 s) moves as sizes finish."""
    from commlab.topology import LinkBenchResult, call_with_comm, rank_info, world_topology
    from commlab.topology.linkbench import CPU_SIZES, GPU_SIZES, rank_run
    from commlab.widgets import Progress, fmt_binary

    rows = None
    with Progress(f"linkbench on {world.size} ranks", unit="size") as bar:
        infos = world.apply(call_with_comm, rank_info)
        backend = infos[0]["backend"]
        sizes = list(sizes or (CPU_SIZES if backend == "cpu" else GPU_SIZES))
        for k, s in enumerate(sizes):
            bar.step(k, len(sizes), f"{fmt_binary(s)} (every ordered pair)")
            part = world.apply(call_with_comm, rank_run, (s,), iters, methods)
            if rows is None:
                rows = part
            else:
                for r, p in zip(rows, part, strict=True):
                    for m in methods:
                        r["gbps"][m].extend(p["gbps"][m])
    for r in rows:
        r["sizes"] = sizes
    topo = None if backend == "cpu" else world_topology(infos)
    return LinkBenchResult.from_rows(rows, topo)


def register(ipython) -> None:
    """Register %topology and %linkbench (called by ``%load_ext commlab``)."""
    ipython.register_magics(ObserveMagics)
