"""Turning what the ranks did into one readable report: failures grouped by traceback,
hang reports built from each blocked rank's stack."""

from __future__ import annotations

import re

from commlab.errors import CommlabError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL_FILE = re.compile(r"(ipykernel_\d+/\d+\.py|<ipython-input-[\d-]+>)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def ranks_str(ranks) -> str:
    """[0, 1, 2, 3] -> 'ranks 0-3'; [1, 3] -> 'ranks 1, 3'; [2] -> 'rank 2'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(f"{ranks[i]}-{ranks[j]}" if j - i >= 2 else
                     ", ".join(map(str, ranks[i:j + 1])))
        i = j + 1
    return "ranks " + ", ".join(parts)


def strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)


class DistributedError(CommlabError):
    """A cell (or ``World.apply``) failed on some ranks.

    ``failures`` maps rank -> (exception name, message, traceback text); the message
    groups ranks whose tracebacks are identical: "ZeroDivisionError on ranks 1, 3"."""

    def __init__(self, failures: dict[int, tuple[str, str, str]], world_size: int,
                 extra: str = ""):
        self.failures = failures
        self.world_size = world_size
        self.extra = extra
        self.groups: dict[tuple[str, str], list[int]] = {}
        for r in sorted(failures):
            ename, evalue, tb = failures[r]
            key = (f"{ename}: {evalue}" if evalue else ename, strip_ansi(tb))
            self.groups.setdefault(key, []).append(r)
        heads = [f"{head.split(':')[0]} on {ranks_str(rs)}" for (head, _), rs in
                 self.groups.items()]
        msg = "; ".join(heads)
        first = next(iter(self.groups))[0]
        super().__init__(f"{msg} ({first})" + (f"\n{extra}" if extra else ""))

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of the client-side traceback."""
        lines = []
        for (head, tb), rs in self.groups.items():
            lines.append(f"\x1b[31m--- {head.split(':')[0]} on {ranks_str(rs)} "
                         f"(of {self.world_size}) ---\x1b[0m")
            lines.extend(tb.rstrip("\n").splitlines() or [head])
        if self.extra:
            lines.append(self.extra)
        return lines


class HangError(CommlabError):
    """Some ranks stayed blocked (a collective that not every rank called, a deadlock):
    the report shows each blocked rank's stack and the collective it waits in."""

    def __init__(self, report: str, failures: DistributedError | None = None):
        self.report = report
        self.failures = failures
        super().__init__(report)

    def _render_traceback_(self) -> list[str]:
        lines = self.report.splitlines()
        if self.failures is not None:
            lines += [""] + self.failures._render_traceback_()
        return lines


class RankDiedError(CommlabError):
    """A rank's process ended while it was running a cell."""


def parse_dump(text: str) -> list[list[tuple[str, int, str]]]:
    """faulthandler's all-threads dump -> threads, each a list of (file, line, function)
    frames, most recent call first."""
    threads, cur = [], None
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            cur = []
            threads.append(cur)
        elif cur is not None:
            m = _FRAME.match(line)
            if m:
                cur.append((m["file"], int(m["line"]), m["func"]))
    return threads


def _is_commlab(path: str) -> bool:
    return "/commlab/" in path and "/commlab/engine/" not in path


def _relevant_thread(threads):
    """The thread running the cell: it has a cell frame or a commlab frame."""
    for frames in threads:
        if any(_CELL_FILE.search(f) or _is_commlab(f) for f, _, _ in frames):
            return frames
    return threads[0] if threads else []


def describe_stack(rank: int, dump: str, cell_lines: list[str] | None = None
                   ) -> tuple[str, bool]:
    """One blocked rank's part of a hang report, and whether it waits inside commlab."""
    frames = list(reversed(_relevant_thread(parse_dump(dump))))  # oldest first
    start = next((i for i, (f, _, _) in enumerate(frames) if _CELL_FILE.search(f)), 0)
    frames = frames[start:]
    outer = next(((f, fn) for f, _, fn in frames if _is_commlab(f)), None)
    inner = next(((f, fn) for f, _, fn in reversed(frames) if _is_commlab(f)), None)
    if outer is None:
        where = "not inside a commlab collective"
    else:
        where = f"blocked in commlab.{outer[1]}"
        if inner and inner[0].endswith("runtime/_control.py"):
            where += " (waiting at the agreement block for the other ranks to call it)"
        elif inner and inner != outer:
            where += f" (in {inner[1]}, {inner[0].split('/commlab/')[-1]})"
    out = [f"[rank {rank}] {where}; stack (most recent call last):"]
    if not frames:
        raw = [ln for ln in dump.strip().splitlines() if ln.strip()][:8]
        out.append("    (no Python stack: the rank may be blocked outside Python"
                   + ("; its dump read:" if raw else "; its stack dump came back empty)"))
        out.extend(f"      {ln}" for ln in raw)
        if raw:
            out[-1] += ")"

    for f, ln, fn in frames:
        if _CELL_FILE.search(f):
            src = ""
            if cell_lines is not None and fn == "<module>" and 0 < ln <= len(cell_lines):
                src = cell_lines[ln - 1].strip()
            out.append(f"    cell, line {ln}, in {fn}" + (f":  {src}" if src else ""))
        else:
            shown = f.split("site-packages/")[-1].split("/commlab/")[-1]
            shown = ("commlab/" + shown) if "/commlab/" in f else shown
            out.append(f"    {shown}:{ln} in {fn}")
    return "\n".join(out), outer is not None
