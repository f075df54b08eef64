"""POSIX shared-memory segments that never outlive the world that made them.

Each rank creates one segment, every rank maps every segment, and then each rank
unlinks its own: from that moment nothing is left in /dev/shm, and the kernel frees the
memory when the last process holding a mapping exits, however it exits. Segments left
by a process killed inside that short window carry the creator's pid in their name and
are swept by the next ``init`` on the machine.
"""

from __future__ import annotations

import _posixshmem
import mmap
import os
import re

_SHM_DIR = "/dev/shm"
_NAME_RE = re.compile(r"^commlab-[0-9a-f]+-[a-z]+-r\d+-p(\d+)$")


def segment_name(token: str, kind: str, rank: int) -> str:
    return f"commlab-{token}-{kind}-r{rank}-p{os.getpid()}"


def create(name: str, size: int) -> mmap.mmap:
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def open_existing(name: str, size: int) -> mmap.mmap:
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class OpenFd:
    """An fd of a segment kept open for the process's life (closed when collected): a
    newcomer maps the segment after its name is gone, through ``/proc/<pid>/fd/<fd>``."""

    def __init__(self, name: str):
        self.fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def open_peer_fd(pid: int, fd: int, size: int) -> mmap.mmap:
    """Map the segment process ``pid`` holds open as ``fd`` (same user, one host)."""
    f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        return mmap.mmap(f, size)
    finally:
        os.close(f)


def unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def free_bytes() -> int | None:
    """Free bytes in /dev/shm, or None where there is no such directory (not Linux)."""
    try:
        st = os.statvfs(_SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def sweep_orphans() -> list[str]:
    """Unlink commlab segments whose creating process no longer exists."""
    removed: list[str] = []
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return removed
    for name in names:
        m = _NAME_RE.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            unlink(name)
            removed.append(name)
        except PermissionError:
            pass
    return removed
