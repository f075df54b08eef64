"""``%dist_watch``: a live view of the world's collectives while cells run.

    In [1]: %dist_start -n 4
    In [2]: %dist_watch               # shows the view; it keeps updating
    In [3]: %%distributed
       ...: for step in range(100): train_step()
    In [4]: %dist_watch stop

A background thread in the notebook asks rank 0's engine agent (the connection that
answers while a cell runs: ``World.call_records``) for the call records collected since
its last pull, every ``--interval`` seconds; rank 0's records carry every rank's entry
and end. The view (``commlab.widgets.DistWatchView``) shows the comm/compute ratio per
rank, how late each rank arrives and which one came last, and the bus bandwidth per
algorithm. ``%dist_watch stop`` ends the thread; stopping the world ends it too.
"""

from __future__ import annotations

import threading

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ._args import seconds, usage_errors

_ACTIVE: list = []  # the running Watcher (at most one)


class Watcher:
    """The pulling thread of one view; ``stop()`` ends it within one interval."""

    def __init__(self, world, view, interval: float):
        self.world, self.view, self.interval = world, view, interval
        self.pulls = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="commlab-dist-watch")

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def pull(self) -> int:
        """One pull from rank 0: the new calls it added to the view."""
        model = self.view.model
        reply = self.world.call_records(model.seen, limit=model.window)
        new = model.add(reply)
        self.pulls += 1
        if new or reply.get("off") or reply.get("error"):
            self.view.update()
        return new

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.world.closed or self.world.broken:
                break
            try:
                self.pull()
            except Exception as e:  # a view must never take the notebook down
                self.errors.append(f"{type(e).__name__}: {e}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def stop() -> bool:
    """End the running view's updates; whether one was running."""
    was = bool(_ACTIVE)
    while _ACTIVE:
        _ACTIVE.pop().stop()
    return was


@magics_class
class WatchMagics(Magics):
    @magic_arguments()
    @argument("action", nargs="?", default="start", choices=["start", "stop"],
              help="stop: end the live updates of the view shown last")
    @argument("--interval", type=seconds, default=1.0, metavar="S",
              help="seconds between pulls from rank 0 (default 1)")
    @argument("--window", type=int, default=200, metavar="N",
              help="the last N calls make the ratios, arrivals and medians (default 200)")
    @argument("--idle", type=seconds, default=1.0, metavar="S",
              help="a gap between calls longer than S seconds is the notebook idling, "
                   "not compute (default 1)")
    @line_magic
    @usage_errors
    def dist_watch(self, line):
        """Show the world's comm/compute ratio per rank, the late rank from the kernels'
        arrival records, and the bus bandwidth per algorithm, updated while cells run.

        Example::

            In [5]: %dist_watch --interval 0.5
            In [6]: %%distributed
               ...: for _ in range(50):
               ...:     if rank == 1: time.sleep(0.02)
               ...:     commlab.all_reduce(x)
            (the view: "arrivals: rank 1 arrived last in 100% of all_reduce calls, 20 ms
             late on average", the ratios and GB/s plotted)
            In [7]: %dist_watch stop
            dist_watch stopped
        """
        args = parse_argstring(self.dist_watch, line)
        if args.action == "stop":
            print("dist_watch stopped" if stop() else "dist_watch: no view was running")
            return None
        if args.window < 2:
            raise UsageError(f"--window must be at least 2 calls, got {args.window}")
        from commlab.engine import current_world
        from commlab.widgets import DistWatchModel, DistWatchView

        world = current_world()  # no world: the usage error saying how to start one
        stop()
        view = DistWatchView(DistWatchModel(window=args.window, idle_s=args.idle))
        watcher = Watcher(world, view, args.interval)
        first = world.call_records(0, limit=1)  # from now on: the calls made after this
        view.model.seen = int(first.get("seen", 0))
        view.model.note = str(first.get("off") or first.get("error") or "")
        view.update()
        view.watcher = watcher
        _ACTIVE.append(watcher.start())
        return view


def register(ipython) -> None:
    """Register %dist_watch (called by ``%load_ext commlab``)."""
    ipython.register_magics(WatchMagics)
