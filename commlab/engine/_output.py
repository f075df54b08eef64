"""Live output of a cell, labelled by rank; identical lines from several ranks printed once.

Each rank's stdout/stderr arrives as growing text. Complete lines wait in a per-rank
queue; when every rank has a line ready (or every running rank has and the oldest line
has waited ``SETTLE_S``, or it has waited ``hold`` seconds, or the cell ended) the heads
are taken together and identical ones are printed once: ``[ranks 0-3] loss=0.25``.
Progress bars (``\\r`` updates, e.g. tqdm) show each rank's latest state at most once
a second, and their final state when the line ends.
"""

from __future__ import annotations

import sys
import time
from collections import deque

from commlab.engine._report import ranks_str

SETTLE_S = 0.3  # the window in which identical lines of different ranks are grouped


class _Stream:
    def __init__(self, ranks, write):
        self.write = write
        self.seen = {r: 0 for r in ranks}  # characters consumed from each rank's text
        self.partial = {r: "" for r in ranks}
        self.lines = {r: deque() for r in ranks}  # (text, arrival time)
        self.bar = {r: ("", 0.0) for r in ranks}  # last progress state shown, when

    def feed(self, rank: int, text: str, now: float) -> None:
        new = text[self.seen[rank]:]
        if not new:
            return
        self.seen[rank] = len(text)
        buf = self.partial[rank] + new
        *complete, rest = buf.split("\n")
        for line in complete:
            self.lines[rank].append((line.rsplit("\r", 1)[-1], now))
        self.partial[rank] = rest
        if "\r" in rest:
            state = rest.rstrip("\r").rsplit("\r", 1)[-1]
            shown, when = self.bar[rank]
            if state and state != shown and now - when >= 1.0:
                self.write(f"[rank {rank}] {state}\n")
                self.bar[rank] = (state, now)

    def flush(self, now: float, running: set[int], hold: float, final: bool) -> None:
        while True:
            heads = {r: q[0] for r, q in self.lines.items() if q}
            if not heads:
                break
            oldest = min(t for _, t in heads.values())
            every = len(heads) == len(self.lines)
            # a rank that finished may still have output on the way (ipyparallel delivers
            # the result before the last stream message): wait SETTLE_S for it, so the
            # same lines group the same way whatever the timing
            settled = (all(r in heads or r not in running for r in self.lines)
                       and now - oldest >= SETTLE_S)
            if not (final or every or settled or now - oldest >= hold):
                break
            groups: dict[str, list[int]] = {}
            for r in sorted(heads):
                groups.setdefault(heads[r][0], []).append(r)
                self.lines[r].popleft()
            for text, rs in groups.items():
                self.write(f"[{ranks_str(rs)}] {text}\n")
        if final:
            for r, rest in self.partial.items():
                state = rest.rsplit("\r", 1)[-1] if "\r" in rest else rest
                if state:
                    self.write(f"[rank {r}] {state}\n")
                self.partial[r] = ""


class OutputMerger:
    """Reads ipyparallel's per-message metadata (filled live by the client's io thread)."""

    def __init__(self, metadata: dict, hold: float = 2.0):
        self.metadata = metadata  # rank -> ipyparallel's metadata of that rank's message
        self.hold = hold
        ranks = list(metadata)
        self.out = _Stream(ranks, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        self.err = _Stream(ranks, lambda s: (sys.stderr.write(s), sys.stderr.flush()))
        self.displays = {r: 0 for r in ranks}

    def pump(self, running: set[int], final: bool = False) -> None:
        now = time.monotonic()
        for r, md in self.metadata.items():
            self.out.feed(r, md.get("stdout") or "", now)
            self.err.feed(r, md.get("stderr") or "", now)
            outputs = md.get("outputs") or []
            if len(outputs) > self.displays[r]:
                self.out.flush(now, running, self.hold, final=True)
                for content in outputs[self.displays[r]:]:
                    _publish(content)
                self.displays[r] = len(outputs)
        self.out.flush(now, running, self.hold, final)
        self.err.flush(now, running, self.hold, final)

    def results(self) -> None:
        """Show each rank's ``Out`` value (the cell's last expression), grouped."""
        texts: dict[str, list[int]] = {}
        for r, md in self.metadata.items():
            res = md.get("execute_result")
            if not res:
                continue
            data = res.get("data", {})
            if set(data) - {"text/plain"}:
                _publish(res)
            else:
                texts.setdefault(data.get("text/plain", ""), []).append(r)
        for text, rs in texts.items():
            sep = "\n" if "\n" in text else " "
            sys.stdout.write(f"[{ranks_str(rs)}] Out:{sep}{text}\n")


def _publish(content: dict) -> None:
    try:
        from IPython.display import publish_display_data
    except ImportError:
        sys.stdout.write(content.get("data", {}).get("text/plain", "") + "\n")
        return
    publish_display_data(content.get("data", {}), content.get("metadata", {}))
