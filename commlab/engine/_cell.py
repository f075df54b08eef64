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
not wrapped.
"""

from __future__ import annotations

import functools
import os

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
    if isinstance(error, CollectiveTimeoutError):
        return error  # a peer is missing: its timeout says so; waiting again won't help
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
    setattr(shell, _MARK, True)


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
