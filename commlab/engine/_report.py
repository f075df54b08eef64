"""Turning what the ranks did into one readable report: failures grouped by traceback,
hang reports built from each blocked rank's stack."""

from __future__ import annotations

import re

import commlab.errors as errors
from commlab._interpreter.blocked import CELL_FILE
from commlab.errors import CommlabError, is_internal

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TB_FRAME = re.compile(r"^(Cell In\[(?P<n>\d+)\], line \d+|File (?P<file>.+?):\d+, in |"
                       r"Input In \[\d+\])")
_ARROW = re.compile(r"^-+> ")
_CELL_NO = re.compile(r"Cell In\[\d+\]")
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


def short_traceback(tb: str, head: str, cell_number: int | None = None
                    ) -> tuple[list[str], int]:
    """A rank's IPython traceback as the user's frames (header + the arrow line) and the
    message, commlab's frames counted, not shown; ``Cell In[k]`` renumbered to the
    notebook's cell; returns the lines and how many frames were hidden. Text in an
    unknown format comes back whole."""
    lines = strip_ansi(tb).rstrip("\n").splitlines()
    starts = [i for i, ln in enumerate(lines) if _TB_FRAME.match(ln)]
    if not starts:
        return lines or [head], 0
    out, hidden = [], 0
    for k, i in enumerate(starts):
        block = lines[i:starts[k + 1] if k + 1 < len(starts) else len(lines)]
        m = _TB_FRAME.match(block[0])
        assert m is not None  # every block starts where _TB_FRAME matched (starts above)
        if m["file"] and is_internal(m["file"]):
            hidden += 1
            continue
        header = block[0]
        if cell_number is not None and m["n"]:
            header = header.replace(f"Cell In[{m['n']}]", f"Cell In[{cell_number}]", 1)
        out.append(header)
        out += [ln for ln in block[1:] if _ARROW.match(ln)][:1]
    out.append(head)
    return out, hidden


class DistributedError(CommlabError):
    """A cell (or ``World.apply``) failed on some ranks.

    ``failures`` maps rank -> (exception name, message, traceback text); the message
    groups ranks whose tracebacks show the same user frames and message:
    "ZeroDivisionError on ranks 1, 3"."""

    def __init__(self, failures: dict[int, tuple[str, str, str]], world_size: int,
                 extra: str = ""):
        self.failures = failures
        self.world_size = world_size
        self.extra = extra
        self.cell_number: int | None = None  # the notebook's cell (set by %%distributed)
        self.groups: dict[tuple[str, str], list[int]] = {}
        self._text: dict[tuple[str, str], str] = {}
        for r in sorted(failures):
            ename, evalue, tb = failures[r]
            # ranks whose tracebacks show the same frames of the user's and the same
            # message are one group (commlab's hidden frames may differ: a call that ran
            # ahead raises from the cell's end); engines count their cells apart, so
            # In[k] is not compared
            head = f"{ename}: {evalue}" if evalue else ename
            key = (head, _CELL_NO.sub("Cell In[]", "\n".join(short_traceback(tb, head)[0])))
            self.groups.setdefault(key, []).append(r)
            self._text.setdefault(key, strip_ansi(tb))  # the first rank's, as it came
        heads = [f"{head.split(':')[0]} on {ranks_str(rs)}" for (head, _), rs in
                 self.groups.items()]
        msg = "; ".join(heads)
        first = next(iter(self.groups))[0]
        super().__init__(f"{msg} ({first})" + (f"\n{extra}" if extra else ""))

    def _render_traceback_(self, full: bool | None = None) -> list[str]:
        """What IPython shows instead of the client-side traceback: per group of ranks,
        the user's frames and the message (``full``, or ``commlab.errors.FULL_TRACEBACKS``:
        the ranks' whole tracebacks)."""
        full = errors.FULL_TRACEBACKS if full is None else full
        lines, hidden = [], 0
        for (head, key_tb), rs in self.groups.items():
            tb = self._text[(head, key_tb)]
            lines.append(f"\x1b[31m--- {head.split(':')[0]} on {ranks_str(rs)} "
                         f"(of {self.world_size}) ---\x1b[0m")
            if full:
                lines.extend(tb.rstrip("\n").splitlines() or [head])
            else:
                short, n = short_traceback(tb, head, self.cell_number)
                lines.extend(short)
                hidden = max(hidden, n)
        if self.extra:
            lines.append(self.extra)
        if hidden:
            lines.append(errors.HINT.format(n=hidden, s="" if hidden == 1 else "s"))
        return lines

    @property
    def full_traceback(self) -> str:
        """Every group's whole rank traceback, commlab's frames included."""
        return strip_ansi("\n".join(self._render_traceback_(full=True)))


class HangError(CommlabError):
    """Some ranks stayed blocked (a collective that not every rank called, a deadlock):
    the report shows each blocked rank's stack and the collective it waits in;
    ``wait_graph`` the kernels' wait-for graph (``commlab.widgets.WaitGraphView``)."""

    def __init__(self, report: str, failures: DistributedError | None = None,
                 full_report: str = ""):
        self.report = report
        self.full_report = full_report or report  # with every frame of each stack
        self.failures = failures
        self.wait_graph: dict | None = None  # racecheck.wait_graph of the blocked kernels
        super().__init__(report)

    def _render_traceback_(self) -> list[str]:
        lines = (self.full_report if errors.FULL_TRACEBACKS else self.report).splitlines()
        if self.failures is not None:
            lines += [""] + self.failures._render_traceback_()
        return lines


class RankDiedError(CommlabError):
    """A rank's process ended while it was running a cell."""


def parse_dump(text: str) -> list[list[tuple[str, int, str]]]:
    """faulthandler's all-threads dump -> threads, each a list of (file, line, function)
    frames, most recent call first."""
    threads: list[list[tuple[str, int, str]]] = []
    cur: list[tuple[str, int, str]] | None = None
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            cur = []
            threads.append(cur)
        elif cur is not None:
            m = _FRAME.match(line)
            if m:
                cur.append((m["file"], int(m["line"]), m["func"]))
    return threads


_TRITON = "site-packages/triton/"


def _is_commlab(path: str) -> bool:
    return "/commlab/" in path and "/commlab/engine/" not in path


def _relevant_thread(threads):
    """The thread running the cell: the one with a cell frame, else one with a commlab
    frame (commlab's own background threads, such as the heartbeats of a world across
    hosts, have commlab frames too: a cell's thread comes first)."""
    for match in (CELL_FILE.search, _is_commlab):
        for frames in threads:
            if any(match(f) for f, _, _ in frames):
                return frames
    return threads[0] if threads else []


def describe_stack(rank: int, dump: str, cell_lines: list[str] | None = None,
                   full: bool = False) -> tuple[str, bool]:
    """One blocked rank's part of a hang report, and whether it waits inside commlab.
    Frames below the commlab call the cell made are counted, not shown, unless ``full``."""
    frames = list(reversed(_relevant_thread(parse_dump(dump))))  # oldest first
    start = next((i for i, (f, _, _) in enumerate(frames) if CELL_FILE.search(f)), 0)
    frames = frames[start:]
    # the outermost commlab frame names the call, past the wrapper that publishes local
    # errors (runtime/_publish.py: its frame is named "call")
    outer = next(((f, fn) for f, _, fn in frames
                  if _is_commlab(f) and not f.endswith("runtime/_publish.py")), None)
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

    hidden = 0
    if not full and outer is not None:
        cut = next(i for i, (f, _, _) in enumerate(frames) if _is_commlab(f)) + 1
        hidden, frames = len(frames) - cut, frames[:cut]
    if not full:  # Triton's JIT and interpreter between a launch and the kernel's frame
        kept = [fr for fr in frames if _TRITON not in fr[0]]
        hidden, frames = hidden + len(frames) - len(kept), kept
    for f, ln, fn in frames:
        m = CELL_FILE.search(f)
        if m:
            src = ""
            if cell_lines is not None and fn == "<module>" and 0 < ln <= len(cell_lines):
                src = cell_lines[ln - 1].strip()
            cell = f"Cell In[{m['cell']}]" if m["cell"] else "cell"
            out.append(f"    {cell}, line {ln}, in {fn}" + (f":  {src}" if src else ""))
        else:
            shown = f.split("site-packages/")[-1].split("/commlab/")[-1]
            shown = ("commlab/" + shown) if "/commlab/" in f else shown
            out.append(f"    {shown}:{ln} in {fn}")
    if hidden:
        out.append(f"    ({hidden} frame{'' if hidden == 1 else 's'} inside commlab or Triton "
                   f"hidden: err.full_report has them)")
    return "\n".join(out), outer is not None
