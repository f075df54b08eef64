"""Errors commlab raises. Each message states the rule, shows the value and says the fix."""

from __future__ import annotations

import os
import signal

from commlab import _config


class CommlabError(RuntimeError):
    """Base class for commlab's own errors."""


class CommlabUsageError(CommlabError, ValueError):
    """The arguments break a rule (shape, dtype, op, algorithm...). Nothing was launched."""


class RankMismatchError(CommlabUsageError):
    """Ranks called the same collective with arguments that disagree (raised on every rank)."""


class HeapFullError(CommlabError, MemoryError):
    """The symmetric heap has no free block large enough."""


class CollectiveTimeoutError(CommlabError, TimeoutError):
    """Some ranks did not reach a collective within the communicator's timeout."""


class RankLostError(CommlabError):
    """A rank of the world died (its process is gone) while this rank waited for it.
    ``lost``: the lost ranks, sorted, numbered as in the world that lost them; ``op``: the
    collective this rank was in. Every survivor raises it; then every survivor calls
    ``commlab.shrink()``, which continues with the survivors renumbered 0..W'-1."""

    def __init__(self, message: str, lost: list[int] | tuple[int, ...] = (), op: str = ""):
        super().__init__(message)
        self.lost = sorted(lost)
        self.op = op

    def __reduce__(self):  # picklable with its attributes (ranks report errors to a parent)
        return (type(self), (str(self), self.lost, self.op))


class BackendUnavailableError(CommlabError):
    """The requested backend cannot run here (e.g. ``cuda`` without a GPU on some rank)."""


class DataRaceError(CommlabError):
    """Two accesses to the same symmetric bytes, at least one a write, not ordered by
    happens-before (found by ``commlab.racecheck``; the message names both)."""


class WaitTimeoutError(CollectiveTimeoutError):
    """A ``cl.wait``/``cl.barrier`` under ``commlab.racecheck(wait_timeout=...)`` stayed
    unsatisfied; the message holds the wait-for graph, ``.graph`` the same as one dict
    per blocked program, ``.cycle`` the ranks of a known cycle (or []) and
    ``.wait_graph`` the whole graph (OR-waits, the knot; ``commlab.widgets.WaitGraphView``
    draws it)."""

    graph: list = []
    cycle: list = []
    wait_graph: dict | None = None


# -- short tracebacks in notebooks ---------------------------------------------------------
# A commlab error raised deep inside commlab reads best as the user's own frames plus the
# message: %load_ext commlab shows that (``notebook_traceback``), ranks' tracebacks too
# (``commlab.engine``). The whole traceback stays one step away: ``err.full_traceback``, or
# every traceback in full with ``commlab.errors.FULL_TRACEBACKS = True`` (or the environment
# variable COMMLAB_FULL_TRACEBACKS=1 before the kernel starts).
FULL_TRACEBACKS = bool(_config.get("COMMLAB_FULL_TRACEBACKS"))
HINT = ("({n} commlab/Triton frame{s} hidden: err.full_traceback has them, "
        "commlab.errors.FULL_TRACEBACKS = True shows every traceback in full)")
_OWN_DIRS = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (
    __file__, os.path.join(os.path.dirname(__file__), "..", "magics", "__init__.py")))


_HIDDEN_PACKAGES = tuple(f"site-packages{os.sep}{p}{os.sep}"
                         for p in ("commlab", "ipyparallel", "triton"))


def exit_text(code: int | None, unknown: str = "exit status unknown") -> str:
    """How a process ended, for messages: "killed by SIGKILL", "exit code 3" or ``unknown``
    (``code`` None: still running or not known)."""
    if code is None:
        return unknown
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def is_internal(path: str) -> bool:
    """Whether a traceback frame's file is plumbing the user did not write: commlab's own
    code, Triton's (its JIT and interpreter, between a launch and the kernel's frame) or
    ipyparallel's."""
    path = os.path.abspath(path) if path and not path.startswith("<") else path
    return path.startswith(_OWN_DIRS) or any(p in path for p in _HIDDEN_PACKAGES)


def notebook_traceback(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """IPython's traceback of ``value`` without commlab's frames (for ``set_custom_exc``);
    sets ``value.full_traceback`` to the whole one."""
    import traceback

    if tb_offset is None:
        tb_offset = 1  # the first frame is IPython's run_code
    full = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    try:
        value.full_traceback = "".join(traceback.format_exception(etype, value, tb))
    except Exception:  # an exception that refuses attributes still shows
        pass
    render = getattr(value, "_render_traceback_", None)
    if FULL_TRACEBACKS:
        return full
    if render is not None:
        return render()
    frames: list[traceback.FrameSummary] = list(traceback.extract_tb(tb))
    if tb_offset:
        frames = frames[tb_offset:]
    hidden = sum(is_internal(f.filename) for f in frames)
    shown = [f for f in frames if not (is_internal(f.filename) or _is_ipython(f.filename))]
    if not hidden:
        return full
    lines = [f"\x1b[31m{etype.__name__}\x1b[0m  Traceback (most recent call last)"]
    for f in shown:
        where = shell.compile.format_code_name(f.filename)
        name = f"{where[0]} {where[1]}" if where else f"File {f.filename}"
        lines.append(f"{name}, line {f.lineno}" + (f", in {f.name}" if f.name != "<module>"
                                                    else ""))
        if f.line:
            lines.append(f"----> {f.lineno} {f.line.strip()}")
    lines.append(f"\x1b[31m{etype.__name__}\x1b[0m: {value}")
    lines.append(HINT.format(n=hidden, s="" if hidden == 1 else "s"))
    return ["\n".join(lines)]


def _is_ipython(path: str) -> bool:
    return f"{os.sep}IPython{os.sep}" in path or path.startswith("<decorator-gen")


def install_notebook_tracebacks(shell) -> None:
    """Show commlab's errors in ``shell`` with the user's frames only (``%load_ext``)."""

    def handler(self, etype, value, tb, tb_offset=None):
        stb = notebook_traceback(self, etype, value, tb, tb_offset)
        self._get_exc_info((etype, value, tb))  # sys.last_*: %debug and %tb still work
        self._showtraceback(etype, value, stb)
        return stb

    shell.set_custom_exc((CommlabError,), handler)
