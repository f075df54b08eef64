"""The agreement of a world across hosts: the host's block, then one exchange between hosts.

Inside a host the ranks agree through the shared-memory ``ControlBlock`` of the host's
communicator (``_control``). Then every rank exchanges its signature, or the error its
host found, with the ranks of the same local index on the other hosts (one gloo
all-gather of a fixed-size buffer). That is enough: rank (h, i) agrees with every rank
of host h, and with rank i of every host, which agrees with its own host. So every rank
sees every host's verdict, and raises the same error; the error names hosts and global
ranks, never a host's local numbering. Passing it is also a barrier of the whole world.
On hosts of different sizes (after a shrink) a rank of a smaller host also exchanges in
the groups of the local indices its host lacks (``extra``), so that every group has one
rank per host.

A rank missing on one host raises ``CollectiveTimeoutError`` there after the timeout. The
exchange between hosts waits while looking at the world's members (``Membership.wait``):
a host gone (its ranks' heartbeats stopped: ``_beats``) raises ``RankLostError`` within
``COMMLAB_PEER_TIMEOUT``; without a store that outlives ranks it fails when its gloo group
gives up (the timeout, at least 30 s), with torch's error rather than commlab's.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist

from commlab.errors import CollectiveTimeoutError, RankMismatchError
from commlab.runtime._control import ControlBlock, Signature
from commlab.runtime.membership import Membership

_BUF = 1024  # bytes per rank in the exchange: a 4-byte length, a kind byte, the text
_RANKS = re.compile(r"\b(ranks?) (\d+(?:, \d+)*)")


def global_names(text: str, ranks: list[int]) -> str:
    """``text`` from a host's agreement with its local rank numbers made global."""
    def sub(m: re.Match) -> str:
        nums = [ranks[int(n)] if int(n) < len(ranks) else int(n) for n in m.group(2).split(", ")]
        return f"{m.group(1)} {', '.join(map(str, nums))}"
    return _RANKS.sub(sub, text)


def _pack(kind: int, body: bytes) -> torch.Tensor:
    body = body[: _BUF - 5]
    buf = torch.zeros(_BUF, dtype=torch.uint8)
    head = len(body).to_bytes(4, "little") + bytes([kind]) + body
    buf[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    return buf


def _unpack(buf: torch.Tensor) -> tuple[int, bytes]:
    raw = bytes(buf.numpy().tobytes())
    n = int.from_bytes(raw[:4], "little")
    return raw[4], raw[5 : 5 + n]


class HostsAgreement:
    """``ControlBlock``'s ``agree``/``reset``/``seq`` for a world across hosts."""

    def __init__(self, local: ControlBlock, hosts: list[list[int]], host: int,
                 cross_hosts: list[int], cross_group: dist.ProcessGroup,
                 members: Membership | None = None, extra: list | None = None):
        self.local = local
        self.extra = extra or []  # (group, ranks, hosts) this rank stands in (_hosts)
        self.members = members  # the world's: a host gone raises RankLostError
        self.hosts = hosts
        self.host = host
        self.cross_hosts = cross_hosts  # the host of each rank of cross_group, group order
        self.group = cross_group
        self.rank = hosts[host][local.rank]
        self.world_size = sum(len(h) for h in hosts)

    @property
    def seq(self) -> int:
        return self.local.seq

    @property
    def timeout(self) -> float:
        return self.local.timeout

    @property
    def entered(self) -> int:
        return self.local.entered

    @property
    def ahead(self):
        """This host's run-ahead state; across hosts every call waits (the hosts' check
        is a gloo exchange each call), so it only holds the drains plans register."""
        return self.local.ahead

    def settle(self) -> None:
        self.local.settle()

    def record(self, sig: Signature, raw: bytes | None = None):
        return self.local.record(sig, raw)

    def repeat(self, rec) -> int:
        """A plan's call: across hosts it waits like any other."""
        return self.agree(rec.sig, rec.raw)

    def reset(self) -> None:
        self.local.reset()

    def _host_name(self, h: int) -> str:
        return f"host {h} (ranks {', '.join(map(str, self.hosts[h]))})"

    def agree(self, sig: Signature, raw: bytes | None = None, *, ahead: bool = False) -> int:
        """Publish ``sig`` on this host, then compare with every host; raise on a
        mismatch or an error anywhere, the same error on every rank. ``ahead`` is
        ignored: across hosts every call waits."""
        if raw is None:
            raw = sig.encode()
        mine = self.hosts[self.host]
        n = 0
        try:
            n = self.local.agree(sig, raw)
            kind, body = 0, raw
        except RankMismatchError as e:
            text = f"on {self._host_name(self.host)}: {global_names(str(e), mine)}"
            kind, body = 1, text.encode()
        except CollectiveTimeoutError as e:
            raise CollectiveTimeoutError(global_names(str(e), mine)) from None
        packed = _pack(kind, body)
        bufs = [torch.empty(_BUF, dtype=torch.uint8) for _ in self.cross_hosts]
        works = [dist.all_gather(bufs, packed, group=self.group, async_op=True)]
        for group, _, hosts in self.extra:  # the same verdicts, for that group's ranks
            works.append(dist.all_gather([torch.empty(_BUF, dtype=torch.uint8)
                                          for _ in hosts], packed, group=group, async_op=True))
        if self.members is not None:
            self.members.wait_all(works, f"collective #{self.seq} (the agreement between hosts)")
        else:
            for work in works:
                work.wait()
        got = [_unpack(bufs[self.cross_hosts.index(h)]) for h in range(len(self.hosts))]
        errors = [b.decode(errors="replace") for k, b in got if k == 1]
        if errors:
            raise RankMismatchError("; ".join(errors))
        if any(b != raw for _, b in got):
            raise RankMismatchError(self._differs(sig, [b for _, b in got]))
        return n

    def _differs(self, mine: Signature, raws: list[bytes]) -> str:
        sigs = [Signature.decode(b) for b in raws]
        ops = {s.op for s in sigs}
        if len(ops) > 1:
            by = ", ".join(f"{self._host_name(h)}: {s.op}" for h, s in enumerate(sigs))
            return (f"collective #{self.seq}: hosts called different collectives ({by}); "
                    f"every rank must call the same collectives in the same order")
        for key in mine.fields:
            vals = [s.fields.get(key, "?") for s in sigs]
            if len(set(vals)) > 1:
                shown = ", ".join(f"{self._host_name(h)}: {v}" for h, v in enumerate(vals))
                fix = mine.hints.get(key, f"pass the same {key} on every rank")
                return f"{mine.op}: {key} differs across hosts ({shown}); {fix}"
        return (f"{mine.op}: arguments differ across hosts in a field too long to show "
                f"({', '.join(mine.fields)}); pass the same arguments on every rank")
