"""Reliability: the symmetric heap does not depend on garbage-collection timing, a failed
allocation leaves nothing behind, and errors say what is true."""

from __future__ import annotations

import time

from commlab.testing import run_world
from tests.worlds.faults import (
    bad_symm_at_world,
    failed_allocation_world,
    listeners_world,
    ping_loop_world,
)

ENV = {"COMMLAB_TIMEOUT": "60"}


def test_ping_loop_with_frees_at_rank_dependent_gc_moments_keeps_equal_offsets():
    res = run_world(ping_loop_world, 2, kwargs={"iters": 30}, timeout=240, env=ENV)
    assert [r["iters"] for r in res] == [30, 30]


def test_a_failed_allocation_kept_in_a_traceback_does_not_break_the_next_one():
    res = run_world(failed_allocation_world, 2, timeout=180, env=ENV)
    for r in res:
        assert "shape differs across ranks" in r["error"], r
        assert r["tb"] and r["ok"] == (32,)


_LOOPBACK = ("0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def test_after_init_no_rank_listens_on_a_non_loopback_address():
    res = run_world(listeners_world, 2, timeout=120, env=ENV)
    store = [a for a, p in res[0]["listening"] if p == res[0]["port"]]
    assert store and all(a in _LOOPBACK for a in store), res[0]
    for r in res:
        outside = [(a, p) for a, p in r["listening"] if a not in _LOOPBACK]
        assert not outside, r


def test_symm_at_with_a_peer_outside_the_world_or_a_non_heap_pointer_raises_not_segfaults():
    res = run_world(bad_symm_at_world, 2, timeout=120, env=ENV)
    for r in res:
        assert "peer 5 is outside the world (ranks 0..1)" in r["peer"], r
        assert "outside the symmetric heap" in r["pointer"], r


_JOIN = "import commlab; commlab.init(backend='cpu'); print('joined', flush=True)"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_store_value_overwritten_by_a_client_without_the_key_makes_init_fail_clearly():
    import datetime
    import os
    import subprocess
    import sys

    import torch.distributed as dist

    port = _free_port()
    # the store is served here, as torchrun's agent serves it; this test is also the
    # stranger: a client with no credentials that overwrites rank 0's GPU flag
    store = dist.TCPStore("127.0.0.1", port, None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, COMMLAB_BACKEND="cpu", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), COMMLAB_WORLD_KEY="this world's secret",
               TORCHELASTIC_USE_AGENT_STORE="true")

    def rank(r: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _JOIN], env=dict(env, RANK=str(r)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    r0 = rank(0)
    try:
        store.wait(["commlab/1/gpu/0"])
        store.set("commlab/1/gpu/0", "1")
        r1 = rank(1)
        out, err = r1.communicate(timeout=90)
    finally:
        r0.kill()
        r0.communicate()
    assert r1.returncode != 0 and "joined" not in out, (out, err)
    assert "CommlabError" in err and "'gpu/0'" in err and "fails its HMAC check" in err, err
    assert "COMMLAB_WORLD_KEY" in err, err


def test_200_idle_connections_to_the_debugger_relay_start_few_threads_and_a_rank_still_gets_in():
    import hashlib
    import hmac
    import json
    import socket
    import threading

    from commlab.engine._listener import MAX_PENDING
    from commlab.engine._relay import HELLO_TIMEOUT, Relay

    before = threading.active_count()
    relay = Relay()
    idle = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection((relay.host, relay.port)))
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_PENDING + 1, threading.active_count()
        time.sleep(HELLO_TIMEOUT + 0.5)  # the idle ones time out; they stay open on our side
        rank = socket.create_connection((relay.host, relay.port), timeout=10)
        f = rank.makefile("rb")
        nonce = json.loads(f.readline())["nonce"]
        mac = hmac.new(relay.token.encode(), nonce.encode(), hashlib.sha256).hexdigest()
        rank.sendall(json.dumps({"rank": 1, "mac": mac}).encode() + b"\n")
        rank.sendall(json.dumps({"out": "(Pdb) "}).encode() + b"\n")
        assert relay.events.get(timeout=10) == ("out", 1, "(Pdb) ")
        assert relay.rejected >= 100, relay.rejected  # closed on accept or at the timeout
        rank.close()
    finally:
        for s in idle:
            s.close()
        relay.close()


_KERNEL = """
import json, time
from commlab.engine._launch import launcher_pids
from commlab.engine._world import World
w = World(2, backend="cpu")
w.start()
print(json.dumps({"dir": w.stack_dir, "pids": launcher_pids(w.cluster),
                  "id": w.cluster.cluster_id}), flush=True)
time.sleep(600)
"""


def test_a_sigkilled_notebook_kernel_leaves_no_process_no_stack_dir_no_connection_file():
    import glob
    import json
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from tests.test_faults import assert_nothing_left

    kernel = subprocess.Popen([sys.executable, "-c", _KERNEL], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, COMMLAB_BACKEND="cpu"))
    try:
        info = json.loads(kernel.stdout.readline())
        assert os.path.isdir(info["dir"]) and info["pids"], info
        assert glob.glob(os.path.join(info["dir"], "**", f"*{info['id']}*"), recursive=True)
    finally:
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait()
    assert_nothing_left(info["pids"], wait=15)
    assert not os.path.exists(info["dir"]), os.listdir(info["dir"])
    home = os.path.expanduser("~/.ipython")
    left = [p for d in (tempfile.gettempdir(), home)
            for p in glob.glob(os.path.join(d, "**", f"*{info['id']}*"), recursive=True)]
    assert not left, left
