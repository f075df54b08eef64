"""The world magics: %dist_start, %%distributed, %dist_status, %dist_stop, %dist_restart,
%dist_resize, %dist_push, %dist_pull. See each magic's docstring (``%dist_start?``)."""

from __future__ import annotations

import functools
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from commlab.errors import CommlabUsageError
from commlab.magics._args import GRACE, RANK, RANKS, TIMEOUT, rank_list


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


@magics_class
class DistMagics(Magics):
    """%dist_start and friends: a world of ranks, one ipyparallel engine each."""

    _last: dict | None = None  # arguments of the last %dist_start, for %dist_restart

    @magic_arguments()
    @argument("-n", type=int, required=True, metavar="N", help="number of ranks")
    @argument("--backend", choices=["auto", "cpu", "cuda"], default="auto",
              help="cpu: Triton's interpreter, ranks share memory; cuda: one GPU per rank; "
                   "auto: cuda when every rank has a GPU")
    @argument("--devices", type=rank_list, default=None, metavar="0,1",
              help="GPU index for each rank, in rank order (default: rank r uses GPU r)")
    @line_magic
    @_usage
    def dist_start(self, line):
        """Start a world of N ranks: fresh processes (ipyparallel engines), each with
        ``commlab.init()`` done and ``commlab, torch, triton, tl, cl, comm, rank,
        world_size`` defined. A running world is stopped first.

        Example::

            In [1]: %load_ext commlab
            In [2]: %dist_start -n 4 --backend cpu
            world of 4 ranks started (backend cpu) in 7.2 s
            In [3]: %%distributed
               ...: x = torch.full((3,), float(rank))
               ...: print(commlab.all_reduce(x))
            [ranks 0-3] tensor([6., 6., 6.])

        Engines run on this machine through ipyparallel's local launcher; its MPI, Slurm
        and SSH launchers are the way to go beyond one machine.
        """
        args = parse_argstring(self.dist_start, line)
        self._start(n=args.n, backend=args.backend, devices=args.devices)

    def _start(self, **kw):
        from commlab.engine import start_world

        t0 = time.monotonic()
        print(f"starting {kw['n']} ranks ...", flush=True)
        w = start_world(**kw)
        DistMagics._last = kw
        print(f"world of {w.size} ranks started (backend {w.backend}) in "
              f"{time.monotonic() - t0:.1f} s")

    @magic_arguments()
    @RANKS
    @TIMEOUT
    @GRACE
    @argument("--trace", action="store_true",
              help="record commlab.trace spans on every rank and show the timeline")
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
        args = parse_argstring(self.distributed, line)
        _world().run_cell(cell, ranks=args.ranks, timeout=args.timeout, grace=args.grace,
                          trace=args.trace)

    @line_magic
    @_usage
    def dist_status(self, line):
        """Show the world: each rank's engine, pid, device, and whether it is alive.

        Example::

            In [5]: %dist_status
            world of 2 ranks, backend cpu
              rank 0: engine 0, pid 4242, cpu, alive, 412 MiB
              rank 1: engine 1, pid 4243, cpu, alive, 409 MiB
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
        w = _world()
        n = w.size
        w.stop()
        print(f"world of {n} ranks stopped")

    @line_magic
    @_usage
    def dist_restart(self, line):
        """Stop the world and start a fresh one with the same -n, --backend, --devices
        (after a rank died, or to start clean; every rank's variables are lost).

        Example::

            In [7]: %dist_restart
            world of 4 ranks started (backend cpu) in 7.0 s
        """
        if DistMagics._last is None:
            raise UsageError("no world was started here: run %dist_start -n N first")
        from commlab.engine import _world as wmod

        last = dict(DistMagics._last)
        if wmod._CURRENT is not None:
            last["n"] = wmod._CURRENT.size or last["n"]
            wmod._CURRENT.stop()
        self._start(**last)

    @magic_arguments()
    @argument("n", type=int, metavar="N", help="the new number of ranks")
    @line_magic
    @_usage
    def dist_resize(self, line):
        """Grow or shrink the world to N ranks without restarting the notebook kernel.

        Every surviving rank closes its communicator (``commlab.finalize()``) and joins a
        new one with the new size, keeping its variables; growing starts new engines
        (fresh namespaces); shrinking ends the highest ranks. Symmetric tensors from
        before are gone (the heap is rebuilt); ``rank``, ``world_size``, ``comm`` are
        updated.

        Example::

            In [8]: %dist_resize 3
            world resized from 2 to 3 ranks in 4.1 s
        """
        args = parse_argstring(self.dist_resize, line)
        w = _world()
        old, t0 = w.size, time.monotonic()
        w.resize(args.n)
        if DistMagics._last is not None:
            DistMagics._last["n"] = w.size
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
        w = _world()
        w.check_usable()
        eids = [ri.eid for ri in w.targets(args.ranks)]
        w.client.direct_view(eids).push({n: self.shell.user_ns[n] for n in args.names},
                                        block=True)

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
        w = _world()
        w.check_usable()
        infos = w.targets(None if args.rank is None else [args.rank])
        from commlab.engine import _worker
        from commlab.engine._wait import wait_all

        vals = wait_all(w, [w.client[ri.eid].apply_async(_worker.pull, args.name)
                            for ri in infos], what=f"pulling {args.name}", limit=120)
        return vals[0] if args.rank is not None else vals
