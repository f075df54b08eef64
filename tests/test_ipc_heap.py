"""The IPC heap's bookkeeping (runtime/_ipc_heap.py), on CPU ranks: the handle exchange,
the open/close/free order, and the refusals every rank raises alike. The driver is
POSIX shared memory (tests/worlds/ipc_heap.py), so mappings and stamps are real; the
CUDA driver itself runs in the GPU suite (bench/checks/gpu_shared_suite.py)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from commlab.errors import CommlabUsageError
from commlab.runtime._ipc_heap import CLOSED, OPEN, IpcHeap, Offer
from tests.conftest import shm_files
from tests.worlds.ipc_heap import failed_open_world, layout_world, maps_and_frees_world


def test_every_rank_maps_every_peer_and_frees_only_after_every_peer_closed(world):
    out = world(maps_and_frees_world, 3, 1)
    for r, res in enumerate(out):
        assert res["seen"] == [1000, 1001, 1002], f"rank {r} read {res['seen']} through bases"
        assert res["distinct"]
        opens = [p for e, p in res["events"] if e == "open"]
        closes = [p for e, p in res["events"] if e == "close"]
        peers = [p for p in range(3) if p != r]
        assert opens == peers, f"rank {r} opened {opens}: peers in rank order"
        assert closes == peers[::-1], f"rank {r} closed {closes}: reverse order"
        assert res["events"][0] == ("alloc", r) and res["events"][-1] == ("free", r)
        assert res["left_open"] == 0 and res["own"] == 0
    slow_close = out[1]["t_close"]
    for r in (0, 2):  # they closed at once, but freed only once rank 1 had closed
        assert out[r]["t_free"] >= slow_close, (r, out[r]["t_free"], slow_close)
        assert out[r]["t_free"] - out[r]["t_close"] > 0.8
    assert shm_files(out[0]["token"]) == []  # every rank's heap freed


def test_a_different_heap_layout_is_refused_on_every_rank_and_nothing_stays_mapped(world):
    out = world(layout_world, 3)
    for r, res in enumerate(out):
        assert not res["built"]
        assert "heap layout differs across ranks" in res["error"], res["error"]
        assert "ranks [1]: heap 131072 B" in res["error"], res["error"]
        assert "same heap_size" in res["error"]
        assert res["maps_left"] == 0, f"rank {r} kept {res['maps_left']} mappings"


def test_a_failed_open_on_one_rank_is_raised_on_every_rank_after_undoing(world):
    out = world(failed_open_world, 3)
    for r, res in enumerate(out):
        assert not res["built"]
        assert "rank 2 could not open rank 0's heap" in res["error"], res["error"]
        assert res["maps_left"] == 0 and res["open_left"] == 0, (r, res)


class _Recorder:
    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.next = 0x1000

    def alloc(self, nbytes):
        self.calls.append(("alloc", nbytes))
        self.next += 0x1000
        return self.next

    def export(self, ptr):
        return ptr.to_bytes(8, "little").ljust(64, b"\0")

    def open(self, handle):
        self.calls.append(("open", int.from_bytes(handle[:8], "little")))
        return int.from_bytes(handle[:8], "little") + 0x100000

    def close(self, ptr):
        self.calls.append(("close", ptr))

    def free(self, ptr):
        self.calls.append(("free", ptr))


def _two_rank_heap(peer_pid: int, close_wait: float):
    """Rank 0 of two, the peer's offer made up (pid ``peer_pid``, its word OPEN)."""
    driver, words = _Recorder(), np.zeros(4, dtype=np.int64)
    words[2:] = (peer_pid, OPEN)
    peer = Offer(1, peer_pid, "gpu-0", (1 << 16, 1 << 12), (0x77).to_bytes(8, "little") * 8)

    def exchange(obj):
        return [obj, peer] if isinstance(obj, Offer) else [obj, ""]

    heap = IpcHeap(driver, 0, 2, (1 << 16, 1 << 12), "gpu-0", exchange, words,
                   close_wait=close_wait)
    return heap, driver, words


def test_a_peer_whose_process_is_gone_does_not_hold_the_free():
    p = subprocess.Popen(["true"])
    p.wait()  # reaped: its pid names no process now
    heap, driver, words = _two_rank_heap(p.pid, close_wait=30.0)
    heap.close()
    assert [c[0] for c in driver.calls] == ["alloc", "open", "close", "free"]
    assert words[1] == CLOSED


def test_a_live_peer_that_never_closes_leaves_our_heap_to_the_process_exit(capsys):
    heap, driver, _ = _two_rank_heap(os.getpid(), close_wait=0.2)
    heap.close()
    assert [c[0] for c in driver.calls] == ["alloc", "open", "close"]  # no free
    assert "stays allocated until this process exits: rank [1] still map" in \
        capsys.readouterr().err


def test_offers_with_the_same_handle_twice_are_refused():
    driver, words = _Recorder(), np.zeros(4, dtype=np.int64)

    def exchange(obj):
        return [obj, Offer(1, 1, "gpu-0", obj.layout, obj.handle)]

    with pytest.raises(CommlabUsageError, match="same IPC handle"):
        IpcHeap(driver, 0, 2, (1 << 16, 1 << 12), "gpu-0", exchange, words)
    assert [c[0] for c in driver.calls] == ["alloc", "free"]
