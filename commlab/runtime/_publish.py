"""Local errors before the agreement, published through it.

A collective that raises on one rank before that rank reaches its agreement (an unknown
keyword, a bad shape argument, any exception of its own checks) would leave the other
ranks waiting in the agreement, then tell them "ranks called different collectives",
one call out of step. Wrapped with ``publishes_local_errors``, such an error is
published as that rank's local error instead: every rank raises the same clear error in
the same agreement, and the next call works. An error raised inside or after the
agreement (a mismatch, a timeout, a second thread) is raised as it is; one behind which
a member was lost (gloo's "Connection closed by peer" in a host-side exchange, e.g. the
tuning table's broadcast) is raised as ``RankLostError``.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from commlab.errors import CommlabError
from commlab.runtime import _native
from commlab.runtime._ahead import CALLER
from commlab.runtime._control import Signature

F = TypeVar("F", bound=Callable[..., Any])


def local_error_text(fn: Callable, e: Exception) -> str:
    """What a rank publishes for ``e`` raised by its call of ``fn``: the message, and for
    a call that does not fit the signature, the signature."""
    if isinstance(e, CommlabError):
        return str(e)
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, TypeError):
        text += f"; the signature is {fn.__name__}{inspect.signature(fn)}"
    return text


# per call made inside the outermost public call, (the C entry of the plan that served
# it or None, the online pick's budget or None: the dispatch then serves only the calls
# it grants); the collectives' host path appends to it
SERVED: list = []
_DEPTH = [0]


def published(current: Callable[[], Any]) -> Callable[..., Callable[[F], F]]:
    """The decorator factory for one runtime: ``current()`` gives the open communicator or
    None (nothing to publish to before ``init``)."""

    def publishes_local_errors(op: str | None = None, dispatch: bool = False,
                               out: int | None = None) -> Callable[[F], F]:
        """``dispatch``: the function is exactly one collective's host path (``return
        run(x, ...)``; ``out=k``: ``return run(..., out=args[k])``, 0 for ``out=x``), so
        a call repeating the arguments of one a plan served (the output aside) may go
        straight to that plan's C entry (``_native.Dispatch``)."""
        def wrap(fn: F) -> F:
            name = op or fn.__name__
            fast: list = [None]  # the Dispatch, made at the first call a plan served

            @functools.wraps(fn)
            def call(*args, **kwargs):
                d = fast[0]
                if d:
                    y = d(args, kwargs)  # the repeated call, in C; None: not one
                    if y is not None:
                        return y
                f = sys._getframe(1)  # where the user called it: a run-ahead check names it
                CALLER[0] = (f.f_code.co_filename, f.f_lineno)
                comm = current()
                if comm is None:
                    return fn(*args, **kwargs)
                control = comm.control
                entered = control.entered
                outer = _DEPTH[0] == 0
                if outer:
                    SERVED.clear()
                _DEPTH[0] += 1
                try:
                    y = fn(*args, **kwargs)
                except Exception as e:
                    members = getattr(comm, "members", None)
                    lost = members.behind(e, name) if members is not None else None
                    if lost is not None:  # a host-side exchange met a dead member
                        raise lost from e
                    if control.entered != entered or comm.closed:
                        raise  # the agreement raised it, or ran: every rank is in step
                    try:
                        control.agree(Signature(name, {}, local_error_text(fn, e)))
                    except CommlabError as agreed:  # the same on every rank
                        raise agreed from e
                    raise AssertionError("a published local error always raises") from e
                finally:
                    _DEPTH[0] -= 1
                    if not outer:  # a call inside another (across hosts: the host's own
                        SERVED.append((None, None))  # collective): not one plan
                if dispatch and outer and len(SERVED) == 1 and SERVED[0][0] is not None:
                    if d is None:
                        d = fast[0] = _native.dispatch(out) or False
                    if d:
                        d.remember(args, kwargs, *SERVED[0])
                return y

            return call  # type: ignore[return-value]

        return wrap

    return publishes_local_errors
