"""Waiting for a cell on every rank: live output, debugger prompts, Ctrl-C, hangs, deaths.

The loop runs on the notebook's main thread. Each turn it shows new output, answers
debugger prompts through ``ask`` (the notebook's ``input()``), checks that the ranks'
processes are alive, and watches per-rank completion: when some ranks have finished
and others stay blocked inside a commlab collective for ``grace`` seconds (or the cell's
``--timeout`` passes), it reports each blocked rank's stack, interrupts them and
recovers the world. Ctrl-C in the notebook is forwarded to every running rank.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from commlab import _config
from commlab.engine import _worker
from commlab.engine._output import OutputMerger
from commlab.engine._report import (
    DistributedError,
    HangError,
    RankDiedError,
    describe_stack,
    ranks_str,
    strip_ansi,
)
from commlab.errors import exit_text
from commlab.racecheck import wait_graph, wait_graph_text

GRACE_S = _config.get("COMMLAB_HANG_GRACE")  # %%distributed --grace overrides
INTERRUPT_WAIT_S = 5.0  # how long an interrupted rank may take before it is restarted


def ask(prompt: str) -> str:
    """Ask the notebook user for a line (Jupyter turns ``input`` into a stdin request).
    Tests replace this function to script a debugger session."""
    return input(prompt)


class CellRun:
    def __init__(self, world, ar, infos, *, timeout=None, grace=None, code: str = ""):
        self.world, self.ar, self.infos = world, ar, infos
        ar.owner = False  # keep the outputs in client.metadata until we have shown them
        self.msg = {ri.rank: mid for ri, mid in zip(infos, ar.msg_ids, strict=True)}
        # ipyparallel drops client.metadata[msg_id] once a message is done: keep our own
        # references to the (live-updated) metadata and futures of each rank
        self.md = {ri.rank: md for ri, md in zip(infos, ar._metadata, strict=True)}
        self.fut = {ri.rank: f for ri, f in zip(infos, ar._children, strict=True)}
        self.pid = {ri.rank: ri.pid for ri in infos}
        self.info = {ri.rank: ri for ri in infos}
        self.timeout = timeout
        self.grace = GRACE_S if grace is None else grace
        self.cell_lines = code.splitlines() if code else None
        self.out = OutputMerger(self.md)
        self.quit_rank: int | None = None
        self.quit_done = False
        self.last_alive_check = 0.0
        self.first_done: float | None = None
        self.paused = 0.0  # seconds spent in the debugger (not counted by --timeout)
        # the progress line (commlab.widgets.Progress) while finished ranks wait for others
        self.wait_line: Any = None
        self.wait_kind = ""  # what the line counts toward: "timeout" or "grace"

    def running(self) -> set[int]:
        return {r for r, f in self.fut.items() if not f.done()}

    # -- the loop ---------------------------------------------------------------------------
    def wait(self):
        self.start = self.last_alive_check = time.monotonic()  # quick cells skip the check
        try:
            while not self.ar.ready():
                self._turn()
        except KeyboardInterrupt:
            self._interrupted()
        finally:
            self._end_wait_line()
            if self.ar.ready():
                self.ar.wait_for_output(5)
            self.out.pump(set(), final=True)
        return self._finish()

    def _show_wait_line(self, running: set[int]) -> None:
        """Say what the cell waits for (after ~2 s, ticking, counting toward the limit)
        until the ranks finish or the hang report comes: while every rank runs, the
        seconds toward ``--timeout``; once some finished, toward ``grace``."""
        from commlab.widgets import Progress

        kind = "grace" if len(running) < len(self.msg) else "timeout"
        if self.wait_line is not None:
            if self.wait_kind == kind:
                return
            self._end_wait_line()
        self.wait_kind = kind
        if kind == "timeout":
            what = ("stacks reported at the --timeout" if self.timeout is not None else
                    "Ctrl-C interrupts them; with --timeout S their stacks are reported")
            line = Progress(f"{ranks_str(sorted(running))} running; {what}",
                            limit=self.timeout, since=self.start + self.paused)
        else:
            done = sorted(set(self.msg) - running)
            line = Progress(f"{ranks_str(done)} finished; waiting for "
                            f"{ranks_str(sorted(running))} (stacks reported if blocked in a "
                            f"collective for {self.grace:g} s)", limit=self.grace,
                            since=self.first_done)
        self.wait_line = line.__enter__()

    def _end_wait_line(self) -> None:
        if self.wait_line is not None:
            self.wait_line.__exit__(None, None, None)
            self.wait_line = None

    def _turn(self) -> None:
        self.ar.wait(0.02)
        running = self.running()
        self.out.pump(running)
        self._debugger()
        if self.quit_rank is not None and not self.quit_done:
            self._stop_after_quit(running)
        now = time.monotonic()
        if now - self.last_alive_check > 0.25:
            self.last_alive_check = now
            self._check_alive(running)
        if self.ar.ready():
            return
        self._check_hang(running, now)

    def _debugger(self) -> None:
        relay = self.world.relay
        while not relay.events.empty():
            kind, rank, payload = relay.events.get()
            t0 = time.monotonic()
            if kind == "out":
                for line in payload.rstrip("\n").splitlines():
                    sys.stdout.write(f"[rank {rank}] {line}\n")
                sys.stdout.flush()
            elif kind == "prompt":
                # the other ranks' output so far first: they are running, not stuck
                self.out.pump(self.running(), final=True)
                relay.answer(rank, self._ask_while_showing(rank, f"[rank {rank}] {payload}"))
            elif kind == "end" and payload:
                self.quit_rank = rank
            self.paused += time.monotonic() - t0
            self.first_done = None  # a rank in the debugger is not hung
            self._end_wait_line()

    def _ask_while_showing(self, rank: int, prompt: str) -> str:
        """``ask`` the user; while the prompt waits, a thread goes on showing the other
        ranks' output as it comes (the main thread is blocked in ``input``). Their lines
        do not wait for ``rank``'s: it prints through Pdb meanwhile."""
        stop = threading.Event()

        def show() -> None:
            while not stop.wait(0.2):
                self.out.pump(self.running() - {rank})

        t = threading.Thread(target=show, daemon=True, name="commlab-pdb-output")
        t.start()
        try:
            return ask(prompt)
        finally:
            stop.set()
            t.join()

    def _stop_after_quit(self, running: set[int]) -> None:
        """The user quit Pdb on one rank: end the cell on the others too, then recover."""
        self.quit_done = True
        assert self.quit_rank is not None  # called only once a rank quit (see poll)
        self._settle([self.quit_rank], 2.0)
        others = sorted(self.running())
        if others:
            sys.stderr.write(f"[rank {self.quit_rank}] debugger quit: stopping the cell on "
                             f"{ranks_str(others)}\n")
            self._recover(others)

    def _check_alive(self, running: set[int]) -> None:
        dead = [r for r in sorted(running) if not self.world.rank_alive(self.info[r])]
        if not dead:
            return
        if getattr(self.world, "elastic", False):
            self._continue_without(dead)
        why = self._why(dead)
        self.world.broken = f"{ranks_str(dead)} died while running a cell"
        others = sorted(running - set(dead))
        self.world.signal(others, signal.SIGINT)
        self._settle(others, INTERRUPT_WAIT_S)
        self.out.pump(set(), final=True)
        raise RankDiedError(
            f"{why}; the other ranks were interrupted. The world is unusable: run "
            f"%dist_restart (a segfault or an out-of-memory kill ends a rank this way)")

    def _why(self, dead: list[int]) -> str:
        time.sleep(0.2)  # let the launcher reap them: exit codes
        codes = [self.world.exit_code(self.pid[r]) if self.world.here(self.info[r]) else None
                 for r in dead]
        why = ", ".join(f"rank {r} ({exit_text(c)})" for r, c in zip(dead, codes, strict=True))
        return (f"{why} died while running the cell "
                f"(pid {', '.join(str(self.pid[r]) for r in dead)})")

    def _continue_without(self, dead: list[int]) -> None:
        """The survivors' cells run to their end: a collective raises RankLostError within
        COMMLAB_PEER_TIMEOUT, a cell that catches it and shrinks goes on; ranks that die
        meanwhile join ``dead``; Ctrl-C is forwarded to the survivors. Then every survivor
        shrinks (``World.continue_without``) and the cell's error names the dead."""
        why, gone, checked = self._why(dead), set(dead), time.monotonic()
        try:
            while self.running() - gone:
                self.ar.wait(0.05)
                self.out.pump(self.running() - gone)
                self._debugger()
                if time.monotonic() - checked > 0.25:
                    checked = time.monotonic()
                    more = [r for r in sorted(self.running() - gone)
                            if not self.world.rank_alive(self.info[r])]
                    if more:
                        why += f"; then {self._why(more)}"
                        gone |= set(more)
        except KeyboardInterrupt:
            left = sorted(self.running() - gone)
            sys.stderr.write(f"Ctrl-C forwarded to {ranks_str(left)}\n")
            self.world.signal(left, signal.SIGINT)
            if self._settle(left, INTERRUPT_WAIT_S):
                self.world.kill(sorted(self.running() - gone))
                self.world.broken = f"{ranks_str(left)} did not respond to an interrupt"
                raise RankDiedError(f"{why}; {ranks_str(left)} did not stop after Ctrl-C "
                                    f"and were ended: run %dist_restart") from None
        self.out.pump(set(), final=True)
        survivors = sorted(set(self.msg) - gone)
        lost = [r for r in survivors if self._lost_here(r)]
        note = f" {ranks_str(lost)} raised RankLostError in the cell." if lost else ""
        raise RankDiedError(f"{why}.{note} " + self.world.continue_without(sorted(gone)))

    def _lost_here(self, r: int) -> bool:
        f = self.fut[r]
        val = (f.exception() or self.md[r].get("error")) if f.done() else None
        return val is not None and "RankLostError" in getattr(val, "ename", type(val).__name__)

    def _check_hang(self, running: set[int], now: float) -> None:
        if self.world.relay.active:
            self.first_done = None
            return
        over = self.timeout is not None and now - self.start - self.paused > self.timeout
        if running and len(running) < len(self.msg) and self.first_done is None:
            self.first_done = now
        if running:
            self._show_wait_line(running)
        late = self.first_done is not None and now - self.first_done > self.grace
        if not (over or late):
            return
        stacks, waits = self.world.dump_stacks(sorted(running))
        nodes = [n for r in sorted(waits) for n in waits[r]]
        graph = wait_graph_text(nodes, len(self.world.ranks))
        parts, whole, in_commlab = [], [], bool(graph)
        for r in sorted(running):
            text, inside = describe_stack(r, stacks.get(r, ""), self.cell_lines)
            parts.append(text)
            whole.append(describe_stack(r, stacks.get(r, ""), self.cell_lines, full=True)[0])
            in_commlab |= inside
        if late and not over and not in_commlab:
            self.first_done = now  # busy computing, not blocked in a collective: keep waiting
            return
        done = sorted(set(self.msg) - running)
        head = (f"--timeout {self.timeout:g} s passed" if over else
                f"{ranks_str(done)} finished but {ranks_str(sorted(running))} stayed blocked "
                f"for more than {self.grace:g} s")
        report = [f"Hang: {head}.", *parts, *([graph] if graph else [])]
        if done:
            report.append(f"{ranks_str(done)} had finished the cell: a collective called on "
                          f"only some ranks (e.g. under `if rank == 0:`) waits for the others "
                          f"forever; call it on every rank.")
        self._end_wait_line()
        report.append(self._recover(sorted(running)))
        self.out.pump(set(), final=True)
        full = [report[0], *whole, *report[1 + len(parts):]]
        err = HangError("\n".join(report), self._failures(ignore=set(running)),
                        full_report="\n".join(full))
        # for commlab.widgets.WaitGraphView: the same graph the report's text names
        err.wait_graph = wait_graph(nodes, len(self.world.ranks)) if nodes else None
        raise err

    # -- recovery -------------------------------------------------------------------------
    def _settle(self, ranks: list[int], limit: float) -> list[int]:
        """Wait up to ``limit`` s for ``ranks`` to finish; return those still running."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            self.ar.wait(0.05)
            self.out.pump(self.running())
            left = [r for r in ranks if r in self.running()]
            if not left:
                return []
        return [r for r in ranks if r in self.running()]

    def _recover(self, blocked: list[int]) -> str:
        """Interrupt ``blocked``; restart those that do not stop; recover the world."""
        self.world.signal(blocked, signal.SIGINT)
        stuck = self._settle(blocked, INTERRUPT_WAIT_S)
        if stuck and not self.world.can_replace:
            self.world.kill(stuck)
            self.world.broken = f"{ranks_str(stuck)} did not respond to an interrupt"
            return (f"{ranks_str(blocked)} interrupted; {ranks_str(stuck)} did not respond "
                    f"(blocked outside Python) and {'was' if len(stuck) == 1 else 'were'} "
                    f"ended: a world on --launcher {self.world.plan.launcher} cannot start "
                    f"one rank again alone; run %dist_restart.")
        if stuck:
            self.world.replace(stuck)
            return (f"{ranks_str(blocked)} interrupted; {ranks_str(stuck)} did not respond "
                    f"(blocked outside Python, e.g. in a device kernel) and "
                    f"{'was' if len(stuck) == 1 else 'were'} restarted: their variables are "
                    f"gone, every rank joined a fresh communicator.")
        wait_all(self.world, [self.world.client[ri.eid].apply_async(_worker.recover)
                              for ri in self.world.ranks], what="recovering", limit=60)
        return (f"{ranks_str(blocked)} interrupted; the world recovered "
                f"(comm.recover() on every rank): the next cell can run collectives.")

    def _interrupted(self) -> None:
        running = sorted(self.running())
        sys.stderr.write(f"Ctrl-C forwarded to {ranks_str(running)}\n" if running else "")
        note = self._recover(running) if running else ""
        self.out.pump(set(), final=True)
        raise KeyboardInterrupt(f"cell interrupted on {ranks_str(running)}. {note}".strip())

    # -- results --------------------------------------------------------------------------
    def _failures(self, ignore=frozenset()) -> DistributedError | None:
        failures = {}
        for r, f in self.fut.items():
            if r in ignore or not f.done():
                continue
            val = f.exception() or self.md[r].get("error")
            if val is None:
                continue
            ename = getattr(val, "ename", type(val).__name__)
            evalue = getattr(val, "evalue", str(val))
            tb = getattr(val, "traceback", "") or ""
            failures[r] = (ename, evalue, tb if isinstance(tb, str) else "\n".join(tb))
        return DistributedError(failures, self.world.size) if failures else None

    def _finish(self):
        failures = self._failures()
        if self.quit_rank is not None:
            # the user quit Pdb on one rank: stop the cell everywhere, without a traceback
            print(f"[rank {self.quit_rank}] debugger quit: the cell stopped on every rank")
            return None
        if failures is not None:
            self.out.results()
            raise failures
        self.out.results()
        res = self.ar.get()
        return res if isinstance(res, list) else [res]




def wait_all(world, ars, what: str, limit: float) -> list:
    """Results of several single-engine calls (rank order), with grouped errors."""
    deadline = time.monotonic() + limit
    for ar in ars:
        left = deadline - time.monotonic()
        if not ar.wait(max(left, 0)):
            running = [i for i, a in enumerate(ars) if not a.ready()]
            raise HangError(f"{ranks_str(running)} did not finish {what} within {limit:g} s")
    failures = {}
    out = []
    for r, ar in enumerate(ars):
        try:
            out.append(ar.get())
        except Exception as e:
            tb = getattr(e, "traceback", "") or str(e)
            failures[r] = (getattr(e, "ename", type(e).__name__), getattr(e, "evalue", str(e)),
                           strip_ansi(tb) if isinstance(tb, str) else str(tb))
    if failures:
        raise DistributedError(failures, len(ars), extra=f"(while {what})")
    return out
