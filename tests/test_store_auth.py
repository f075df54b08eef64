"""The bootstrap store's HMAC wrapper on its less used paths: compare_set and clone, which
torch calls on some group and rendezvous paths (a TCPStore of this process, no world)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from commlab.errors import CommlabError
from commlab.runtime._auth import authenticated


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setenv("COMMLAB_WORLD_KEY", "test-key")
    inner = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return inner, authenticated(inner, "gen-1/")


def test_compare_set_sets_when_absent_swaps_when_equal_and_keeps_when_different(store):
    _, s = store
    assert s.compare_set("k", "", "a") == b"a"
    assert s.get("k") == b"a"
    assert s.compare_set("k", "a", "b") == b"b"
    assert s.compare_set("k", "not-the-value", "c") == b"b"  # the current value, unchanged
    assert s.get("k") == b"b"


def test_compare_set_refuses_a_value_a_client_without_the_key_wrote(store):
    inner, s = store
    inner.set("k", b"x" * 40)  # a stranger's write: no valid MAC
    with pytest.raises(CommlabError, match="fails its HMAC check"):
        s.compare_set("k", "b", "c")


def test_a_clone_shares_the_values_and_checks_them_the_same_way(store):
    inner, s = store
    twin = s.clone()
    twin.set("j", "v")
    assert s.get("j") == b"v"
    inner.set("j", b"y" * 40)
    with pytest.raises(CommlabError, match="fails its HMAC check"):
        twin.get("j")


def test_a_value_cannot_move_to_another_generation(store):
    inner, s = store
    s.set("k", "a")
    other = authenticated(inner, "gen-2/")
    with pytest.raises(CommlabError, match="gen-2/"):
        other.get("k")
