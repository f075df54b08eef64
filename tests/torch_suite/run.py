"""Run PyTorch's own distributed tests (``DistributedTest._DistTestBase`` of the installed
torch's ``torch/testing/_internal/distributed/distributed_test.py``) on "commlab" or gloo.

    python -m tests.torch_suite.run                       # commlab, worlds 2 and 3, CPU
    python -m tests.torch_suite.run --backend gloo        # the reference
    python -m tests.torch_suite.run -k all_reduce -k barrier --world 2
    python -m tests.torch_suite.run --check               # compare with status.txt
    python -m tests.torch_suite.run --write               # rewrite status.txt's statuses
    python -m tests.torch_suite.run --device cuda         # ranks on CUDA (not run in CI)

Every test runs under one time limit (``--timeout``, default 60 s; torch's harness kills
the ranks and fails it), each world size in its own process. It prints each test's result,
then the totals and, for commlab, how many tests reached commlab's kernels and how many
ran only on the fallback group (counted per call by ``CommlabProcessGroup``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from tests.torch_suite import _status

HERE = os.path.dirname(os.path.abspath(__file__))
STATUS = os.path.join(HERE, "status.txt")
_BY_DESIGN = ("send", "recv", "recv_anysource", "monitored_barrier")  # point-to-point: no kernel


class _Result(unittest.TextTestResult):
    """Collects one record per test: status, reason, seconds."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.records: dict[str, dict] = {}
        self._t0 = 0.0

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _put(self, test, status, reason=""):
        name = test.id().rsplit(".", 1)[-1]
        self.records[name] = {"status": status, "reason": reason.strip(),
                              "seconds": round(time.monotonic() - self._t0, 2)}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "pass")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "skip", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, _fail_kind(err), _last_line(err))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, _fail_kind(err), _last_line(err))


def _fail_kind(err) -> str:
    return "timeout" if "timed out" in str(err[1]) or "Timing out" in str(err[1]) else "fail"


def _last_line(err) -> str:
    lines = [ln for ln in str(err[1]).splitlines() if ln.strip()]
    keep = [ln for ln in lines if "Error" in ln or "assert" in ln.lower()]
    return (keep or lines or ["?"])[-1][:300]


def run_one_world(world: int, patterns: list[str], out: str) -> None:
    """In this process: import the suite for ``world`` ranks and run the selected tests."""
    os.environ["WORLD_SIZE"] = str(world)
    routes = tempfile.mkdtemp(prefix="commlab-suite-routes-")
    os.environ["TORCH_SUITE_ROUTES"] = routes
    from tests.torch_suite import _case

    names = sorted(n for n in dir(_case.TorchSuite) if n.startswith("test_")
                   and (not patterns or any(_matches(p, n) for p in patterns)))
    suite = unittest.TestSuite(_case.TorchSuite(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Result)
    result = runner.run(suite)
    records = result.records  # type: ignore[attr-defined]
    for name, rec in records.items():
        rec["routes"] = _routes(routes, name, world)
        rec["unskipped"] = name in _case.UNSKIPPED
    with open(out, "w") as f:
        json.dump(records, f, indent=1, sort_keys=True)


def _matches(pattern: str, name: str) -> bool:
    """``=name`` matches that test only; anything else, the tests whose name contains it."""
    return pattern[1:] == name if pattern.startswith("=") else pattern in name


def _routes(folder: str, name: str, world: int) -> dict:
    """The most calls any rank made, per route and op (ranks outside a subgroup make fewer)."""
    merged: dict[str, int] = {}
    for r in range(world):
        try:
            with open(os.path.join(folder, f"{name}.{r}.json")) as f:
                counts = json.load(f)
        except (OSError, ValueError):
            continue
        for k, v in counts.items():
            merged[k] = max(merged.get(k, 0), v)
    return merged


def reach(records: dict) -> dict:
    """Tests whose calls reached commlab's kernels, ran only on the fallback, made none."""
    kernels, fallback_only, by_design, none = [], [], [], []
    for name, rec in records.items():
        if rec["status"] == "skip":
            continue
        routes = rec.get("routes", {})
        k = sum(v for key, v in routes.items() if key.startswith("kernel:"))
        fb = [key.split(":", 1)[1] for key in routes if key.startswith("fallback:")]
        if k:
            kernels.append(name)
        elif fb and all(op in _BY_DESIGN for op in fb):
            by_design.append(name)
        elif fb:
            fallback_only.append(name)
        else:
            none.append(name)
    return {"kernels": kernels, "fallback_only": fallback_only,
            "fallback_by_design": by_design, "no_group_call": none}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="commlab", choices=["commlab", "gloo"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--world", type=int, nargs="+", default=[2, 3])
    p.add_argument("-k", dest="patterns", action="append", default=[],
                   help="run tests whose name contains this; =NAME: that test only "
                   "(repeatable)")
    p.add_argument("--only-listed", metavar="COLUMN", help="run the tests status.txt marks "
                   "with this tag in its 'ci' column (e.g. ci)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per test (fails it)")
    p.add_argument("--json", help="write every world's records here")
    p.add_argument("--check", action="store_true", help="compare with status.txt")
    p.add_argument("--write", action="store_true", help="write the results into status.txt")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one world here
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        run_one_world(a.one, a.patterns, a.out)
        return 0
    listed = _status.read(STATUS) if os.path.exists(STATUS) else {}
    patterns = list(a.patterns)
    if a.only_listed:
        patterns += ["=" + n for n, e in listed.items() if a.only_listed in e.tags]
    results: dict[int, dict] = {}
    t0 = time.monotonic()
    for world in a.world:
        results[world] = _run_world(a, world, patterns)
    wall = time.monotonic() - t0
    print(_status.summary(results, a.backend, wall, reach if a.backend == "commlab" else None))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(w): r for w, r in results.items()}, f, indent=1, sort_keys=True)
    if a.write:
        _status.write(STATUS, _status.merge(listed, results))
    if a.check:
        problems = _status.compare(listed, results)
        print("\n".join(problems) if problems else "status.txt: every result as listed")
        return 1 if problems else 0
    return 0


def _run_world(a, world: int, patterns: list[str]) -> dict:
    env = dict(os.environ, TORCH_SUITE_BACKEND=a.backend, TORCH_SUITE_DEVICE=a.device,
               TORCH_SUITE_TIMEOUT=str(a.timeout), COMMLAB_BACKEND=a.device,
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    root = os.path.dirname(os.path.dirname(HERE))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "tests.torch_suite.run", "--one", str(world), "--out", out]
    for pat in patterns:
        cmd += ["-k", pat]
    # every test has its own limit; this one only guards against the harness itself hanging
    n = max(1, len(patterns)) if patterns else 400
    subprocess.run(cmd, env=env, cwd=root, timeout=(a.timeout + 30) * n, check=False)
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
    finally:
        os.unlink(out)


if __name__ == "__main__":
    sys.exit(main())
