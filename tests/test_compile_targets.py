"""Every kernel commlab ships compiles for NVIDIA sm_80/sm_90/sm_100 and AMD gfx942/gfx950
(no GPU needed) and fits the target's shared memory.

The matrix is compiled once per session in two subprocesses (``tests/compile_targets``),
cached per (kernel source hash, target) in $XDG_CACHE_HOME/commlab-compile-targets
(~/.cache), so a rerun only compiles what changed; only the selected tests' pairs are
compiled (matrix.SLOW_VARIANTS are marked slow). Pairs that fail today are strict
xfails naming the cause: the kernel's target switch flips them.
"""

from __future__ import annotations

import pytest

from tests.compile_targets.matrix import KNOWN_FAILURES, SLOW_VARIANTS, TARGETS, pairs

_TEST = "test_kernel_compiles_for_target_and_fits_its_shared_memory"


@pytest.fixture(scope="session")
def compiled(request):
    from tests.compile_targets.run import run

    # session.items also holds nbval's notebook cells, which have no originalname
    selected = [(it.callspec.params["variant"], it.callspec.params["target"])
                for it in request.session.items
                if getattr(it, "originalname", None) == _TEST and hasattr(it, "callspec")]
    records, _ = run(jobs=2, only=selected)
    return {(r["variant"], r["target"]): r for r in records}


def _params():
    out = []
    for v, t in pairs():
        why = KNOWN_FAILURES.get((v, t))
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        if v in SLOW_VARIANTS:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(v, t, id=f"{v}@{t}", marks=marks))
    return out


@pytest.mark.parametrize("variant,target", _params())
def test_kernel_compiles_for_target_and_fits_its_shared_memory(compiled, variant, target):
    r = compiled[(variant, target)]
    assert r["ok"], f"{variant} does not compile for {target}: {r['error']}"
    limit = TARGETS[target].shared_limit
    assert r["shared_bytes"] <= limit, (
        f"{variant} needs {r['shared_bytes']} B of shared memory on {target}, more than the "
        f"{limit} B one block may use there; smaller tiles or fewer stages for this target")


def test_committed_figures_cover_the_whole_matrix():
    import json

    from tests.compile_targets.run import COMMAND, RESULTS

    doc = json.loads(RESULTS.read_text())
    have = {(r["variant"], r["target"]) for r in doc["results"]}
    assert have == set(pairs()), f"{RESULTS.name} is out of date; regenerate: {COMMAND}"
    assert {k for k in doc["known_failures"]} == {f"{v}@{t}" for v, t in KNOWN_FAILURES}
