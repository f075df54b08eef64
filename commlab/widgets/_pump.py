"""One pump for every live widget update: updates are queued under a key, the latest
per key wins, and a single background thread applies them at most ``max_rate`` times a
second (default 10), each batch inside the figures' ``batch_update`` where given.

Notebook front ends fall behind when a figure is redrawn for every sample; batching
keeps them interactive while a collective streams data."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable


class Pump:
    def __init__(self, max_rate: float = 10.0):
        self.interval = 1.0 / max_rate
        self._pending: dict[object, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._last = 0.0
        self.flushes = 0  # batches applied (for tests and diagnostics)
        self.errors: list[str] = []

    def submit(self, key, fn: Callable[[], None]) -> None:
        """Queue ``fn`` under ``key`` (replacing an older update with the same key)."""
        with self._lock:
            self._pending[key] = fn
            if self._thread is None or not self._thread.is_alive():
                self._stop = False
                self._thread = threading.Thread(target=self._run, name="commlab-widget-pump",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self) -> int:
        """Apply what is queued now, in this thread; return how many updates ran."""
        with self._lock:
            batch, self._pending = self._pending, {}
        for fn in batch.values():
            try:
                fn()
            except Exception:  # one broken view must not stop the others' updates
                self.errors.append(traceback.format_exc())
        if batch:
            self.flushes += 1
            self._last = time.monotonic()
        return len(batch)

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.flush()
            with self._lock:
                if not self._pending and self._stop:
                    break

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


PUMP = Pump()
