"""Every ``COMMLAB_*`` environment variable, in one table.

Code reads configuration only through :func:`get` (or :func:`raw`), so this table is the
whole list; ``tests/test_config.py`` fails when a ``COMMLAB_`` name appears in the
source without a row here, and README's configuration table is generated from it
(``python -m commlab._config``). Values are read when asked for, so a test or a notebook
may set a variable before the first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(value: str | int) -> int:
    """``"256MiB"``, ``"64K"``, ``"1048576"`` -> bytes (binary units)."""
    if isinstance(value, int):
        return value
    text = str(value).strip().upper().replace(" ", "")
    digits = text.rstrip("KMGIB")
    unit = text[len(digits):]
    if not digits or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r}; write e.g. 256MiB, 64KiB or 1048576")
    return int(float(digits) * _UNITS[unit])


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "off", "no", "")


def _cpu_or_flag(value: str) -> bool | str:
    """COMMLAB_ADAPT, COMMLAB_RECORDS: "cpu" (the CPU backend only), else a flag (every
    backend or none)."""
    return "cpu" if value.strip().lower() == "cpu" else _flag(value)


@dataclass(frozen=True)
class Var:
    """One environment variable: its default, how it is parsed, what it does."""

    name: str
    default: str | None
    parse: Callable[[str], Any]
    doc: str
    where: str  # the module that reads it
    at_import: bool = False  # read once, at `import commlab` (a later change is not seen)


VARS: dict[str, Var] = {v.name: v for v in (
    Var("COMMLAB_BACKEND", "auto", str.lower,
        "`auto`, `cpu` or `cuda`, read at `import commlab`: `cpu` (or no GPU) turns Triton's "
        "interpreter on; `commlab.init(backend=...)` must agree with it", "commlab._interpreter",
        at_import=True),
    Var("COMMLAB_TIMEOUT", "300", float,
        "seconds a collective waits for the other ranks before `CollectiveTimeoutError` "
        "(`init(timeout=)` overrides; calls through a torch.distributed group made with a "
        "`timeout` wait that long instead)", "commlab.runtime"),
    Var("COMMLAB_PEER_TIMEOUT", "1", float,
        "seconds within which every waiting rank notices a lost peer (a SIGKILLed rank) and "
        "raises `RankLostError`; then `commlab.shrink()` continues on the survivors",
        "commlab.runtime"),
    Var("COMMLAB_JOIN", "0", _flag,
        "`1`: `commlab.init()` joins a running world as `commlab.init(join=True)` "
        "(`python -m commlab.run` sets it for a replacement worker)", "commlab.runtime"),
    Var("COMMLAB_AGREE_AHEAD", "1", _flag,
        "`0`: every collective call waits for every rank's host before it launches (default: "
        "a repeated identical call of a cached plan launches at once and is checked at the "
        "next call or `synchronize()`)", "commlab.runtime"),
    Var("COMMLAB_HEAP_SIZE", None, parse_size,
        "symmetric heap per rank; default 64MiB on cpu, 6GiB on cuda (`init(heap_size=)` "
        "overrides)", "commlab.runtime"),
    Var("COMMLAB_SCRATCH_SIZE", None, parse_size,
        "the heap's scratch region (collectives' inboxes); default 16MiB on cpu, 4GiB on "
        "cuda, at most half the heap (`init(scratch_size=)` overrides)", "commlab.runtime"),
    Var("COMMLAB_HEAP", "auto", str.lower,
        "the cuda heap: `auto` (torch's symmetric memory when every rank of a host has its "
        "own GPU, the CUDA IPC heap when ranks share one), `symmetric` or `ipc`",
        "commlab.runtime"),
    Var("COMMLAB_DEVICE", None, int,
        "the GPU index this rank uses (default `LOCAL_RANK % device_count`, so ranks beyond "
        "the GPU count share them); `%dist_start --devices` sets it per rank",
        "commlab.runtime"),
    Var("COMMLAB_IPC_CLOSE_WAIT", "10", float,
        "seconds a closing IPC heap waits for peers to unmap it before freeing (a peer that "
        "never does leaves it to this process's exit)", "commlab.runtime"),
    Var("COMMLAB_HOSTS", None, str,
        "splits the probed hosts of a world (tests on one machine): `2` = hosts of two "
        "ranks in rank order, `0,1;2,3` = named; may only split ranks that share memory",
        "commlab.runtime"),
    Var("COMMLAB_FAST_LAUNCH", "1", _flag,
        "`0` turns the cached launch plans off (every call goes through `kernel[grid]`)",
        "commlab.collectives", at_import=True),
    Var("COMMLAB_NATIVE", "1", _cpu_or_flag,
        "`0` keeps repeated calls on the Python launch plan instead of its C twin; `cpu` "
        "uses the C twin on the CPU backend only "
        "(`runtime/_fastcall.c`, compiled on first use with the C compiler Triton uses)",
        "commlab.runtime"),
    Var("COMMLAB_NATIVE_DIR", None, str,
        "where the compiled C fast path is kept (default `$XDG_CACHE_HOME/commlab/native`, "
        "`~/.cache` without it)", "commlab.runtime"),
    Var("COMMLAB_RECORDS", "cpu", _cpu_or_flag,
        "`cpu`: collective kernels write call records (entry, arrival, end per rank) on the "
        "CPU backend; `1`: on GPUs too (they cost 0.5 us of a 1.9 us graph-mode call on one "
        "H200: `bench/results/gpu-records-adapt.json`); `0`: nowhere. Read at `import "
        "commlab`; online selection and the straggler view need them",
        "commlab.language", at_import=True),
    Var("COMMLAB_GPU_ABORT", "0", _flag,
        "`1`: GPU spins (`cl.wait(.., ctx)`, `cl.barrier`, the collectives') look at the "
        "host's abort word every 1024 spins and return when a rank is lost (read at "
        "`import commlab`; off until `bench/checks/gpu_elastic_abort.py` passes on a GPU)",
        "commlab.language", at_import=True),
    Var("COMMLAB_ADAPT", "cpu", _cpu_or_flag,
        "`cpu`: `algorithm=\"auto\"` also measures every call and adapts online on the CPU "
        "backend; `1`: on every backend (GPUs need `COMMLAB_RECORDS=1` too; checked on one "
        "H200 by `bench/checks/gpu_adapt_switch.py` and `bench/adapt_bench.py`); `0`: the tuning "
        "table (or the defaults) alone, deterministically (the test suite sets it: "
        "`tests/conftest.py`)",
        "commlab.collectives"),
    Var("COMMLAB_ROUNDS", None, int,
        "forces the pipeline depth of the collectives (tests use it to exercise the "
        "pipeline on small CPU messages)", "commlab.collectives"),
    Var("COMMLAB_TUNING_DIR", None, str,
        "folder of measured tuning tables (default `~/.cache/commlab/tuning`)",
        "commlab.tuning"),
    Var("COMMLAB_HANG_GRACE", "5", float,
        "seconds `%%distributed` waits for ranks still in a collective after others "
        "finished before it reports a hang (`--grace` overrides)", "commlab.engine",
        at_import=True),
    Var("COMMLAB_INTERPRETER_FASTMEM", "1", _flag,
        "`0` turns off commlab's faster loads/stores under Triton's interpreter",
        "commlab._interpreter"),
    Var("COMMLAB_INTERPRETER_FASTCALL", "1", _flag,
        "`0` turns off commlab's faster kernel launch under Triton's interpreter",
        "commlab._interpreter"),
    Var("COMMLAB_CPU_TWINS", "1", _flag,
        "`0` runs commlab's collectives in Triton's interpreter even with no checker on "
        "(by default a host twin of the kernel runs them unless racecheck watches)",
        "commlab._interpreter"),
    Var("COMMLAB_WORLD_KEY", None, str,
        "secret the ranks MAC the bootstrap store's values with (the same on every rank; "
        "default: a per-user key in `~/.cache/commlab/world-key`, enough on one host)",
        "commlab.runtime"),
    Var("COMMLAB_SSH_ARGS", None, str,
        "extra `ssh` arguments (e.g. `-i key -o StrictHostKeyChecking=no`) for "
        "`%dist_start --launcher ssh` (also scp) and `--launcher mpi` (its remote agent); "
        "your ssh config applies too", "commlab.engine"),
    Var("COMMLAB_TORCH_BACKEND", None, str,
        "`commlab`: `commlab.init()` starts torch.distributed on the commlab backend (how a "
        "`%dist_start` world gets it)", "commlab.runtime"),
    Var("COMMLAB_FULL_TRACEBACKS", "0", _flag,
        "`1`: notebooks show commlab's errors with every frame (default: the user's frames "
        "and the message; `err.full_traceback` keeps the rest)", "commlab.errors",
        at_import=True),
    Var("COMMLAB_COMMIT", None, str,
        "commit recorded in benchmark results where the checkout has no `.git`",
        "commlab.bench"),
    Var("COMMLAB_TEST_SEED", None, int,
        "replays a test's random data (each test prints its seed on failure)", "tests"),
    Var("COMMLAB_NOTEBOOK_BACKEND", "cpu", str,
        "the backend the teaching notebooks start their worlds on (`cuda` on a GPU machine)",
        "notebooks"),
)}


def raw(name: str) -> str | None:
    """The variable's text as set, else its default (None when it has none)."""
    if name not in VARS:
        raise KeyError(f"{name} is not a commlab setting; add it to commlab/_config.py's table")
    return os.environ.get(name, VARS[name].default)


def read_at_import(env) -> dict[str, str | None]:
    """The settings ``import commlab`` reads once, as ``env`` (a mapping) gives them:
    processes forked after the import must have been started with the same values."""
    names = [v.name for v in VARS.values() if v.at_import] + ["TRITON_INTERPRET"]
    return {n: env.get(n) for n in names}


def get(name: str) -> Any:
    """The variable parsed (None when unset without a default); bad text raises ValueError
    naming the variable (plain ValueError: commlab.errors imports this module)."""
    text = raw(name)
    if text is None:
        return None
    key = (name, text)
    value = _PARSED.get(key, _PARSED)
    if value is not _PARSED:  # read on the hot path (every call): parsed once per text
        return value
    try:
        value = _PARSED[key] = VARS[name].parse(text)
    except ValueError as e:
        raise ValueError(f"{name}={text!r} cannot be read: {e}; {VARS[name].doc}") from None
    return value


_PARSED: dict[tuple[str, str], Any] = {}  # (name, text) -> parsed: the values are immutable


def table() -> str:
    """The settings as a Markdown table (README's configuration section)."""
    rows = ["| variable | default | what it does |", "| --- | --- | --- |"]
    for v in VARS.values():
        rows.append(f"| `{v.name}` | {f'`{v.default}`' if v.default is not None else '—'} "
                    f"| {v.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
