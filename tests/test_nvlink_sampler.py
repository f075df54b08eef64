"""NvlinkSampler's reader process: rates reach the callback, stop() leaves no process,
and a reader that dies is reported (NVML itself is exercised by the GPU tests)."""

from __future__ import annotations

import time

import psutil
import pytest

from commlab import topology as T
from commlab.topology.nvlink_counters import NvlinkSampler, link_map

KIB_PER_READ = 1 << 20  # 1 GiB more per link and read


def steady_counters(links):
    """A counter source: every link's TX grows by KIB_PER_READ per read."""
    n = [0]

    def read():
        n[0] += 1
        return [[g, lk, n[0] * KIB_PER_READ, 0] for g, lk in links]

    return read, lambda: None


def failing_counters(links):
    def read():
        raise RuntimeError("NVML exploded")

    return read, lambda: None


def _wait(cond, timeout=20.0):
    t_end = time.monotonic() + timeout
    while not cond() and time.monotonic() < t_end:
        time.sleep(0.05)
    return cond()


def test_sampler_turns_reader_counters_into_edge_rates_and_stops_its_process():
    topo = T.sample("2xh200-nv18")
    got = []
    s = NvlinkSampler(topo, got.append, interval=0.05,
                      source="tests.test_nvlink_sampler:steady_counters").start()
    pid = s.pid
    try:
        assert _wait(lambda: len(got) >= 3), s.error
    finally:
        s.stop()
    assert set(got[-1]) == {("gpu0", "gpu1")}
    # 18 links x 1 GiB per read, at most one read per 0.05 s (plus scheduling)
    assert 0 < got[-1][("gpu0", "gpu1")] <= 18 * (1 << 30) / 0.05 / 1e9 * 1.01
    assert s.error is None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_reader_that_dies_is_reported_with_its_exit_code():
    topo = T.sample("2xh200-nv18")
    told = []
    s = NvlinkSampler(topo, lambda r: None, interval=0.05, on_error=told.append,
                      source="tests.test_nvlink_sampler:failing_counters").start()
    try:
        assert _wait(lambda: s.error is not None)
    finally:
        s.stop()
    assert "exited with code" in s.error and "NVML exploded" in s.error
    assert told == [s.error]


def test_the_explorer_shows_why_live_rates_stopped():
    from commlab.widgets import TopologyExplorer

    x = TopologyExplorer(T.sample("2xh200-nv18"))
    x.show_error("the NVLink counter reader (pid 1) exited with code 1: <boom>")
    assert "exited with code 1" in x.status.value and "&lt;boom&gt;" in x.status.value


def test_sampler_refuses_a_topology_without_link_indices():
    topo = T.sample("4xpcie")
    assert not link_map(topo)
    with pytest.raises(RuntimeError, match="no NVLink links"):
        NvlinkSampler(topo, lambda r: None)
