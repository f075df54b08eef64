"""The world magics: %dist_start, %%distributed, %dist_status, %dist_stop, %dist_restart,
%dist_resize, %dist_push, %dist_pull. See each magic's docstring (``%dist_start?``)."""

from __future__ import annotations

import functools
import time
from collections import defaultdict

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from commlab.errors import CommlabUsageError
from commlab.widgets import Progress

from ._args import GRACE, RANK, RANKS, TIMEOUT, rank_list


def _usage(fn):
    """commlab's usage errors become IPython UsageErrors (a message, no traceback)."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except CommlabUsageError as e:
            raise UsageError(str(e)) from None

    return wrapper


def _world():
    from commlab.engine import current_world

    return current_world()


def _show_trace(spans: list[dict]) -> None:
    """The timeline widget (commlab.widgets.show_timeline) or, without the widget's
    dependencies, a short text summary per rank."""
    try:
        from commlab.widgets import show_timeline
    except ImportError:
        print(_trace_summary(spans))
        return
    show_timeline(spans)  # displays itself


def _trace_summary(spans: list[dict]) -> str:
    if not spans:
        return "trace: no spans recorded (commlab's collectives record 'comm' spans)"
    per: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for s in spans:
        acc = per[s["rank"]][(s["kind"], s["name"])]
        acc[0] += 1
        acc[1] += s["end_us"] - s["start_us"]
    lines = [f"trace: {len(spans)} spans (install the timeline widget for the picture)"]
    for r in sorted(per):
        items = ", ".join(f"{name} [{kind}] x{n} {us:.0f} us"
                          for (kind, name), (n, us) in sorted(per[r].items()))
        lines.append(f"  rank {r}: {items}")
    return "\n".join(lines)


@magics_class
class DistMagics(Magics):
    """%dist_start and friends: a world of ranks, one ipyparallel engine each."""

    @magic_arguments()
    @argument("-n", type=int, required=True, metavar="N", help="number of ranks")
    @argument("--backend", choices=["auto", "cpu", "cuda"], default="auto",
              help="cpu: Triton's interpreter, ranks share memory; cuda: compiled on the "
                   "GPUs (more ranks than GPUs share them); auto: cuda when there is a GPU")
    @argument("--devices", type=rank_list, default=None, metavar="0,1",
              help="GPU index for each rank, in rank order (default: rank r uses GPU r "
                   "modulo the GPU count; 0,0,0,0 puts four ranks on GPU 0)")
    @argument("--launcher", default="local", metavar="local|ssh|mpi|slurm",
              help="how engines start: local (this machine), ssh (on --hosts), mpi "
                   "(mpirun, on --hosts or here), slurm (sbatch + srun)")
    @argument("--hosts", default=None, metavar="h0:2,h1:2",
              help="hosts for --launcher ssh/mpi: HOST:RANKS each, or HOST,... to split "
                   "-n evenly; ranks of one host are contiguous")
    @argument("--ip", default=None, metavar="ADDR",
              help="this machine's address the ranks reach it on (default: the address "
                   "on the route to the first remote host; 127.0.0.1 for local)")
    @line_magic
    @_usage
    def dist_start(self, line):
        """Start a world of N ranks: fresh processes (ipyparallel engines), each with
        ``commlab.init()`` done and ``commlab, torch, triton, tl, cl, comm, rank,
        world_size`` defined. A running world is stopped first (its variables are gone;
        the line printed says so). A progress bar shows after 2 s.

        Example::

            In [1]: %load_ext commlab
            In [2]: %dist_start -n 4 --backend cpu
            world of 4 ranks started (backend cpu) in 7.2 s
            In [3]: %%distributed
               ...: x = torch.full((3,), float(rank))
               ...: print(commlab.all_reduce(x))
            [ranks 0-3] tensor([6., 6., 6.])

        Beyond one machine, ``--launcher ssh --hosts node0:2,node1:2`` starts the engines
        over ssh (your ssh config applies; ``$COMMLAB_SSH_ARGS`` adds arguments),
        ``--launcher mpi`` through ``mpirun --host`` (the connection info travels in the
        environment; tested on hosts sharing one filesystem), ``--launcher slurm`` through
        ``sbatch``/``srun`` (with ``--ip``). Every rank's output, errors, Ctrl-C, hang
        reports and the debugger work the same; a rank whose notebook is gone ends itself.
        The hosts need this Python environment at the same path, and one
        ``COMMLAB_WORLD_KEY`` where they do not share a home directory.
        """
        from commlab.engine import start_world

        args = parse_argstring(self.dist_start, line)
        t0 = time.monotonic()
        with Progress(f"starting {args.n} ranks", total=args.n + 2) as p:
            w = start_world(n=args.n, backend=args.backend, devices=args.devices,
                            progress=p.step, launcher=args.launcher, hosts=args.hosts,
                            ip=args.ip)
        _started(w, t0)

    @magic_arguments()
    @RANKS
    @TIMEOUT
    @GRACE
    @argument("--trace", action="store_true",
              help="record commlab.trace spans on every rank and show the timeline")
    @argument("--racecheck", action="store_true",
              help="run the cell under commlab.racecheck() on every rank: a data race in "
                   "a kernel raises DataRaceError naming both accesses")
    @argument("--shuffle", action="store_true",
              help="with --racecheck: start each launch's programs in an order drawn "
                   "from --seed and switch between them at signals, waits and accesses")
    @argument("--seed", type=int, default=None,
              help="with --racecheck --shuffle: the schedule's seed (a report names the "
                   "one that found it; the same seed replays it); default 0")
    @cell_magic
    @_usage
    def distributed(self, line, cell):
        """Run the cell on every rank (or on --ranks), output labelled by rank.

        Identical lines from several ranks are printed once (``[ranks 0-3] ...``). An
        exception on any rank raises here, grouped by traceback. Ctrl-C reaches every
        rank. A hang (some ranks finished, others blocked in a collective for --grace
        seconds, or --timeout passed) is reported with each blocked rank's stack, then
        the world recovers. ``breakpoint()`` on a rank opens ``[rank k] (Pdb)`` here.

        Example::

            In [4]: %%distributed --timeout 10
               ...: if rank == 0:
               ...:     commlab.all_reduce(torch.ones(4))   # only rank 0 calls it
            Hang: --timeout 10 s passed.
            [rank 0] blocked in commlab.all_reduce (waiting at the agreement block ...)
                cell, line 2, in <module>:  commlab.all_reduce(torch.ones(4))
            ...
            rank 0 interrupted; the world recovered (comm.recover() on every rank) ...
        """
        from commlab.engine import DistributedError, HangError

        args = parse_argstring(self.distributed, line)
        if (args.shuffle or args.seed is not None) and not args.racecheck:
            raise UsageError(f"{'--shuffle' if args.shuffle else '--seed'} picks "
                             f"racecheck's schedule: add --racecheck (e.g. %%distributed "
                             f"--racecheck --shuffle --seed 3)")
        if args.seed is not None and not args.shuffle:
            raise UsageError(f"--seed {args.seed} seeds the shuffled schedule: add "
                             f"--shuffle (plain --racecheck runs programs in launch order)")
        if args.racecheck:
            from commlab.racecheck import start, stop

            if args.ranks is not None:
                raise UsageError("--racecheck runs on every rank: drop --ranks")
            _world().apply(start, shuffle=args.shuffle, seed=args.seed or 0)
        from commlab.engine import numbered

        # IPython counts the running cell before it runs: its number is one less
        n = max(1, self.shell.execution_count - 1)
        code = numbered(cell, n)  # ranks name this cell In[n], lines as JupyterLab counts
        try:
            spans = _world().run_cell(code, ranks=args.ranks, timeout=args.timeout,
                                      grace=args.grace, trace=args.trace)
        except (DistributedError, HangError) as e:
            failed = e if isinstance(e, DistributedError) else e.failures
            if failed is not None and code == cell:  # not numbered: name this cell
                failed.cell_number = n
            raise
        finally:
            if args.racecheck:
                _world().apply(stop)
        if args.trace:
            _show_trace(spans)

    @line_magic
    @_usage
    def dist_status(self, line):
        """Show the world: each rank's engine, pid, device, and whether it is alive.

        Example::

            In [5]: %dist_status
            world of 2 ranks, backend cpu, shm heap, generation 0
              rank 0: myhost, engine 0, pid 4242, cpu, alive, 412 MiB
              rank 1: myhost, engine 1, pid 4243, cpu, alive, 409 MiB

        On one GPU (``%dist_start -n 4``) the heap is ``ipc`` and a line under the first
        says that the 4 ranks share one GPU and timings are not representative.
        """
        print(_world().status())

    @line_magic
    @_usage
    def dist_stop(self, line):
        """Stop the world: every engine and the controller end (nothing stays behind).

        Example::

            In [6]: %dist_stop
            world of 2 ranks stopped
        """
        from commlab.engine import stop_world

        _world()  # no world: the usage error saying how to start one
        print(f"world of {stop_world()} ranks stopped")

    @line_magic
    @_usage
    def dist_restart(self, line):
        """Stop the world and start a fresh one with the same -n, --backend, --devices
        (after a rank died, or to start clean; every rank's variables are lost).

        Example::

            In [7]: %dist_restart
            world of 4 ranks started (backend cpu) in 7.0 s
        """
        from commlab.engine import restart_world

        t0 = time.monotonic()
        with Progress("restarting the world") as p:
            w = restart_world(progress=p.step)
        _started(w, t0)

    @magic_arguments()
    @argument("n", metavar="N", help="the new number of ranks, or +K to admit K new ranks "
                                     "into the running world in place")
    @argument("--state", default=None, metavar="NAMES",
              help="with +K: rank 0's variables handed to the newcomers (comma-separated; "
                   "default: its commlab.elastic.State variables)")
    @argument("--timeout", type=float, default=120.0, metavar="S",
              help="with +K: seconds the newcomers may take to be admitted")
    @line_magic
    @_usage
    def dist_resize(self, line):
        """Grow or shrink the world to N ranks, or grow it in place by +K.

        ``N``: every surviving rank closes its communicator (``commlab.finalize()``) and
        joins a new one with the new size, keeping its variables; growing starts new
        engines (fresh namespaces); shrinking ends the highest ranks. Symmetric tensors
        from before are gone (the heap is rebuilt).

        ``+K``: K new engines join the running world (``commlab.init(join=True)`` there,
        ``commlab.grow(K)`` on the members): nothing is rebuilt, symmetric tensors keep
        their contents, and rank 0's registered state (``--state`` names, default its
        ``commlab.elastic.State`` variables) reaches the newcomers over commlab's own
        broadcast. ``rank``, ``world_size``, ``comm`` are updated either way.

        Example::

            In [8]: %dist_resize 3
            world resized from 2 to 3 ranks in 4.1 s

            In [9]: %dist_resize +1
            world grew from 3 to 4 ranks in place in 3.2 s (generation 1); handed over: state
        """
        args = parse_argstring(self.dist_resize, line)
        w = _world()
        old, t0 = w.size, time.monotonic()
        if args.n.startswith("+"):
            k = _count(args.n[1:], "+K")
            names = [x for x in args.state.split(",") if x] if args.state else None
            with Progress(f"admitting {k} new ranks"):
                handed = w.grow(k, names, args.timeout)
            print(f"world grew from {old} to {w.size} ranks in place in "
                  f"{time.monotonic() - t0:.1f} s (generation {w.generation}); handed over: "
                  f"{', '.join(handed) or 'nothing'}")
            return
        n = _count(args.n, "N")
        with Progress(f"resizing to {n} ranks"):
            w.resize(n)
        print(f"world resized from {old} to {w.size} ranks in {time.monotonic() - t0:.1f} s")

    @magic_arguments()
    @RANKS
    @argument("names", nargs="+", metavar="NAME", help="variables of this notebook")
    @line_magic
    @_usage
    def dist_push(self, line):
        """Copy notebook variables to every rank (or --ranks) under the same names.

        Example::

            In [9]: lr = 0.1
            In [10]: %dist_push lr
            In [11]: %%distributed
                ...: print(lr * rank)
            [rank 0] 0.0
            [rank 1] 0.1
        """
        args = parse_argstring(self.dist_push, line)
        missing = [n for n in args.names if n not in self.shell.user_ns]
        if missing:
            raise UsageError(f"%dist_push: {', '.join(missing)} not defined in this notebook")
        _world().push({n: self.shell.user_ns[n] for n in args.names}, ranks=args.ranks)

    @magic_arguments()
    @RANK
    @argument("name", metavar="NAME", help="a variable defined on the ranks")
    @line_magic
    @_usage
    def dist_pull(self, line):
        """Return a variable from every rank (a list in rank order) or from --rank R.

        Example::

            In [12]: %dist_pull rank
            Out[12]: [0, 1]
            In [13]: y = %dist_pull x --rank 1
        """
        args = parse_argstring(self.dist_pull, line)
        return _world().pull(args.name, rank=args.rank)


def _count(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"%dist_resize: {what} must be a whole number, got {text!r}; e.g. "
                         f"%dist_resize 4 or %dist_resize +1") from None


def _started(w, t0: float) -> None:
    """One line: the new world, and what happened to the one it replaced."""
    old = (f"; the previous world of {w.replaced} ranks was stopped (its variables are "
           f"gone)" if w.replaced else "")
    hosts = len({ri.host for ri in w.ranks})
    on = f" on {hosts} hosts" if hosts > 1 else ""
    print(f"world of {w.size} ranks{on} started (backend {w.backend}) in "
          f"{time.monotonic() - t0:.1f} s{old}")
    if w.ranks and w.ranks[0].shared_gpu:
        print(w.ranks[0].shared_gpu)
