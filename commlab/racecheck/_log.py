"""The ranks' shared racecheck log: length-prefixed pickles in per-world files.

Each rank appends to its own access log (``acc-R``); every atomic on symmetric memory
and every host synchronisation is appended to one shared sync log (``sync``) while the
world-wide lock is held, so its order is the order the atomics took effect in. Readers
keep an offset per file and parse only what is new. The directory lives under the
system temp dir and is removed at racecheck exit.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import struct

_LEN = struct.Struct("<I")


class Log:
    """Append-only record file, read incrementally."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self.offset = 0
        self.records: list = []

    def append(self, *records) -> None:
        if records:
            data = b"".join(_LEN.pack(len(b)) + b for b in map(pickle.dumps, records))
            os.write(self.fd, data)

    def refresh(self) -> list:
        """Read the records appended since the last call; return them (also kept)."""
        size = os.fstat(self.fd).st_size
        if size <= self.offset:
            return []
        raw = os.pread(self.fd, size - self.offset, self.offset)
        new, pos = [], 0
        while pos + _LEN.size <= len(raw):
            (n,) = _LEN.unpack_from(raw, pos)
            if pos + _LEN.size + n > len(raw):
                break  # a frame still being written
            new.append(pickle.loads(raw[pos + _LEN.size: pos + _LEN.size + n]))
            pos += _LEN.size + n
        self.offset += pos
        self.records.extend(new)
        return new

    def close(self) -> None:
        os.close(self.fd)


class Shared:
    """This rank's view of the world's logs in ``root``."""

    def __init__(self, root: str, rank: int, world: int):
        self.root, self.rank, self.world = root, rank, world
        self.sync = Log(os.path.join(root, "sync"))
        self.acc = [Log(os.path.join(root, f"acc-{r}")) for r in range(world)]
        self._lock_fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT, 0o600)

    def lock(self):
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)

    def unlock(self):
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self, remove: bool) -> None:
        for log in [self.sync, *self.acc]:
            log.close()
        os.close(self._lock_fd)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)
