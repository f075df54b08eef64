"""The GPU regression suite (bench/checks/gpu_shared_suite.py, issue 26): its quick subset
passes on the CPU backend (2 ranks: every section, the magic included when ipyparallel
is installed), and the whole suite on a GPU with 2 ranks (``pytest -m gpu``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "checks" / "gpu_shared_suite.py"
WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "COMMLAB_BACKEND", "TRITON_INTERPRET")


def run_suite(tmp_path: Path, args: list[str], timeout: float, env: dict) -> dict:
    """Run the suite's script; return its JSON record (failing with its output if none)."""
    out = tmp_path / "suite.json"
    base = {k: v for k, v in os.environ.items() if k not in WORLD_ENV}
    res = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout, env={**base, **env})
    text = (res.stdout + res.stderr)[-6000:]
    if not out.exists():
        pytest.fail(f"the suite wrote no record (exit {res.returncode}):\n{text}", pytrace=False)
    rec = json.loads(out.read_text())
    shown = "\n".join(f"{f['check']}: {f['differs'][:400]}" for f in rec["failures"][:10])
    assert rec["failures"] == [], f"{len(rec['failures'])} failed checks:\n{shown}\n{text}"
    assert res.returncode == 0, text
    assert re.fullmatch(r"[0-9a-f]{40}", rec["commit"] or ""), rec["commit"]
    return rec


def test_quick_suite_passes_on_two_cpu_ranks_with_every_section(tmp_path, seed):
    rec = run_suite(tmp_path, ["--backend", "cpu", "--quick", "--ranks", "2", "--seed",
                               str(seed)], timeout=300, env={"COMMLAB_BACKEND": "cpu"})
    assert rec["checks"] > 20, rec["checks"]
    assert rec["world_size"] == 2 and rec["backend"] == "cpu" and rec["heap"] == "shm", rec
    sections = rec["sections"]
    assert {"collectives", "kernels", "torch", "magic"} <= set(sections), sections
    assert all(s["checks"] for k, s in sections.items() if k != "magic"), sections
    skipped = {s["check"] for s in rec["skips"]}
    assert {"graph capture and replay", "latency"} <= skipped, skipped  # cuda only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_whole_suite_passes_on_two_ranks_of_the_gpus(tmp_path, seed):
    rec = run_suite(tmp_path, ["--backend", "cuda", "--ranks", "2", "--seed", str(seed)],
                    timeout=900, env={})
    assert rec["checks"] > 200 and rec["latency_us"], rec
    assert rec["heap"] in ("ipc", "symmetric"), rec["heap"]
