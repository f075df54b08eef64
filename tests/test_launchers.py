"""The notebook engine across hosts: ``%dist_start --launcher ssh|mpi`` on 2 simulated hosts
(tests/_hosts.py) x 2 ranks, the notebook itself on host 0 (tests/worlds/notebook.py).

Each host runs an sshd this test starts (its own host key and client key in a temp dir,
port 22 inside the host's namespace); ``COMMLAB_SSH_ARGS`` hands the key to ssh, scp and
mpirun's remote agent. One world per launcher, several checks per world: output grouped
across hosts, a grouped error, a hang on a remote rank diagnosed with its stack and
recovered, restart and stop leaving nothing behind (ssh); a SIGKILLed notebook whose
remote engines end by themselves (mpi). Needs root; skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("IPython", reason="the notebook extras are not installed")

from commlab.errors import CommlabUsageError
from tests import _hosts
from tests.engine_helpers import alive

ROOT = Path(__file__).resolve().parent.parent
SSHD = "/usr/sbin/sshd"


def _why_not(launcher: str) -> str:
    why = _hosts.unavailable()
    if why:
        return why
    for tool in ("ssh", "scp", "ssh-keygen", SSHD) + (("mpirun",) if launcher == "mpi" else ()):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (.ci/run installs openssh-server, openmpi-bin)"
    return ""


def _sshd(host: _hosts.Host, keys: str) -> list[str]:
    opts = {"ListenAddress": host.addr, "Port": "22", "HostKey": f"{keys}/host_key",
            "AuthorizedKeysFile": f"{keys}/client_key.pub", "StrictModes": "no",
            "PermitRootLogin": "yes", "UsePAM": "no", "PasswordAuthentication": "no",
            "PidFile": "none", "Subsystem": "sftp internal-sftp", "MaxStartups": "100"}
    return [SSHD, "-D", "-e", "-f", "/dev/null",
            *[a for k, v in opts.items() for a in ("-o", f"{k}={v}")]]


def _ssh_args(keys: str) -> list[str]:
    return ["-i", f"{keys}/client_key", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]


def _on(host: _hosts.Host, keys: str, target: _hosts.Host, cmd: str) -> str:
    """``cmd`` run on ``target`` over ssh (its sshd's mount namespace: its /dev/shm)."""
    r = subprocess.run(host.argv(["ssh", *_ssh_args(keys), target.name, cmd]),
                       capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


@contextmanager
def _notebook(launcher: str, end: str, timeout: float):
    """Start sshds and the notebook on host 0; yield (hosts, keys, proc, read)."""
    why = _why_not(launcher)
    if why:
        pytest.skip(why)
    made_run = not os.path.isdir("/run/sshd")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    keys = tempfile.mkdtemp(prefix="commlab-test-ssh-")
    try:
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            f"{keys}/{name}"], check=True)
        with _hosts.simulated_hosts(2) as hosts:
            for h in hosts:
                h.popen(_sshd(h, keys), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            spec = ",".join(f"{h.name}:2" for h in hosts)
            out = os.path.join(keys, "notebook.json")
            env = {"COMMLAB_SSH_ARGS": " ".join(_ssh_args(keys)), "COMMLAB_BACKEND": "cpu",
                   "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "COMMLAB_TIMEOUT": "60",
                   "COMMLAB_WORLD_KEY": os.urandom(16).hex()}
            log = open(os.path.join(keys, "notebook.log"), "w+")  # noqa: SIM115
            deadline = time.monotonic() + 20
            while "ok" not in _on(hosts[0], keys, hosts[1], "echo ok"):  # sshds are up
                assert time.monotonic() < deadline, "the test's sshd did not start"
                time.sleep(0.3)
            proc = hosts[0].popen([sys.executable, "-m", "tests.worlds.notebook", out,
                                   f"--launcher {launcher} --hosts {spec}", end],
                                  env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

            def read(key: str) -> dict:
                t_end = time.monotonic() + timeout
                while time.monotonic() < t_end:
                    got = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
                    if got.get(key) or proc.poll() is not None:
                        break
                    time.sleep(0.5)
                log.seek(0)
                if not got.get(key):
                    steps = {k: (v["error"], v["stdout"][-500:])
                             for k, v in got.get("steps", {}).items()}
                    pytest.fail(f"the notebook did not get to {key!r}: {steps}\n"
                                f"{log.read()[-5000:]}", pytrace=False)
                return got

            yield hosts, keys, proc, read
    finally:
        shutil.rmtree(keys, ignore_errors=True)
        if made_run:
            shutil.rmtree("/run/sshd", ignore_errors=True)


def _check_cells(got: dict, hosts) -> None:
    s = got["steps"]
    print("seconds per step:", {k: v["s"] for k, v in s.items()})
    assert not s["start"]["error"], s["start"]
    assert "world of 4 ranks on 2 hosts started" in s["start"]["stdout"], s["start"]
    ranks = got["worlds"][0]["ranks"]
    assert [h for _, h, _ in ranks] == [hosts[0].name] * 2 + [hosts[1].name] * 2, ranks
    assert got["worlds"][0]["hub"][0] == hosts[0].addr  # not 0.0.0.0, not loopback
    assert got["worlds"][0]["relay"][0] == hosts[0].addr
    assert hosts[1].name in s["status"]["stdout"], s["status"]
    out = s["all_reduce"]["stdout"]
    assert f"[ranks 0, 1] {hosts[0].name}" in out and f"[ranks 2, 3] {hosts[1].name}" in out
    assert "sum [10.0, 10.0]" in out and "[ranks 0-3] local 2" in out, out
    err = s["error"]["error"]
    assert "rank 3" in err and "boom on rank 3" in err and "ValueError" in err, err
    hang = s["hang"]["error"]
    assert hang.startswith("HangError") and "[rank 3] blocked in commlab.all_reduce" in hang
    assert "the world recovered" in hang, hang
    assert "[ranks 0-3] sum [4.0]" in s["after_hang"]["stdout"], s["after_hang"]
    assert got["prompts"] == ["[rank 3] (Pdb) "] * 2, got["prompts"]  # over the relay
    out = s["debugger"]["stdout"]
    assert "[rank 3] 48" in out and "[rank 3] after 24" in out and "[rank 0] after 21" in out


def _left_behind(got: dict, hosts, keys: str) -> list[str]:
    bad = [f"process {p}" for w in got["worlds"] for p in alive(w["pids"])]
    bad += [f"dir {d}" for w in got["worlds"] for d in w["dirs"] if os.path.exists(d)]
    for h in hosts:
        shm = _on(hosts[0], keys, h, "ls -A /dev/shm").split()
        bad += [f"{h.name}:/dev/shm/{n}" for n in shm]
    return bad


def _until_clean(got, hosts, keys, limit: float) -> list[str]:
    deadline = time.monotonic() + limit
    while (bad := _left_behind(got, hosts, keys)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return bad


def test_ssh_world_across_hosts_runs_cells_recovers_restarts_and_leaves_nothing():
    with _notebook("ssh", "stop", timeout=420) as (hosts, keys, proc, read):
        got = read("done")
        _check_cells(got, hosts)
        s = got["steps"]
        assert "must keep the same number of ranks each" in s["uneven"]["error"], s["uneven"]
        out = s["after_shrink"]["stdout"]  # one rank left on each host
        assert f"[rank 0] {hosts[0].name}" in out and f"[rank 1] {hosts[1].name}" in out
        assert "[ranks 0, 1] sum [2.0]" in out, (s["shrink"], s["after_shrink"])
        assert "can shrink but not grow" in s["grow"]["error"], s["grow"]
        assert not s["restart"]["error"] and "world of 4 ranks on 2 hosts" in \
            s["restart"]["stdout"], s["restart"]
        assert "[ranks 0-3] sum [4.0]" in s["after_restart"]["stdout"], s["after_restart"]
        old, new = ({p for _, _, p in w["ranks"]} for w in got["worlds"])
        assert not old & new
        proc.wait(60)
        assert _until_clean(got, hosts, keys, 10) == []


def test_mpi_world_across_hosts_ends_by_itself_when_the_notebook_is_killed():
    with _notebook("mpi", "wait", timeout=300) as (hosts, keys, proc, read):
        got = read("ready")
        _check_cells(got, hosts)
        remote = [p for _, h, p in got["worlds"][0]["ranks"] if h == hosts[1].name]
        assert alive(remote) == remote
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)  # the notebook (its own session: only it)
        assert _until_clean(got, hosts, keys, 10) == [], "left behind by a killed notebook"
        print(f"remote engines ended {time.monotonic() - t0:.1f} s after the kill")


@pytest.mark.parametrize("args, match", [
    (dict(launcher="pbs"), "--launcher must be one of local, ssh, mpi, slurm, got 'pbs'"),
    (dict(launcher="local", hosts="a:2"), "the local launcher runs every rank on this"),
    (dict(launcher="ssh"), "--launcher ssh needs --hosts"),
    (dict(launcher="ssh", hosts="a,b,c"), "4 ranks do not divide evenly over 3 hosts"),
    (dict(launcher="ssh", hosts="a:1,b:2"), "must be given for every host and add up to 4"),
    (dict(launcher="ssh", hosts="a:0,b:4"), "is not HOST or HOST:RANKS"),
    (dict(launcher="ssh", hosts="a:2,a:2"), "names a host twice"),
    (dict(launcher="ssh", hosts="a:1,b:3"), "the same number of ranks on every host"),
    (dict(launcher="slurm", hosts="a:4"), "places ranks itself"),
])
def test_launch_flags_are_checked_before_anything_starts(args, match):
    from commlab.engine._launch import plan_launch

    with pytest.raises(CommlabUsageError, match=match.replace("-", r"\-")):
        plan_launch(4, ip="10.0.0.1", **args)


def test_a_missing_launcher_tool_is_named(monkeypatch):
    from commlab.engine._launch import plan_launch

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CommlabUsageError, match="needs `mpirun` on this machine's PATH"):
        plan_launch(4, "mpi", "a:2,b:2", ip="10.0.0.1")


def test_slurm_and_mpi_launchers_run_the_engine_entry_with_the_hub_environment(monkeypatch):
    """Slurm is wired, not run here: its engine set runs _proc.py, mpirun gets the counts,
    the forwarded environment (hub address and token) and ssh as its remote agent."""
    import ipyparallel.cluster.launcher as ipl

    from commlab.engine._launch import LaunchPlan, make_cluster, mpi_args

    monkeypatch.setenv("COMMLAB_SSH_ARGS", "-i /k -o BatchMode=yes")
    with tempfile.TemporaryDirectory() as d:
        cluster, _ = make_cluster("t", d, LaunchPlan("slurm", [], "10.0.0.1"))
        es = cluster.engine_launcher_class(config=cluster.config, profile_dir=d,
                                           cluster_id="t")
        assert isinstance(es, ipl.SlurmEngineSetLauncher)
        assert es.engine_cmd[1].endswith("commlab/engine/_proc.py") and \
            es.engine_cmd[2] == "engine"
        assert cluster.controller_ip == "10.0.0.1"
    args = mpi_args(LaunchPlan("mpi", [("a", 2), ("b", 2)], "10.0.0.1"))
    assert args[:2] == ["--host", "a:2,b:2"]
    assert ["-x", "CL_ENGINE_HUB"] == args[2:4] and "CL_ENGINE_TOKEN" in args
    assert args[args.index("plm_rsh_agent") + 1] == "ssh -i /k -o BatchMode=yes"


AGENT = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("agent", sys.argv[1])
agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agent)
agent.start_agent(sys.argv[2], sys.argv[3], "")
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    time.sleep(60)
"""


def _agent_process(hub):
    proc_py = ROOT / "commlab" / "engine" / "_proc.py"
    return subprocess.Popen([sys.executable, "-c", AGENT, str(proc_py),
                             f"{hub.host}:{hub.port}", hub.token],
                            stdout=subprocess.PIPE, text=True)


def test_the_hub_gets_stacks_interrupts_and_ends_an_agent_when_it_closes():
    import socket

    from commlab.engine._hub import Hub

    hub = Hub("127.0.0.1")
    p = _agent_process(hub)
    try:
        agent = hub.agent(socket.gethostname(), p.pid, timeout=20)
        [reply] = hub.ask([agent], "stacks", timeout=5)
        assert reply is not None
        assert 'File "<string>", line 8 in <module>' in reply["stacks"] and reply["waits"] == []
        hub.ask([agent], "signal", timeout=5, sig=signal.SIGINT)
        assert p.stdout is not None and p.stdout.readline().strip() == "interrupted"
        hub.close()  # the notebook is gone: the agent ends its process
        assert p.wait(10) == 0
    finally:
        hub.close()
        if p.poll() is None:
            p.kill()
            p.wait()


def test_the_hub_and_the_agent_each_refuse_a_peer_without_the_token():
    import json
    import socket
    import threading

    from commlab.engine._hub import Hub

    hub = Hub("127.0.0.1")
    with socket.create_connection((hub.host, hub.port), timeout=5) as s:
        f = s.makefile("rb")
        assert "nonce" in json.loads(f.readline())
        s.sendall(json.dumps({"mac": "0" * 64, "nonce": "n", "host": "x", "pid": 1})
                  .encode() + b"\n")
        assert f.readline() == b""  # closed, nothing answered
    assert hub.rejected == 1 and hub.agents == {}
    hub.close()

    import importlib.util

    spec = importlib.util.spec_from_file_location("agent", ROOT / "commlab/engine/_proc.py")
    assert spec is not None and spec.loader is not None
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    fake = socket.create_server(("127.0.0.1", 0))

    def impostor():
        conn, _ = fake.accept()
        conn.sendall(b'{"nonce": "abc"}\n')
        conn.makefile("rb").readline()
        conn.sendall(b'{"mac": "guess"}\n')
        conn.close()

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(ConnectionError, match="did not prove it knows the world's token"):
        agent.connect_agent(f"127.0.0.1:{fake.getsockname()[1]}", "the-token")
    fake.close()
