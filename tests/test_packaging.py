"""The magics folder installs as commlab.magics (editable and from a wheel), and ranks
never import IPython."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAGICS = ["__init__.py", "_args.py", "bench.py", "dist.py", "observe.py"]

LOAD_EXT = textwrap.dedent("""
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "commlab")
    import commlab, commlab.magics
    with capture_output() as cap:
        ip.run_line_magic("topology", "--sample 2xh200-nv18 --text")
    magics = ip.magics_manager.magics
    print(json.dumps({"commlab": commlab.__file__, "magics": commlab.magics.__file__,
                      "line": sorted(magics["line"]), "cell": sorted(magics["cell"]),
                      "topology": cap.stdout}))
""")


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> dict:
    import json

    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_magics_registered(got: dict) -> None:
    for name in ("dist_start", "dist_stop", "dist_restart", "dist_push", "dist_pull",
                 "topology", "linkbench", "commbench"):
        assert name in got["line"], f"%{name} not registered"
    assert "distributed" in got["cell"]
    assert "2xh200" in got["topology"] or "GPU0" in got["topology"], got["topology"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built offline from a copy of the sources (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("commlab", "magics"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    dist = tmp_path_factory.mktemp("dist")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "--no-index", "-q", "-w", str(dist), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (whl,) = dist.glob("commlab-*.whl")
    return whl


def test_wheel_holds_the_magics_as_commlab_magics_and_every_commlab_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in MAGICS:
        assert f"commlab/magics/{f}" in names
    assert not any(n.startswith("magics/") for n in names), "magics/ must not be top level"
    packages = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "commlab").rglob(
        "__init__.py") if "__pycache__" not in p.parts)
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing, (f"{missing} not in the wheel: add them to [tool.setuptools] "
                         f"packages in pyproject.toml")
    assert "commlab/topology/data/2xh200-nv18.json" in names  # package data


def test_load_ext_commlab_works_from_the_built_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # -I -S: no checkout on sys.path and no .pth files (the editable finder stays out);
    # the wheel first, then the venv's site-packages for torch, IPython, ...
    deps = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    boot = f"import sys; sys.path[:0] = [{str(site)!r}]; sys.path += {deps!r}\n"
    env = dict(os.environ, COMMLAB_BACKEND="cpu")
    got = _run([sys.executable, "-I", "-S", "-c", boot + LOAD_EXT], tmp_path, env)
    assert Path(got["commlab"]).is_relative_to(site)
    assert got["magics"] == str(site / "commlab" / "magics" / "__init__.py")
    _assert_magics_registered(got)


def test_load_ext_commlab_works_in_the_editable_install(tmp_path):
    env = dict(os.environ, COMMLAB_BACKEND="cpu")
    got = _run([sys.executable, "-c", LOAD_EXT], tmp_path, env)  # cwd: not the checkout
    assert got["magics"] == str(ROOT / "magics" / "__init__.py"), (
        f"commlab.magics came from {got['magics']}: the editable install predates the "
        f"magics/ folder; run `python -m pip install --no-deps -e .`")
    _assert_magics_registered(got)


RANK = textwrap.dedent("""
    import os, socket, sys
    def loaded():
        return sorted(m for m in sys.modules
                      if m.split(".")[0] in ("IPython", "ipykernel", "ipyparallel"))
    import commlab
    assert loaded() == [], ("import commlab", loaded())
    from commlab.engine import _worker
    assert loaded() == [], ("import commlab.engine._worker", loaded())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    info = _worker.join(0, 1, "127.0.0.1", port, "cpu", 0, 1, None, 60.0)
    assert info["rank"] == 0 and info["backend"] == "cpu", info
    assert loaded() == [], ("_worker.join", loaded())
    _worker.leave()
    print("ok")
""")


def test_a_rank_never_imports_ipython(tmp_path):
    env = dict(os.environ, COMMLAB_BACKEND="cpu")
    out = subprocess.run([sys.executable, "-c", RANK],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
