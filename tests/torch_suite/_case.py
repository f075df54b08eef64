"""The test class: torch's ``DistributedTest._DistTestBase`` from the installed torch, on
the backend ``TORCH_SUITE_BACKEND`` names ("commlab" or "gloo"; with
``TORCH_SUITE_DEVICE=cuda``, "cpu:gloo,cuda:commlab").

Imported by the runner (``tests/torch_suite/run.py``) after it set the environment, and by
every rank (forked on CPU, so the imports and kernels are not paid per test; spawned on
CUDA, where this module sets the same things up again from the environment).

Which tests run is decided as for gloo: torch's skip decorators read ``BACKEND`` when the
module is imported, so it is imported with ``BACKEND=gloo`` and ``BACKEND`` is then set to
the backend under test, which every test body and ``init_process_group`` read at run time.
So commlab runs exactly the tests gloo runs, plus those torch keeps to MPI only for CPU
tensors (``all_to_all_single`` and friends: commlab runs them on its kernels), which the
runner also runs on gloo. commlab joins torch's lists of backends whose profiler events are
checked, so every ``commlab:<op>`` event meets the checks gloo's ``gloo:<op>`` meets.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

BACKEND = os.environ.get("TORCH_SUITE_BACKEND", "commlab")
DEVICE = os.environ.get("TORCH_SUITE_DEVICE", "cpu")
os.environ["BACKEND"] = "gloo"  # the skip decorators decide as for gloo (see above)
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", "/tmp")  # replaced per test by torch's setUp

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_distributed as _cd  # noqa: E402

if BACKEND == "commlab":
    import commlab  # noqa: F401, E402  (registers the backend)

# torch's per-test limits (up to 500 s) give way to the runner's one limit
_cd.TIMEOUT_DEFAULT = int(os.environ.get("TORCH_SUITE_TIMEOUT", "60"))
_cd.TIMEOUT_OVERRIDE.clear()

from torch.testing._internal.distributed import distributed_test as _dt  # noqa: E402

UNDER_TEST = "cpu:gloo,cuda:commlab" if (BACKEND == "commlab" and DEVICE == "cuda") else BACKEND
_dt.BACKEND = UNDER_TEST  # what init_process_group and the test bodies read
if BACKEND == "commlab":
    for name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                 "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
        getattr(_dt, name).append("commlab")

MPI_ONLY_CPU = "Only MPI supports CPU all_to_all_single"


def _unskip_mpi_only(cls) -> list[str]:
    """Tests torch keeps to MPI for CPU tensors; commlab (and gloo) run them."""
    names = []
    for name in dir(cls):
        fn = getattr(cls, name, None)
        if name.startswith("test_") and getattr(fn, "__unittest_skip_why__", "") == MPI_ONLY_CPU:
            fn.__unittest_skip__ = False
            names.append(name)
    return names


UNSKIPPED = _unskip_mpi_only(_dt.DistributedTest._DistTestBase) if DEVICE == "cpu" else []


def _dump_routes(test_name: str, rank: int) -> None:
    """Write this rank's count of calls that ran on commlab's kernels and on the fallback."""
    out = os.environ.get("TORCH_SUITE_ROUTES")
    if not out or BACKEND != "commlab":
        return
    from commlab.torch_backend import _group

    with open(os.path.join(out, f"{test_name}.{rank}.json"), "w") as f:
        json.dump({f"{route}:{op}": n for (route, op), n in _group.ROUTES.items()}, f)


# Test bodies that build their model only for named backends (``if BACKEND == "mpi" or
# BACKEND == "gloo"``, else nothing: UnboundLocalError): they see "gloo" in their body
# while their group is still the backend under test.
BODY_AS_GLOO = {"test_accumulate_gradients_no_sync",
                "test_accumulate_gradients_no_sync_allreduce_hook",
                "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
                "test_accumulate_gradients_no_sync_grad_is_view"}


class TorchSuite(_dt.TestDistBackend, _dt.DistributedTest._DistTestBase):
    """One test of torch's suite on ``world_size`` ranks of this machine."""

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        """torch's ``TestDistBackend._run`` with the group on ``UNDER_TEST`` (and no skip
        for fewer GPUs than ranks: on CUDA the ranks may share a GPU)."""
        if test_name in BODY_AS_GLOO:
            _dt.BACKEND = "gloo"  # this rank's process only (one per test)
        self = cls(test_name)
        self.rank, self.file_name = rank, file_name
        timeout = _dt.CUSTOM_PG_TIMEOUT.get(test_name, _dt.default_pg_timeout)
        dist.init_process_group(init_method=self.init_method, backend=UNDER_TEST,
                                world_size=int(self.world_size), rank=rank,
                                timeout=timedelta(seconds=timeout))
        self._barrier()
        self.run_test(test_name, pipe)
        self._barrier()
        dist.destroy_process_group()
        sys.exit(0)

    def setUp(self):
        super().setUp()
        method = "spawn" if DEVICE == "cuda" else "fork"
        self._start_processes(torch.multiprocessing.get_context(method).Process)

    def run_test(self, test_name: str, parent_pipe) -> None:
        try:
            super().run_test(test_name, parent_pipe)
        finally:
            _dump_routes(test_name, self.rank)


__all__ = ["TorchSuite", "UNSKIPPED", "UNDER_TEST", "dist", "sys"]
