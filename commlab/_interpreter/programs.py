"""The program instances of one interpreted launch, run as a GPU runs them: concurrently.

Triton's interpreter runs a launch's programs one after another, so a program that waits
for a later program of the same launch (fine on a GPU, where they are resident at once)
would spin forever. Here the program loop is ours (``run``, from ``observe``'s launch
wrapper): programs run one after another in the launching thread, as before, until a
wait stays blocked ``blocked_s`` seconds while programs of the launch have not started.
From then on they run as cooperative threads: one at a time holds the baton, and a
blocked wait hands it to a program not started yet, or else to the next parked one.

A checker can ask for a schedule (``configure``): cooperative from the first blocked
poll, the programs started in a random order drawn from a seed, and at each switch
point (``point()``: signals, waits, symmetric-memory accesses) a draw from the same
seed that may hand the baton to another program. One seed, one schedule: the draws
depend only on the launch's own events. With nothing configured a launch costs a few
Python calls more than Triton's own loop; a satisfied wait never reaches this module.
"""

from __future__ import annotations

import inspect
import random
import threading
import time
from collections import deque
from typing import Any

from commlab._interpreter import blocked as _blocked
from commlab._interpreter import fastcall
from commlab.errors import RankLostError

BLOCKED_S = 0.1  # a wait blocked this long, with programs still to start, goes cooperative

_CFG: dict[str, Any] = {"seed": None, "blocked_s": BLOCKED_S, "launch_no": 0}
# observers (``observe`` sets them): program(idx) before a program starts; switch(event,
# idx) with "out" when a program hands the baton on and "in" when it gets it back
OBSERVERS: dict[str, Any] = {"program": None, "switch": None}
_CUR: list = [None]  # the running launch's _Schedule


class _Abort(BaseException):
    """Unwinds a parked program once another program of its launch failed."""


def configure(seed: int | None = None, blocked_s: float = BLOCKED_S) -> None:
    """``seed``: shuffle every launch from now on (None: the plain order); ``blocked_s``:
    how long a wait blocks before the launch goes cooperative."""
    _CFG.update(seed=seed, blocked_s=blocked_s, launch_no=0)


def configured() -> bool:
    """Whether a schedule is configured (launches are shuffled from a seed)."""
    return _CFG["seed"] is not None


def blocked(key=None) -> bool:
    """A wait's poll failed (``key``: what it waits for, e.g. (address, value), or None).
    May run other programs meanwhile; True if the caller should re-poll at once (others
    made progress) instead of sleeping."""
    s = _CUR[0]
    if s is None or (not s.pending and not s.parked):
        return False
    return s.blocked(key)


def current():
    """The running program's id (an int on a 1-D grid, else [x, y, z]), or None."""
    r = getattr(_LOCAL, "runner", None)
    idx = r.idx if r is not None else None
    if idx is None:
        return None
    return idx[0] if idx[1] == 0 and idx[2] == 0 else list(idx)


def point() -> None:
    """A switch point (a signal, a wait, a symmetric access): under a schedule, a seeded
    draw may hand the baton to another program of the launch."""
    s = _CUR[0]
    if s is not None and s.rng is not None:
        s.point()


def run(ex, call, args, kwargs):
    """Run GridExecutor ``ex`` through its stock ``call`` with our program loop: the
    stock loop sees a grid of one program, which is ours and runs the real grid."""
    real_fn, real_grid = ex.fn, ex.grid
    box: dict = {}

    def one(a):
        g = tuple(real_grid(a) if callable(real_grid) else real_grid)
        box["grid"] = g + (1,) * (3 - len(g))
        return (1, 1, 1)

    ex.fn, ex.grid = _Programs(real_fn, box), one
    try:
        return call(ex, *args, **kwargs)
    except Exception as e:
        # the interpreter wraps what a program raised, once per nested call: a lost peer
        # (the liveness watch) is raised as itself, so survivors can catch RankLostError
        root: BaseException = e
        while root.__cause__ is not None:
            root = root.__cause__
        if isinstance(root, RankLostError) and root is not e:
            raise root from None
        raise
    finally:
        ex.fn, ex.grid = real_fn, real_grid


class _Programs:
    """Stands in for the kernel in the stock loop (its signature and globals are the
    kernel's): called once, it runs every program of the real grid."""

    def __init__(self, fn, box):
        sig = getattr(fn, "_commlab_sig", None)
        if sig is None:
            sig = fn._commlab_sig = inspect.signature(fn)
        self.__signature__, self.__globals__ = sig, fn.__globals__
        self.__name__ = self.__qualname__ = fn.__name__
        self.fn, self.box = fn, box

    def __call__(self, **args):
        from triton.runtime.interpreter import interpreter_builder as b

        gx, gy, gz = self.box["grid"]
        b.set_grid_dim(gx, gy, gz)
        order = [(x, y, z) for x in range(gx) for y in range(gy) for z in range(gz)]
        rng = None
        if _CFG["seed"] is not None:
            _CFG["launch_no"] += 1
            rng = random.Random(f"{_CFG['seed']}:{_CFG['launch_no']}")
            rng.shuffle(order)
        sched = _Schedule(self.fn, args, order, rng, b)
        saved, _CUR[0] = _CUR[0], sched
        try:
            sched.run()
        finally:
            _CUR[0] = saved


class _Runner:
    """One thread that runs programs; it runs only while it holds the baton."""

    def __init__(self, main: bool):
        # the launching thread's is made when it first parks (most launches never do)
        self.sem: threading.Semaphore | None = None if main else threading.Semaphore(0)
        self.main, self.idx = main, None
        self.since, self.last, self.key = 0.0, 0.0, None  # the current wait


class _Schedule:
    def __init__(self, fn, args, order, rng, builder):
        self.fn, self.args, self.rng, self.b = fn, args, rng, builder
        self.pending = deque(order)
        self.parked: list[_Runner] = []  # runners waiting for the baton, in turn order
        self.live = 0  # runners started and not yet ended, main included
        self.error: BaseException | None = None
        self.progress = 0  # bumps whenever a program starts, ends or a new wait begins
        self.blocked_s = 0.0 if rng is not None else _CFG["blocked_s"]

    # -- the launching thread ---------------------------------------------------------
    def run(self) -> None:
        main = _Runner(True)
        saved, _LOCAL.runner = getattr(_LOCAL, "runner", None), main
        self.live = 1
        try:
            self._work(main)
            while self.live > 1:  # the others still run: hand on the baton until they end
                self._switch(main, self.parked.pop(0), park=True, finishing=True)
        finally:
            _LOCAL.runner = saved
        if self.error is not None:
            raise self.error

    def _work(self, me: _Runner) -> None:
        prog = OBSERVERS["program"]
        while self.pending and self.error is None:
            idx = self.pending.popleft()
            me.idx = idx
            self.b.set_grid_idx(*idx)
            self.progress += 1
            if prog is not None:
                prog(idx)
            try:
                self.fn(**self.args)
            except _Abort:
                break
            except BaseException as e:  # noqa: BLE001 - re-raised by the launching thread
                self.error = e
                break
            finally:
                _blocked.forget()
            self.progress += 1
        me.idx = None

    # -- switching --------------------------------------------------------------------
    def _switch(self, me: _Runner, to: _Runner, park: bool, finishing: bool = False) -> None:
        """Hand the baton to ``to``; with ``park``, wait (in turn) to get it back."""
        sw = OBSERVERS["switch"]
        if sw is not None and me.idx is not None:
            sw("out", me.idx)
        if park:
            if me.sem is None:  # made before anyone can release it
                me.sem = threading.Semaphore(0)
            self.parked.append(me)
        assert to.sem is not None  # only a parked runner or a new one is handed the baton
        to.sem.release()
        if not park:
            return
        while True:
            try:
                me.sem.acquire()  # type: ignore[union-attr]  # made above
                break
            except KeyboardInterrupt as e:  # the launching thread: stop the others at
                if self.error is None:  # their next switch point, then re-raise
                    self.error = e
        if me.idx is not None:
            self.b.grid_idx = me.idx
            if sw is not None:
                sw("in", me.idx)
        if self.error is not None and not me.main:
            raise _Abort()
        if self.error is not None and me.main and not finishing:
            raise _Abort()

    def _next(self) -> _Runner:
        """Whom to hand the baton to: a new program's runner first (the wait may be for
        it), else a parked one (in turn, or drawn under a schedule)."""
        if self.pending and self.error is None:
            return self._spawn()
        if self.rng is not None and len(self.parked) > 1:
            return self.parked.pop(self.rng.randrange(len(self.parked)))
        return self.parked.pop(0)

    def _spawn(self) -> _Runner:
        r = _Runner(False)
        self.live += 1
        state = fastcall.launch_state()  # the spawning thread's: the launch's

        def body():
            assert r.sem is not None
            r.sem.acquire()
            _LOCAL.runner = r
            fastcall.adopt(state)
            try:
                if self.error is None:
                    self._work(r)
            finally:
                self.live -= 1
                nxt = self.parked.pop(0)  # main is parked while any other lives
                assert nxt.sem is not None
                nxt.sem.release()

        threading.Thread(target=body, name="commlab-program", daemon=True).start()
        return r

    def blocked(self, key) -> bool:
        me = _LOCAL.runner
        now = time.monotonic()
        if key != me.key or (key is None and now - me.last > 0.05):  # a new wait
            me.key = key
            me.since = now
            self.progress += 1
        me.last = now
        if now - me.since < self.blocked_s:
            return False
        seen = self.progress
        self._switch(me, self._next(), park=True)
        return self.progress != seen

    def point(self) -> None:
        if self.error is not None:
            raise _Abort()
        if not (self.pending or self.parked) or self.rng.random() < 0.5:
            return
        me = _LOCAL.runner
        self.progress += 1
        self._switch(me, self._next(), park=True)


_LOCAL = threading.local()
