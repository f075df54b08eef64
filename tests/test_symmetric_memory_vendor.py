"""The cuda backend's heap needs torch's symmetric memory: on a ROCm build of PyTorch
(``torch.version.hip`` set) it is used the same way when present, else a clear error."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from commlab.errors import CommlabUsageError
from commlab.runtime._heaps import symmetric_memory

MOD = "torch.distributed._symmetric_memory"


def test_rocm_build_without_symmetric_memory_names_rocm_and_the_module(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setitem(sys.modules, MOD, None)  # import raises ImportError
    with pytest.raises(CommlabUsageError, match=r"_symmetric_memory.*ROCm 6\.4\.1"):
        symmetric_memory()


def test_rocm_build_with_symmetric_memory_uses_it(monkeypatch):
    fake = types.ModuleType(MOD)
    fake.empty = fake.rendezvous = lambda *a, **k: None
    monkeypatch.setattr(torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setitem(sys.modules, MOD, fake)
    monkeypatch.setattr(torch.distributed, "_symmetric_memory", fake, raising=False)
    assert symmetric_memory() is fake


def test_build_whose_symmetric_memory_lacks_rendezvous_says_what_is_missing(monkeypatch):
    fake = types.ModuleType(MOD)
    fake.empty = lambda *a, **k: None
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setitem(sys.modules, MOD, fake)
    monkeypatch.setattr(torch.distributed, "_symmetric_memory", fake, raising=False)
    with pytest.raises(CommlabUsageError, match=r"CUDA .*lacks rendezvous"):
        symmetric_memory()
