"""Errors commlab raises. Each message states the rule, shows the value and says the fix."""

from __future__ import annotations


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


class BackendUnavailableError(CommlabError):
    """The requested backend cannot run here (e.g. ``cuda`` without a GPU on some rank)."""


class DataRaceError(CommlabError):
    """Two accesses to the same symmetric bytes, at least one a write, not ordered by
    happens-before (found by ``commlab.racecheck``; the message names both)."""


class WaitTimeoutError(CollectiveTimeoutError):
    """A ``cl.wait``/``cl.barrier`` under ``commlab.racecheck(wait_timeout=...)`` stayed
    unsatisfied; the message holds the wait-for graph, ``.graph`` the same as one dict
    per blocked rank and ``.cycle`` the ranks of a cycle (or [])."""

    graph: list = []
    cycle: list = []
