"""Progress for long work (magics, a hang wait), shown only after ~2 s, ticking every half
second so a slow step still shows time passing, gone when done: in a notebook one
updating output line (a display handle, emptied at the end: a closed tqdm widget stays
drawn in JupyterLab), in a terminal tqdm's bar.

    with Progress("starting 4 ranks", total=6) as p:
        start_world(4, progress=p.step)     # step(done, total, what)
"""

from __future__ import annotations

import threading

DELAY_S = 2.0  # quick work shows no bar at all


class Progress:
    def __init__(self, desc: str, total: int | None = None, unit: str = "step", *,
                 limit: float | None = None, since: float | None = None):
        """``limit``: the line counts toward it ("12 of 30 s"); ``since``: the
        ``time.monotonic()`` the count starts at (default: now)."""
        import time

        self.desc, self.total, self.unit = desc, total, unit
        self.limit = limit
        self.since = time.monotonic() if since is None else since
        self.bar = None
        self._done = 0
        self._what = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._tick, daemon=True,
                                        name="commlab-progress")
        self._thread.start()
        return self

    def step(self, done: int, total: int | None = None, what: str = "") -> None:
        with self._lock:
            self._done, self._what = done, what
            if total is not None:
                self.total = total

    def _tick(self) -> None:
        if self._stop.wait(DELAY_S):
            return
        if _in_kernel():
            self._tick_notebook()
            return
        try:
            import time

            from tqdm import tqdm

            desc = self.desc + (f" (of {self.limit:g} s)" if self.limit is not None else "")
            with self._lock:
                bar = tqdm(total=self.total, desc=desc, unit=self.unit,
                           leave=False, bar_format="{desc}: {n}/{total} {postfix} "
                           "[{elapsed}]" if self.total else None)
                # elapsed counts from ``since`` (tqdm's clock is time.time)
                bar.start_t = time.time() - (time.monotonic() - self.since)
                self.bar = bar
            while not self._stop.wait(0.5):
                self._show()
        except Exception:  # a progress bar must never fail the work it reports on
            self.bar = None

    def _line(self, elapsed: float) -> str:
        with self._lock:
            done, total, what = self._done, self.total, self._what
        frac = f" {done}/{total}" if total else ""
        of = f" of {self.limit:g}" if self.limit is not None else ""
        return f"{self.desc}:{frac}{', ' + what if what else ''} ({elapsed:.0f}{of} s)"

    def _tick_notebook(self) -> None:
        import time

        from IPython.display import display

        t0 = self.since
        try:
            self.handle = display({"text/plain": self._line(time.monotonic() - t0)}, raw=True,
                                  display_id=True)
            while not self._stop.wait(0.5):
                self.handle.update({"text/plain": self._line(time.monotonic() - t0)}, raw=True)
        except Exception:  # a progress line must never fail the work it reports on
            self.handle = None

    def _show(self) -> None:
        with self._lock:
            bar = self.bar
            if bar is None:
                return
            if self.total is not None and bar.total != self.total:
                bar.total = self.total
            bar.n = self._done
            bar.set_postfix_str(self._what, refresh=False)
            bar.refresh()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                handle.update({"text/plain": ""}, raw=True)  # the line goes away
            except Exception:
                pass
        with self._lock:
            if self.bar is not None:
                try:
                    self.bar.close()
                except Exception:
                    pass
                self.bar = None


def _in_kernel() -> bool:
    import sys

    ipython = sys.modules.get("IPython")
    ip = ipython.get_ipython() if ipython is not None else None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"
