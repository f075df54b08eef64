"""``commlab.elastic.State``: what a training loop must not lose when its world changes."""

from __future__ import annotations

import copy
import io
import time

import torch

from commlab.collectives.broadcast import broadcast
from commlab.errors import CommlabUsageError
from commlab.runtime import _grow, get_communicator


def _kind(obj) -> str:
    if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
        return "object"
    return "tensor" if isinstance(obj, torch.Tensor) else "value"


class State:
    """Objects a training step changes: committed after each good step, rolled back after
    a lost rank, and sent to newcomers from a live peer.

        state = State(model=model, optimizer=opt, sampler=sampler, step=0)
        state.step += 1          # each entry is an attribute

    Objects with ``state_dict``/``load_state_dict`` (models, optimizers, samplers) are
    restored in place; tensors are copied in place (a symmetric tensor keeps its heap
    offset, and a newcomer's entry becomes its copy at that offset); anything else is a
    plain value, deep-copied. ``last_sync``: bytes, receivers and seconds of the last
    ``sync``."""

    def __init__(self, **objects):
        object.__setattr__(self, "_objects", dict(objects))
        object.__setattr__(self, "_committed", {})
        object.__setattr__(self, "owed", False)  # a grow happened; the next step syncs
        object.__setattr__(self, "last_sync", None)
        object.__setattr__(self, "events", [])  # grows that failed and were skipped
        self.commit()

    def __getattr__(self, name: str):
        objects = object.__getattribute__(self, "_objects")
        if name in objects:
            return objects[name]
        raise AttributeError(f"State has no entry {name!r} (entries: {', '.join(objects)})")

    def __setattr__(self, name: str, value) -> None:
        if name in ("owed", "last_sync"):
            object.__setattr__(self, name, value)
        elif name in self._objects:
            self._objects[name] = value
        else:
            raise AttributeError(f"State has no entry {name!r}; name every entry when "
                                 f"making the State")

    def commit(self) -> None:
        """Snapshot every entry in memory (``step`` does it after each good step)."""
        snap = {}
        for name, obj in self._objects.items():
            kind = _kind(obj)
            if kind == "object":
                snap[name] = copy.deepcopy(obj.state_dict())
            elif kind == "tensor":
                snap[name] = obj.detach().clone()
            else:
                snap[name] = copy.deepcopy(obj)
        object.__setattr__(self, "_committed", snap)

    def restore(self) -> None:
        """Roll every entry back to the last commit."""
        for name, snap in self._committed.items():
            obj = self._objects[name]
            kind = _kind(obj)
            if kind == "object":
                obj.load_state_dict(copy.deepcopy(snap))
            elif kind == "tensor":
                with torch.no_grad():
                    obj.copy_(snap)
            else:
                self._objects[name] = copy.deepcopy(snap)

    def _payload(self) -> bytes:
        comm = get_communicator()
        out: dict[str, tuple] = {}
        for name, obj in self._objects.items():
            kind = _kind(obj)
            if kind == "object":
                out[name] = ("object", obj.state_dict())
            elif kind == "tensor":
                out[name] = ("tensor", obj.detach().clone(), comm.heap.offset_of(obj))
            else:
                out[name] = ("value", obj)
        buf = io.BytesIO()
        torch.save(out, buf)
        return buf.getvalue()

    def _load(self, payload: bytes) -> None:
        got = torch.load(io.BytesIO(payload), weights_only=False)  # from a rank of this world
        if set(got) != set(self._objects):
            raise CommlabUsageError(
                f"State.sync: the sender's entries ({', '.join(sorted(got))}) differ from "
                f"this rank's ({', '.join(sorted(self._objects))}); make the State with "
                f"the same names on every rank")
        comm = get_communicator()
        for name, (kind, data, *rest) in got.items():
            obj = self._objects[name]
            if kind == "object":
                obj.load_state_dict(data)
            elif kind == "tensor":
                held = _grow.inherited(comm, rest[0], data.shape, data.dtype) \
                    if rest[0] is not None else None
                if held is not None:  # a symmetric tensor: ours at the same offset
                    obj = self._objects[name] = held
                elif not isinstance(obj, torch.Tensor) or obj.shape != data.shape:
                    raise CommlabUsageError(
                        f"State.sync: entry {name!r} is a tensor of shape "
                        f"{tuple(data.shape)} on the sender; give this rank a tensor of "
                        f"that shape" + (" (the sender's is symmetric: allocate it before "
                                         "the grow)" if rest[0] is not None else ""))
                with torch.no_grad():
                    obj.copy_(data)
            else:
                self._objects[name] = data

    def sync(self, src: int = 0) -> int:
        """Send rank ``src``'s state to every rank over commlab's broadcast; the ranks
        that joined since their last sync load it. Collective; returns the bytes sent."""
        comm = get_communicator()
        t0 = time.perf_counter()
        payload = self._payload() if comm.rank == src else b""
        n = int(broadcast(torch.tensor([len(payload)], dtype=torch.int32), src=src)[0])
        words = torch.zeros((n + 3) // 4, dtype=torch.int32)
        if comm.rank == src:
            words.view(torch.uint8)[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        got = broadcast(words, src=src)
        if _grow.PENDING_STATE[0]:
            self._load(bytes(got.view(torch.uint8)[:n].numpy()))
            _grow.PENDING_STATE[0] = False
        self.commit()
        self.owed = False
        self.last_sync = {"bytes": n, "receivers": comm.world_size - 1,
                          "seconds": time.perf_counter() - t0}
        return n
