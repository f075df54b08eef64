"""Flags shared by commlab's magics, so each means the same everywhere.

    @magic_arguments()
    @RANKS
    @TIMEOUT
    @cell_magic
    def distributed(self, line, cell): ...
"""

from __future__ import annotations

import functools

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument


def rank_list(text: str) -> list[int]:
    """'0,2' -> [0, 2]; '1-3' -> [1, 2, 3]."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"expected ranks like 0,2 or 0-3, got {text!r}") from None
    if not out:
        raise ValueError(f"expected at least one rank, got {text!r}")
    return sorted(set(out))


rank_list.__name__ = "rank list"  # argparse names the type in its error message


def seconds(text: str) -> float:
    v = float(text)
    if v <= 0:
        raise ValueError(f"expected a positive number of seconds, got {text}")
    return v


seconds.__name__ = "seconds"

RANKS = argument("--ranks", type=rank_list, default=None, metavar="0,2",
                 help="run only on these ranks (comma-separated or a range like 0-3; "
                      "default: every rank)")
TIMEOUT = argument("--timeout", type=seconds, default=None, metavar="S",
                   help="if the cell has not finished on every rank after S seconds, show "
                        "each unfinished rank's stack and the collective it waits in, then "
                        "interrupt it and recover the world")
GRACE = argument("--grace", type=seconds, default=None, metavar="S",
                 help="when some ranks have finished and others stay blocked in a commlab "
                      "collective this long, report a hang (default 5, or "
                      "$COMMLAB_HANG_GRACE)")
RANK = argument("--rank", type=int, default=None, metavar="R",
                help="only this rank (default: every rank, as a list in rank order)")


def usage_errors(fn):
    """Turn commlab's usage errors into IPython's UsageError: a message, no traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        from commlab.errors import CommlabUsageError

        try:
            return fn(*a, **kw)
        except (CommlabUsageError, ValueError, FileNotFoundError) as e:
            raise UsageError(str(e)) from None

    return wrapper
