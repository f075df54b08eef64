"""Simulated hosts on one machine, for tests of worlds across hosts (needs root).

    with simulated_hosts(2) as hosts:             # namespaces, veths, addresses
        procs = [h.popen([sys.executable, "-m", ...]) for h in hosts]

Each host is a network namespace with its own address (10.77.X.(i+1)/24 on a veth whose
peer sits on a bridge in a switch namespace the helper also makes), its own hostname
(``unshare --uts``), its own /dev/shm (``unshare --mount`` + a tmpfs) and an /etc/hosts
naming every simulated host. Nothing is added to the machine's own namespace, so the
hosts can reach only each other: test traffic stays inside namespaces the test made.

Names carry the creating pid and a random tag (unique per run); leaving the block, also
on an exception, kills the processes started through ``Host.popen`` (by pid) and deletes
the namespaces (their veths and bridge go with them). Namespaces of a run whose process
is gone are swept on the next use. ``unavailable()`` says why this machine cannot make
them (not root, no ``ip``/``unshare``, namespaces refused), for a clean skip.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field

_NS_RE = re.compile(r"^commlab-(\d+)-[0-9a-f]+-(?:h\d+|sw)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def unavailable() -> str:
    """Why simulated hosts cannot be made here, or "" when they can."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, mounts)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}`, which is not installed"
    probe = f"commlab-{os.getpid()}-{secrets.token_hex(3)}-sw"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


def sweep() -> list[str]:
    """Delete simulated-host namespaces whose creating process no longer exists."""
    gone = []
    for ns in _namespaces():
        m = _NS_RE.match(ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _ip("netns", "del", ns, check=False)
            gone.append(ns)
    return gone


@dataclass
class Host:
    name: str  # hostname inside the host
    netns: str
    ifname: str  # its veth (GLOO_SOCKET_IFNAME)
    addr: str
    hosts_file: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def argv(self, cmd: list[str], shm_size: str = "512m") -> list[str]:
        """``cmd`` run on this host: its namespace, hostname, /dev/shm and /etc/hosts."""
        setup = (f"hostname {self.name} && mount -t tmpfs -o size={shm_size} tmpfs /dev/shm"
                 f" && mount --bind {self.hosts_file} /etc/hosts && exec \"$@\"")
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--mount",
                "--propagation", "private", "sh", "-c", setup, "sh", *cmd]

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` on this host; it is killed (by pid) when the hosts are removed."""
        env = {**os.environ, "GLOO_SOCKET_IFNAME": self.ifname, **kwargs.pop("env", {})}
        p = subprocess.Popen(self.argv(cmd), env=env, start_new_session=True, **kwargs)
        self.procs.append(p)
        return p


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, 9)  # its own session: the command and its children (by pid)
        except ProcessLookupError:
            pass
        p.wait(10)


@contextmanager
def simulated_hosts(n: int):
    """``n`` simulated hosts (see the module docstring); removed on leaving the block."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    sweep()
    tag = secrets.token_hex(2)
    net = secrets.randbelow(250) + 1
    base = f"commlab-{os.getpid()}-{tag}"
    made: list[str] = []
    hosts: list[Host] = []
    tmp = tempfile.mkdtemp(prefix=f"{base}-")
    try:
        switch = f"{base}-sw"
        _ip("netns", "add", switch)
        made.append(switch)
        bridge = f"cl{tag}br"
        _ip("-n", switch, "link", "add", bridge, "type", "bridge")
        _ip("-n", switch, "link", "set", bridge, "up")
        names = [f"host{i}-{tag}" for i in range(n)]
        hosts_file = os.path.join(tmp, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.writelines(f"10.77.{net}.{i + 1} {name}\n" for i, name in enumerate(names))
        for i, name in enumerate(names):
            ns, ifname, peer = f"{base}-h{i}", f"cl{tag}h{i}", f"cl{tag}s{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", ifname, "netns", ns, "type", "veth", "peer", "name", peer,
                "netns", switch)
            _ip("-n", switch, "link", "set", peer, "master", bridge)
            _ip("-n", switch, "link", "set", peer, "up")
            addr = f"10.77.{net}.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts.append(Host(name, ns, ifname, addr, hosts_file))
        yield hosts
    finally:
        for h in hosts:
            for p in h.procs:
                _kill(p)
        for ns in reversed(made):
            _ip("netns", "del", ns, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def torchrun_world(target: list[str], env: dict[str, str], log_dir: str, nhosts: int = 2,
                   per_host: int = 2, timeout: float = 300.0, port: int = 29400,
                   cwd: str | None = None) -> tuple[bool, str]:
    """``torchrun ... target`` on ``nhosts`` fresh simulated hosts x ``per_host`` ranks
    (``target``: ``["-m", module, args...]`` or a script and its args); waits up to
    ``timeout`` s. Returns whether every host's torchrun exited 0, and the tail of each
    host's output (logs kept in ``log_dir``) for a failure message."""
    import sys
    import time

    with simulated_hosts(nhosts) as hosts:
        logs = [open(os.path.join(log_dir, f"node{i}.log"), "w+") for i in range(nhosts)]
        procs = [h.popen([sys.executable, "-m", "torch.distributed.run", "--nnodes",
                          str(nhosts), "--node-rank", str(i), "--nproc-per-node",
                          str(per_host), "--master-addr", hosts[0].addr, "--master-port",
                          str(port), "--max-restarts", "0", *target],
                         env=env, cwd=cwd, stdout=logs[i], stderr=subprocess.STDOUT)
                 for i, h in enumerate(hosts)]
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.5)
        text = ""
        for i, f in enumerate(logs):
            f.seek(0)
            text += f"--- host {i} (exit {procs[i].poll()}) ---\n{f.read()[-6000:]}\n"
            f.close()
        return all(p.poll() == 0 for p in procs), text
