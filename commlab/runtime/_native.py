"""The launch plan's repeated call in C (``_fastcall.c``), built on first use.

A plan's steady-state call (the agreement's run-ahead word, an output nobody holds, the
launch) is a few dozen Python steps; ``_fastcall.Entry`` does the same steps in C and
hands anything else back to ``_plan.fast_call`` (returns None). ``_fastcall.Dispatch``
sits in front of a public collective (``_publish``): a call with the same arguments as
one a plan served before (same shape, dtype, device, parameters) goes to that plan's
Entry without entering Python at all. ``Plans`` (a communicator's plans) retires an
Entry whose plan leaves it, so nothing serves a stale plan. This module compiles the
C file with the compiler and Python headers Triton's own launcher needs, once per source
and interpreter, into ``$XDG_CACHE_HOME/commlab/native`` (``~/.cache`` by default;
``COMMLAB_NATIVE_DIR`` overrides), and builds one Entry per plan. ``COMMLAB_NATIVE=0``, or
no compiler, leaves every call on the Python path (said once, as a warning).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

import torch

from commlab import _config

SOURCE = Path(__file__).with_name("_fastcall.c")
_MODULE: list = []  # [module or None] once tried
_FREE: list = []  # [(tensor refs, storage refs)] of an output only a plan's lists hold


def _cache_dir() -> Path:
    explicit = _config.get("COMMLAB_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commlab" / "native"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which(
        "clang")


def build() -> Path:
    """Compile ``_fastcall.c`` (or find it compiled) and return the shared object's path;
    raises RuntimeError saying what is missing."""
    src = SOURCE.read_bytes()
    tag = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256(src + sys.version.encode() + tag.encode()).hexdigest()[:16]
    out = _cache_dir() / f"_fastcall-{key}{tag}"
    if out.exists():
        return out
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang on PATH, or CC)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include} (install the Python headers)")
    out.parent.mkdir(parents=True, exist_ok=True)
    # build beside the target, then rename: ranks building at once each finish whole
    fd, tmp = tempfile.mkstemp(suffix=tag, dir=out.parent)
    os.close(fd)
    cmd = [cc, "-O2", "-shared", "-fPIC", "-std=gnu11", f"-I{include}", str(SOURCE), "-o", tmp]
    if sys.platform == "darwin":
        cmd[1:1] = ["-undefined", "dynamic_lookup"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(path: Path) -> ModuleType:
    name = "commlab.runtime._fastcall"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def module() -> ModuleType | None:
    """The compiled ``_fastcall`` module, or None (off, or it could not be built)."""
    if _MODULE:
        return _MODULE[0]
    mod = None
    if _config.get("COMMLAB_NATIVE"):
        try:
            mod = load(build())
            mod.use_tensor_type(torch.Tensor)
        except Exception as e:  # noqa: BLE001 - any failure: the Python path, said once
            warnings.warn(f"commlab: the C fast path for repeated calls is off ({e}); calls "
                          f"take the Python launch plan (a few microseconds more each)",
                          RuntimeWarning, stacklevel=2)
    _MODULE.append(mod)
    return mod


def free_refs(mod) -> tuple[int, int]:
    """Py_REFCNT, as C reads it, of an output and its storage only ``Outputs`` holds."""
    if not _FREE:
        tensors = [torch.empty(1)]
        storages = [tensors[0].untyped_storage()]
        _FREE.append((mod.item_refcount(tensors), mod.item_refcount(storages)))
    return _FREE[0]



def dispatch(out: int | None = None):
    """A new ``Dispatch`` for one public collective, or None without the C module.
    ``out``: the position of the argument the function writes its result into (0: its
    input, in place), None when the plan makes the output."""
    mod = module()
    return mod.Dispatch(out=out) if mod is not None else None

def budget():
    """A new ``Budget`` (online selection's calls a Dispatch may serve), or None without
    the C module."""
    mod = module()
    return mod.Budget() if mod is not None else None


class Plans(dict):
    """A communicator's launch plans: a plan removed or replaced is retired (its C entry
    never serves a call again)."""

    def __setitem__(self, key, value) -> None:
        old = self.get(key)
        if old is not None and old is not value:
            old.retire()
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self[key].retire()
        super().__delitem__(key)

    def pop(self, key, *default):
        if key in self:
            self[key].retire()
        return super().pop(key, *default)

    def popitem(self):
        key, value = super().popitem()
        value.retire()
        return key, value

    def clear(self) -> None:
        for value in self.values():
            value.retire()
        super().clear()

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]
