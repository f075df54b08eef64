"""What a rank publishes in its agreement slot: a collective's signature (op, fields, a
local error), encoded to fit the slot, and a launch plan's fixed record of it
(``_control`` publishes them and compares the peers')."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

SLOT = 256  # bytes per agreement slot
_HDR = struct.Struct("<qqq")  # published seq, signature length, digest of the signature
_SIG_MAX = SLOT - _HDR.size
_CUT = b"\x1d"  # ends the kept prefix of a long signature; its digest follows
_DIGEST = 16  # bytes of blake2b, written as hex


@dataclass
class Signature:
    op: str
    fields: dict  # name -> value, compared across ranks
    error: str = ""  # local validation error, raised on every rank
    hints: dict = field(default_factory=dict)  # field name -> the fix, when it differs

    def encode(self) -> bytes:
        items = sorted(self.fields.items(), key=lambda kv: len(str(kv[1])))  # long last
        body = self.op + "\x1f" + self.error + "\x1f" + "\x1e".join(
            f"{k}={v}" for k, v in items
        )
        raw = body.encode()
        if len(raw) <= _SIG_MAX:
            return raw
        digest = hashlib.blake2b(raw, digest_size=_DIGEST).hexdigest().encode()
        return raw[: _SIG_MAX - len(_CUT) - len(digest)] + _CUT + digest

    @staticmethod
    def decode(raw: bytes) -> Signature:
        """The fields a (possibly cut) encoding still holds whole; ``hints["cut"]`` is set
        when the encoding was cut (its last field dropped, being partial)."""
        cut = _CUT in raw
        if cut:
            raw = raw[: raw.rindex(_CUT)]
        parts = raw.decode(errors="replace").split("\x1f", 2) + ["", ""]
        op, error, rest = parts[:3]
        kvs = rest.split("\x1e")
        if cut:
            kvs = kvs[:-1]
        fields = dict(kv.split("=", 1) for kv in kvs if "=" in kv)
        return Signature(op, fields, error, {"cut": "1"} if cut else {})


def digest(raw: bytes) -> int:
    """64 bits of blake2b: what a repeated call's check compares with each peer's."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True)


@dataclass(frozen=True, eq=False)
class Record:
    """A launch plan's agreement record, made once: the signature, its encoding and digest.
    Publishing it again writes one 8-byte word when the slot already holds it."""

    sig: Signature
    raw: bytes
    digest: int
