"""The bootstrap store, authenticated: nothing a stranger writes into it is trusted.

Rank 0's TCPStore takes connections from anyone who can reach MASTER_PORT, and it has no
credentials of its own. So every value the ranks put into it during ``init`` (their GPU
flags, the world's token, and gloo's addresses, through which init's exchanges travel)
carries an HMAC-SHA256 over its key and bytes, made with a secret every rank of the world
holds; a value read back is used only when its MAC checks. A client that overwrites a
key without the secret makes ``init`` raise a clear error instead of trusting the value.

The secret: ``COMMLAB_WORLD_KEY`` when set (the same string on every rank: set it on
every host of a multi-host world), else a random key kept in a file only this user can
read (``~/.cache/commlab/world-key``): the ranks of one user on one host share it, other
users cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from datetime import timedelta

import torch.distributed as dist

from commlab import _config
from commlab.errors import CommlabError

_MAC = 32  # bytes of HMAC-SHA256 before every value


def _key_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "commlab")


def _own_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} is not private to this user")
    return path


def _key_file() -> str:
    """``world-key`` in the user's cache directory (or a private temp directory when
    that is not writable), created once with mode 0600."""
    try:
        d = _own_dir(_key_dir())
    except OSError:
        d = _own_dir(os.path.join(tempfile.gettempdir(), f"commlab-{os.getuid()}"))
    path = os.path.join(d, "world-key")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # atomic: ranks racing here all read the first key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    st = os.stat(path)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise CommlabError(
            f"commlab.init: the world key file {path} is readable by others or not yours; "
            f"delete it (a new one is made), or set COMMLAB_WORLD_KEY")
    return path


def world_key() -> bytes:
    """The secret the ranks of this world share (see the module docstring)."""
    env = _config.get("COMMLAB_WORLD_KEY")
    if env:
        return str(env).encode()
    with open(_key_file()) as f:
        return f.read().strip().encode()


class AuthenticatedStore(dist.Store):
    """A store whose set/get values carry an HMAC over (context, key, value)."""

    def __init__(self, inner: dist.Store, key: bytes, context: str):
        super().__init__()
        self._inner, self._key, self._context = inner, key, context.encode()

    def _mac(self, key: str, value: bytes) -> bytes:
        msg = self._context + b"\0" + key.encode() + b"\0" + value
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def _open(self, key: str, raw: bytes) -> bytes:
        mac, value = raw[:_MAC], raw[_MAC:]
        if len(raw) < _MAC or not hmac.compare_digest(mac, self._mac(key, value)):
            raise CommlabError(
                f"commlab.init: the bootstrap store's value for {key!r} (under "
                f"{self._context.decode()!r}) fails its HMAC check, so it was not written "
                f"by a rank of this world: another process reached MASTER_PORT and "
                f"overwrote it, or the ranks hold different COMMLAB_WORLD_KEY values. "
                f"Nothing from it was used; set the same COMMLAB_WORLD_KEY on every rank "
                f"(or none on one host), pick a MASTER_PORT others cannot reach, and init again")
        return value

    @staticmethod
    def _bytes(value) -> bytes:
        if isinstance(value, str):
            return value.encode()
        return bytes(value)

    def set(self, key: str, value) -> None:
        v = self._bytes(value)
        self._inner.set(key, self._mac(key, v) + v)  # type: ignore[arg-type]  # bytes work

    def get(self, key: str) -> bytes:
        return self._open(key, self._inner.get(key))

    def multi_set(self, keys, values) -> None:
        for k, v in zip(keys, values, strict=True):
            self.set(k, v)

    def multi_get(self, keys) -> list[bytes]:
        return [self.get(k) for k in keys]

    def add(self, key: str, amount: int) -> int:
        return self._inner.add(key, amount)  # counters: a stranger can only make init wait

    def check(self, keys) -> bool:
        return self._inner.check(keys)

    def wait(self, keys, timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)

    def compare_set(self, key: str, expected, desired) -> bytes:
        exp, want = self._bytes(expected), self._bytes(desired)
        # an empty expected value means "not set yet"; a MAC is deterministic, so a set
        # value compares equal to its MACed form
        got = self._inner.compare_set(key, self._mac(key, exp) + exp if exp else b"",  # type: ignore[arg-type]  # bytes work
                                      self._mac(key, want) + want)  # type: ignore[arg-type]
        return self._open(key, got) if got else got

    def has_extended_api(self) -> bool:
        return True  # multi_get / multi_set / compare_set above

    def clone(self) -> AuthenticatedStore:
        """A store of its own connection, MACed the same way."""
        inner = self._inner.clone()  # type: ignore[attr-defined]  # not in torch's stubs
        twin = AuthenticatedStore(inner, self._key, self._context.decode())
        _KEEP.append(twin)
        return twin


def authenticated(store: dist.Store, context: str) -> dist.Store:
    """``store`` with every value MACed under this world's key; ``context`` (the store's
    prefix) is bound into every MAC, so a value cannot be moved to another generation."""
    wrapped = AuthenticatedStore(store, world_key(), context)
    # torch keeps only the C++ half: once this Python object is gone, every later call
    # from C++ (a group made after init, as across hosts) fails "Not implemented"
    _KEEP.append(wrapped)
    return wrapped


_KEEP: list[AuthenticatedStore] = []

