"""GPU wait records on one GPU: bench/checks/gpu_wait_records.py must print PASS (the
records name each spinning program's flag offset and value, the host's write releases
the kernel, the records clear). ``pytest -m gpu tests/test_wait_records_gpu.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "checks" / "gpu_wait_records.py"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_spinning_kernel_shows_its_wait_records_and_the_host_releases_it():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                        "MASTER_PORT", "COMMLAB_BACKEND", "TRITON_INTERPRET")}
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=300, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "PASS" in res.stdout, out[-4000:]
