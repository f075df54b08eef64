"""Bad calls raise clear errors on every rank before anything launches, and the world
stays usable: shapes/dtypes differing across ranks, indivisible dim 0, unsupported dtype,
op or algorithm, src out of range, heap full, allocation order, missing ranks, no GPU."""

from __future__ import annotations

import pytest
import torch

from commlab.testing import WorldError, run_world
from tests.conftest import assert_checks
from tests.worlds.errors import cuda_world, errors_world
from tests.worlds.threads import two_threads_world


@pytest.fixture(scope="module")
def results():
    return run_world(errors_world, 3, timeout=240, env={"COMMLAB_TIMEOUT": "60"})


SECTIONS = {
    "shape_mismatch": "shapes differing across ranks name the ranks and their shapes",
    "shape_mismatch_all_gather": "all_gather shapes differing name the ranks",
    "dtype_mismatch": "dtypes differing across ranks are named",
    "long_signature_op_mismatch": "an op differing is caught when the shape fills the slot",
    "long_signature_shape_mismatch": "a shape differing past the slot's end is caught (digest)",
    "indivisible_dim0": "reduce_scatter/all_to_all need dim 0 divisible by the world",
    "unsupported_dtype": "float64 and int64 are refused with the supported list",
    "unsupported_dtype_on_one_rank": "a local error on one rank is raised on every rank",
    "unsupported_op": "an unknown reduction op is refused",
    "unknown_algorithm": "an unknown algorithm is refused with the known ones, the op named once",
    "op_none": "op=None is refused on every rank as an argument error (not KeyError)",
    "algorithm_none": "algorithm=None is refused on every rank as an argument error",
    "unknown_keyword_on_one_rank": "an unknown keyword on one rank is raised on every rank",
    "local_error_on_every_rank": "the same local error everywhere names the op once, no mismatch",
    "broadcast_src_out_of_range": "broadcast src outside 0..W-1 is refused",
    "heap_full": "heap full names requested and free bytes",
    "heap_full_on_one_rank": "a full heap on one rank is raised on every rank, in step",
    "allocation_order": "symmetric allocations in different orders are caught",
    "timeout": "a missing rank is named after the timeout and recover() heals the world",
}


@pytest.mark.parametrize("section", list(SECTIONS), ids=list(SECTIONS))
def test_bad_call_raises_on_every_rank_before_launch_and_world_recovers(results, section):
    assert_checks(results, section)


def test_cuda_backend_without_gpus_raises_backend_unavailable_on_every_rank():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(WorldError) as info:
        run_world(cuda_world, 2, backend="cuda", timeout=120)
    failures = info.value.failures
    assert sorted(failures) == [0, 1], failures
    for rank, text in failures.items():
        assert "BackendUnavailableError" in text, (rank, text)
        assert "backend='cpu'" in text, (rank, text)  # the message says the fix


def test_second_thread_calling_a_collective_is_refused_and_world_stays_usable():
    results = run_world(two_threads_world, 2, timeout=120, env={"COMMLAB_TIMEOUT": "30"})
    assert_checks(results, "two_threads")
