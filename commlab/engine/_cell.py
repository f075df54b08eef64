"""A cell's outcome is settled before the cell returns (rank side).

A collective that repeats the previous call of a cached plan runs ahead of the agreement
(``commlab.runtime._ahead``): it launches without waiting for the peers' signatures and
is checked later. Left to "the next call", a mismatch found there surfaces in the next
cell, under that cell's number, and the ranks that raised there leave the others waiting
in a false hang. So every cell ends with ``settle()`` on every rank: the calls that ran
ahead are checked (waiting for the peers to publish them) and the device is synchronized,
and a mismatch is raised in the cell where it happened, on every rank, as if raised by
the cell's own line that made the call (``Cell In[k], line L``).

``install(shell)`` wraps the engine shell's ``run_cell_async`` (ipykernel runs every
cell through it, also via ``run_cell``); ``World.apply`` calls are not cells and are
not wrapped. It also numbers cells as the notebook does (``numbered``: the first line
``# commlab: In[n]`` that ``%%distributed`` sends), so tracebacks, kernel lines and hang
reports say "Cell In[2], line 22" with JupyterLab's line numbers.
"""

from __future__ import annotations

import functools
import os
import re

from commlab._interpreter.blocked import CELL_FILE
from commlab.errors import CollectiveTimeoutError
from commlab.runtime import current_communicator

_MARK = "_commlab_settles_cells"


def settle() -> None:
    """Check this rank's calls that ran ahead and wait for its device: raises the
    RankMismatchError every rank raises if one of them disagreed (a no-op without a
    communicator)."""
    comm = current_communicator()
    if comm is not None and not comm.closed:
        comm.synchronize()


def finish(error: BaseException | None) -> BaseException | None:
    """The cell's error once its collectives are settled: ``error`` (what the cell itself
    raised, or None) unless a call that ran ahead mismatched; that call came first, so
    its RankMismatchError is the rank's error (``error`` named in a note)."""
    if isinstance(error, (CollectiveTimeoutError, KeyboardInterrupt)):
        # a peer is missing (its timeout says so) or the notebook interrupted the ranks
        # and recovers them next (comm.recover() forgets what ran ahead): waiting for
        # peers to publish here would only hold the rank
        return error
    try:
        settle()
    except BaseException as e:  # noqa: BLE001 (a KeyboardInterrupt here is the cell's too)
        if error is not None:
            e.add_note(f"after that call, this rank's cell raised "
                       f"{type(error).__name__}: {error}")
        return e
    return error


def install(shell) -> None:
    """Settle at the end of every cell ``shell`` runs (idempotent)."""
    if getattr(shell, _MARK, False):
        return
    # kineto (torch.profiler) prints "profiler_start"/"profiler_stop" on every profile at
    # its highest log level; a cell's output is the user's (read when a profile starts)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    run = shell.run_cell_async

    @functools.wraps(run)
    async def run_cell_async(*args, **kwargs):
        result = await run(*args, **kwargs)
        error = result.error_in_exec or result.error_before_exec
        final = finish(error)
        if final is not error:
            _report(shell, result, final)
        return result

    shell.run_cell_async = run_cell_async
    _number_cells(shell.compile)
    setattr(shell, _MARK, True)


NUMBER_LINE = "# commlab: In[{n}]"  # %%distributed's first line on a rank
_NUMBER = re.compile(r"\A# commlab: In\[(\d+)\]\n")


def numbered(cell: str, n: int) -> str:
    """``cell`` as a rank runs it for the notebook's cell ``n``: one first line naming
    the cell, where JupyterLab shows ``%%distributed``, so line L on the rank is line L
    in JupyterLab (unchanged when the cell starts with a cell magic of its own)."""
    if cell.startswith("%%"):
        return cell
    return NUMBER_LINE.format(n=n) + "\n" + cell


def _number_cells(compiler) -> None:
    """A numbered cell's file name carries the notebook's number (``In<n>_<hash>.py``,
    read by ``commlab._interpreter.blocked.cell_place`` and in stack dumps), and IPython's
    tracebacks name it "Cell In[n]": each frame its own cell, as the notebook counts."""
    get, fmt = compiler.get_code_name, compiler.format_code_name

    def get_code_name(raw_code, transformed_code, number):
        name = get(raw_code, transformed_code, number)
        m = _NUMBER.match(raw_code or transformed_code or "")
        if m is None:
            return name
        return os.path.join(os.path.dirname(name), f"In{m[1]}_{os.path.basename(name)}")

    def format_code_name(name):
        m = CELL_FILE.search(name)
        return ("Cell", f"In[{m['cell']}]") if m and m["cell"] else fmt(name)

    compiler.get_code_name, compiler.format_code_name = get_code_name, format_code_name


def _report(shell, result, exc: BaseException) -> None:
    """Make ``exc`` the cell's error: shown as IPython shows one, and in the reply
    ipykernel sends (status, ename, evalue, traceback from ``shell._last_traceback``)."""
    site = getattr(exc, "ran_ahead_at", None)
    try:
        if site is not None:
            _raise_at(exc, *site)
        raise exc
    except BaseException:  # noqa: BLE001
        shell.showtraceback()
    result.error_before_exec = None
    result.error_in_exec = exc


def _raise_at(exc: BaseException, filename: str, line: int) -> None:
    """Raise ``exc`` from a frame at ``filename:line`` (the cell line of the call that
    ran ahead): the traceback then shows that line as the rank's own frame, the same
    as on a rank that raised in the call itself."""
    code = compile("\n" * (line - 1) + "raise __commlab_exc", filename, "exec")
    exec(code, {"__commlab_exc": exc})
