"""``with commlab.elastic.step(state):`` one training step that a lost rank cannot break."""

from __future__ import annotations

from commlab.errors import CommlabError, CommlabUsageError, RankLostError
from commlab.runtime import _grow, get_communicator, grow, shrink


class step:  # noqa: N801 - used as a function: ``with commlab.elastic.step(state):``
    """One step of an elastic loop.

    Entering: newcomers waiting at the store are admitted (member 0 looks at the store's
    counter, one round trip, and shares what it saw through the store so every member
    decides alike), and the state goes to the ranks that joined. Leaving: a good step is
    committed; on ``RankLostError`` the state rolls back to the last commit, the world
    shrinks, and the error is swallowed: the loop redoes the step (keep the step counter
    in the state). ``grow_timeout``: how long a grow waits for the newcomers it saw."""

    def __init__(self, state, *, grow_timeout: float = 30.0):
        self.state, self.grow_timeout = state, grow_timeout

    def __enter__(self):
        while True:
            try:
                self._boundary()
                return self.state
            except RankLostError:
                self._recover()

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            self.state.commit()
            return False
        if issubclass(kind, RankLostError):
            self._recover()
            return True  # redone by the loop: its counter rolled back with the state
        return False

    def _recover(self) -> None:
        self.state.restore()
        shrink()

    def _boundary(self) -> None:
        state = self.state
        if state.owed or _grow.PENDING_STATE[0]:
            state.sync()
            return
        comm = get_communicator()
        m = comm.members
        if m is None or m.store is None:
            return
        seen = str(_grow.waiting(comm)) if comm.rank == 0 else None
        k = int(m.share("newcomers", seen))
        if not k:
            return
        try:
            grow(k, timeout=self.grow_timeout)
        except (RankLostError, CommlabUsageError):
            raise
        except CommlabError as e:  # the grow failed alike everywhere: go on unchanged
            state.events.append(str(e))
            return
        state.owed = True
        state.sync()
