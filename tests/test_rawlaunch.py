"""A plan's parameter block for commlab's own launch (``collectives/_rawlaunch``): laid out
from the kernel's signature, checked against what the loaded function takes, and refused
(Triton's launcher keeps the kernel) for anything it does not lay out."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from commlab.collectives import _rawlaunch

SIG = {"x": "*bf16", "out": "*bf16", "n": "i32", "scale": "fp32", "peers": "*i64",
       "seq": "i64", "flag": "i1", "BLOCK": "constexpr"}


def _compiled(signature=SIG, **meta):
    fields = {"num_warps": 4, "num_ctas": 1, "shared": 256, "launch_cooperative_grid": False,
              "launch_pdl": False, "global_scratch_size": 0, "profile_scratch_size": 0,
              "cluster_dims": (1, 1, 1), **meta}
    return SimpleNamespace(metadata=SimpleNamespace(**fields), function=0xABC,
                           src=SimpleNamespace(signature=dict(signature)))


@pytest.fixture
def driver(monkeypatch):
    sizes = {"now": [8, 8, 4, 4, 8, 8, 4, 8, 8]}  # the signature's, then 2 scratch pointers
    fake = {"cuLaunchKernel": 1, "cuCtxGetCurrent": 2, "cuGetErrorString": 3,
            "cuStreamIsCapturing": 4, "param_sizes": lambda function: list(sizes["now"])}
    monkeypatch.setattr(_rawlaunch, "_DRIVER", [fake])
    return sizes


def test_layout_gives_each_parameter_its_size_and_bytes():
    got = _rawlaunch.layout(SIG, (0x1000, 0x2000, -1, 1.5, None, 2**40, True, 1024))
    assert got == [(8, 0x1000), (8, 0x2000), (4, 2**32 - 1),
                   (4, struct.unpack("<I", struct.pack("<f", 1.5))[0]), (8, 0), (8, 2**40),
                   (4, 1)]


@pytest.mark.parametrize("signature, values", [
    ({"x": "*fp32", "t": ("i32", "i32")}, (0, (1, 2))),  # a tuple argument
    ({"x": "*fp32", "d": "tensordesc<fp32[16]>"}, (0, object())),
    ({"x": "*fp32", "n": "i32"}, (0,)),  # a value missing
    ({"x": "*fp32", "n": "i32"}, (0, 1.5)),  # a float for an integer
])
def test_layout_refuses_what_it_does_not_lay_out(signature, values):
    assert _rawlaunch.layout(signature, values) is None


def test_a_spec_matches_the_loaded_functions_parameters(driver):
    spec = _rawlaunch.spec(_compiled(), (6, 1, 1), (7, 2.0, 0x3000, 5, False, 1024))
    function, grid, block, shared, sizes, values, addrs = spec
    assert (function, grid, block, shared, addrs) == (0xABC, (6, 1, 1), 128, 256, (1, 2, 3, 4))
    assert list(sizes) == driver["now"]
    assert values[:3] == (0, 0, 7) and values[-2:] == (0, 0)  # x, out; the scratch pointers


@pytest.mark.parametrize("sizes", [
    [8, 8, 4, 4, 8, 8],  # the function takes fewer parameters than the signature says
    [8, 8, 8, 4, 8, 8, 4, 8, 8],  # a size differs: the order or a type is not as laid out
    [8, 8, 4, 4, 8, 8, 4, 4],  # a trailing parameter that is not a pointer
])
def test_a_spec_is_refused_when_the_function_disagrees(driver, sizes):
    driver["now"] = sizes
    assert _rawlaunch.spec(_compiled(), (1, 1, 1), (7, 2.0, 0, 5, False, 1024)) is None


@pytest.mark.parametrize("meta", [{"num_ctas": 2}, {"launch_cooperative_grid": True},
                                  {"launch_pdl": True}, {"global_scratch_size": 64},
                                  {"cluster_dims": (2, 1, 1)}])
def test_launches_that_need_attributes_keep_tritons_launcher(driver, meta):
    assert _rawlaunch.spec(_compiled(**meta), (1, 1, 1), (7, 2.0, 0, 5, False, 1024)) is None


def test_no_driver_means_no_spec(monkeypatch):
    monkeypatch.setattr(_rawlaunch, "_DRIVER", [None])
    assert _rawlaunch.spec(_compiled(), (1, 1, 1), (7, 2.0, 0, 5, False, 1024)) is None


def test_more_parameters_than_the_entry_lays_out_keep_tritons_launcher(driver):
    many = {f"p{i}": "i32" for i in range(70)}
    driver["now"] = [8, 8] + [4] * 70
    assert _rawlaunch.spec(_compiled({"x": "*fp32", "o": "*fp32", **many}), (1, 1, 1),
                           tuple(range(70))) is None
