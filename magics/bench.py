"""``%commbench``: benchmark the running world's collectives and draw the curves.

    In [1]: %load_ext commlab
    In [2]: %dist_start -n 2 --backend cpu
    In [3]: %commbench --ops all_reduce --sizes 8,64KiB,1MiB --iters 3
    commbench: 3 sizes x 5 implementations on 2 ranks ...
    (plotly figure: latency and busbw per implementation; records in ``_commbench``)
    In [4]: %commbench --load bench/results/2xh200-w2.json --ops all_reduce

Every implementation is checked against NCCL/gloo before it is timed (see
``commlab.bench``); failures are listed under the figure, never plotted.
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ._args import usage_errors

LAST: dict = {}


def bench_on_rank(kwargs: dict) -> dict:
    """Runs on every rank of the world (through ``World.apply``)."""
    from dataclasses import asdict

    import commlab
    from commlab import bench

    comm = commlab.get_communicator()
    res = bench.run(comm, progress=False, **kwargs)
    return {"records": [asdict(r) for r in res.records],
            "failures": [str(f) for f in res.failures], "skipped": res.skipped,
            "peak": bench.link_peak_gbps(comm), "file": bench.results_path(".", comm).name}


_usage = usage_errors


@magics_class
class BenchMagics(Magics):
    @magic_arguments()
    @argument("--ops", default="all_reduce", help="comma list (default all_reduce; 'all')")
    @argument("--sizes", default=None, help="comma list, e.g. 8,64KiB,1MiB")
    @argument("--min", default="8", help="smallest size when --sizes is not given")
    @argument("--max", default="1MiB", help="largest size when --sizes is not given")
    @argument("--dtype", default=None, help="float32 | bfloat16 | float16 | int32")
    @argument("--algorithms", default=None, help="impl patterns: nccl,gloo,commlab:*,two_shot")
    @argument("--mode", default="eager", choices=("eager", "graph", "both"))
    @argument("--iters", type=int, default=10, help="timed repetitions per size")
    @argument("--out", default=None, help="also merge the records into DIR/<machine>-w<N>.json")
    @argument("--load", default=None, metavar="FILE",
              help="draw recorded results from FILE instead of measuring")
    @line_magic
    @_usage
    def commbench(self, line):
        """Verify and time collectives on the running world; draw latency and busbw."""
        from commlab import bench

        args = parse_argstring(self.commbench, line)
        ops = list(bench.OPS) if args.ops == "all" else [o.strip() for o in args.ops.split(",")]
        bad = [o for o in ops if o not in bench.OPS]
        if bad:
            raise UsageError(f"--ops: unknown {bad}; use some of {', '.join(bench.OPS)} or all")
        if args.load:
            records = [r for r in bench.load_records(args.load) if r.op in ops]
            if not records:
                raise UsageError(f"--load {args.load}: no records for {', '.join(ops)}")
            return self._show(records, [], [], None, f"recorded: {args.load}")
        from commlab.engine import current_world

        world = current_world()
        sizes = ([bench.parse_size(s) for s in args.sizes.split(",")] if args.sizes
                 else bench.size_range(args.min, args.max, 4))
        modes = ("eager", "graph") if args.mode == "both" else (args.mode,)
        kwargs = {"ops": ops, "sizes": sizes, "dtype": args.dtype, "modes": modes,
                  "iters": args.iters,
                  "algorithms": args.algorithms.split(",") if args.algorithms else None}
        print(f"commbench: {len(ops)} op(s) x {len(sizes)} sizes on {world.size} ranks "
              f"(each implementation verified, then timed) ...")
        first = self._run(world, kwargs)
        records = [bench.Record(**r) for r in first["records"]]
        if args.out and records:
            path = bench.write_records(f"{args.out}/{first['file']}", records)
            print(f"wrote {len(records)} records to {path}")
        return self._show(records, first["failures"], first["skipped"], first["peak"],
                          f"{world.size} ranks")

    @staticmethod
    def _run(world, kwargs: dict) -> dict:
        """One ``apply`` per (op, size), so the progress line moves as each finishes;
        rank 0's records, failures and skipped notes merged."""
        from commlab.bench import fmt_bytes
        from commlab.widgets import Progress

        plan = [(op, s) for op in kwargs["ops"] for s in kwargs["sizes"]]
        merged: dict = {"records": [], "failures": [], "skipped": []}
        with Progress("commbench", total=len(plan), unit="size") as p:
            for k, (op, size) in enumerate(plan):
                p.step(k, what=f"{op} {fmt_bytes(size)}")
                out = world.apply(bench_on_rank, dict(kwargs, ops=[op], sizes=[size]))[0]
                merged["records"] += out["records"]
                merged["failures"] += out["failures"]
                merged["skipped"] += [x for x in out["skipped"] if x not in merged["skipped"]]
                merged.update(peak=out["peak"], file=out["file"])
            p.step(len(plan), what="done")
        return merged

    def _show(self, records, failures, skipped, peak, title):
        from IPython.display import display

        from commlab import bench

        LAST.update(records=records, failures=failures)
        self.shell.user_ns["_commbench"] = records
        if records:
            display(bench.figure(records, peak_gbps=peak, title=f"commbench — {title}"))
            print(bench.format_table(records, peak))
        for s in skipped:
            print(f"skipped: {s}")
        for f in failures:
            print(f"FAILED verification (not timed): {f}")


def register(ipython) -> None:
    """Register %commbench (called by ``%load_ext commlab``)."""
    ipython.register_magics(BenchMagics)
