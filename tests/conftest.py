"""Shared fixtures: launch a world of CPU ranks, pick a seed, see commlab's shm files."""

from __future__ import annotations

import os
import secrets

import pytest

# online selection off unless a test turns it on: tests that ask "auto" expect the table
os.environ.setdefault("COMMLAB_ADAPT", "0")

import commlab  # noqa: E402, F401  (before any kernel is defined: picks Triton's interpreter)
from commlab.testing import WorldError, run_world


@pytest.fixture
def world():
    """``world(fn, world_size, *args, timeout=180, env=None)``: run ``fn(comm, *args)`` on
    a fresh world of CPU ranks and return the per-rank results; a failing rank fails the
    test with every rank's traceback."""

    def launch(fn, world_size, *args, timeout=180, env=None, init=True, **kwargs):
        try:
            return run_world(fn, world_size, args=args, kwargs=kwargs, timeout=timeout,
                             env={"COMMLAB_TIMEOUT": "60", **(env or {})}, init=init)
        except WorldError as e:
            pytest.fail(str(e), pytrace=False)

    return launch


@pytest.fixture
def seed(request):
    """A fresh random seed per test, printed on failure; COMMLAB_TEST_SEED replays one."""
    value = int(os.environ.get("COMMLAB_TEST_SEED") or secrets.randbelow(1 << 30))
    request.node.user_properties.append(("seed", value))
    print(f"seed={value} (replay with COMMLAB_TEST_SEED={value})")
    return value


def shm_files(token: str = "") -> list[str]:
    """commlab's segments in /dev/shm (those of one world when ``token`` is given)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(f"commlab-{token}"))


def assert_checks(results: list[dict], section: str) -> None:
    """Every rank ran ``section``'s checks and none failed (rank functions return
    ``tests.worlds._checks.Checks.result()``)."""
    ran = [r["ran"].get(section, 0) for r in results]
    assert all(ran), f"section {section!r} ran no checks on some rank: {ran}"
    failures = [f for r in results for f in r["failures"].get(section, [])]
    if failures:
        shown = "\n".join(failures[:8])
        more = f"\n... and {len(failures) - 8} more" if len(failures) > 8 else ""
        pytest.fail(f"{len(failures)} failed checks in {section!r}:\n{shown}{more}",
                    pytrace=False)
