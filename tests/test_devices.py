"""Placement of ranks on GPUs (runtime/_devices.py): who shares a GPU, which heap a world
gets, and the errors for a bad COMMLAB_DEVICE or a heap that cannot serve shared GPUs."""

from __future__ import annotations

import pytest
import torch

from commlab.errors import CommlabUsageError
from commlab.runtime import _devices
from commlab.runtime._devices import Placement


def test_ranks_on_one_gpu_share_it_and_get_the_ipc_heap():
    p = Placement(("GPU-a", "GPU-a", "GPU-a", "GPU-a"))
    assert p.shared and p.groups() == [[0, 1, 2, 3]] and p.sharing(2) == [0, 1, 2, 3]
    assert p.heap() == "ipc"
    assert p.describe().startswith("4 ranks share one GPU (4 per GPU)")
    assert "not representative" in p.describe()


def test_one_gpu_per_rank_gets_symmetric_memory_unless_ipc_is_asked(monkeypatch):
    p = Placement(("GPU-a", "GPU-b"))
    assert not p.shared and p.groups() == [] and p.describe() == ""
    assert p.heap() == "symmetric"
    monkeypatch.setenv("COMMLAB_HEAP", "ipc")
    assert p.heap() == "ipc"


def test_two_pairs_on_two_gpus_are_described_per_gpu():
    p = Placement(("GPU-a", "GPU-b", "GPU-a", "GPU-b"))
    assert p.groups() == [[0, 2], [1, 3]] and p.sharing(1) == [1, 3]
    assert p.describe().startswith("4 ranks share 2 GPUs (2 per GPU)")


def test_symmetric_heap_on_a_shared_gpu_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("COMMLAB_HEAP", "symmetric")
    with pytest.raises(CommlabUsageError, match=r"ranks \[0, 1\] share one GPU.*unset "
                                                r"COMMLAB_HEAP"):
        Placement(("GPU-a", "GPU-a")).heap()


def test_an_unknown_heap_is_refused(monkeypatch):
    monkeypatch.setenv("COMMLAB_HEAP", "nvshmem")
    with pytest.raises(CommlabUsageError, match="must be one of auto, symmetric, ipc"):
        Placement(("GPU-a",)).heap()


def test_cpu_ranks_share_nothing():
    p = Placement(("", "", ""))
    assert not p.shared and p.sharing(0) == []


def test_device_index_wraps_local_rank_and_checks_commlab_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [_devices.device_index(r) for r in range(5)] == [0, 1, 0, 1, 0]
    monkeypatch.setenv("COMMLAB_DEVICE", "1")
    assert _devices.device_index(0) == 1
    monkeypatch.setenv("COMMLAB_DEVICE", "2")
    with pytest.raises(CommlabUsageError, match=r"COMMLAB_DEVICE=2: this machine has 2 GPUs "
                                                r"\(indices 0..1\)"):
        _devices.device_index(0)


def test_no_gpu_means_no_device_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _devices.device_index(3) is None
