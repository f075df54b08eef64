"""A launch plan's kernel launched by commlab's own C code, one driver call per launch.

Triton's C launcher parses every argument of every call (a format string, a pointer
check per tensor argument, the hooks) before its ``cuLaunchKernelEx``. A plan knows all
arguments but two addresses, so ``spec`` lays the kernel's parameter block out once: the
value and size of every parameter the compiled function takes, the input's and output's
slots, the grid, block and shared memory. The plan's C entry
(``runtime._fastcall.Entry.set_raw``) copies that block, writes the two addresses and
calls ``cuLaunchKernel`` itself; it also asks the driver, not torch, whether a graph
captures the stream.

The layout comes from the kernel's own signature and is checked against what the loaded
function says it takes (``cuFuncGetParamInfo``, CUDA 12.4 drivers and later): the count
and every size must agree, the parameters past the signature's (Triton's scratch
pointers) must be pointers, and their sizes must be zero. Anything else, a launch that
needs attributes (clusters, cooperative grids, programmatic dependent launch), AMD, or
no driver entry point, gives None and the plan keeps Triton's launcher.
"""

from __future__ import annotations

import ctypes

import torch

MAX_PARAMS = 64  # what the C entry lays out (RAW_MAX in runtime/_fastcall.c)
ALLOW = [True]  # False: never build a spec (the GPU check compares both launchers)
BUILT = {"raw": 0, "declined": 0}  # specs made and refused (tests, bench)
_SIZES = {"i1": 4, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u1": 4, "u8": 1, "u16": 2,
          "u32": 4, "u64": 8, "fp16": 4, "bf16": 4, "fp32": 4, "f32": 4, "fp64": 8}
_DRIVER: list = []  # [dict of entry points, or None] once looked up


def driver() -> dict | None:
    """The driver entry points a raw launch needs (addresses) and ``param_sizes``
    (function -> the byte size of each of its parameters), or None without them."""
    if _DRIVER:
        return _DRIVER[0]
    found: dict | None = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        names = ("cuLaunchKernel", "cuCtxGetCurrent", "cuGetErrorString", "cuStreamIsCapturing")
        found = {n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names}
        info = lib.cuFuncGetParamInfo  # CUDA 12.4 drivers and later
        info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                         ctypes.POINTER(ctypes.c_size_t)]
        info.restype = ctypes.c_int
        found["param_sizes"] = lambda function: _param_sizes(function, info)
    except (OSError, AttributeError):
        found = None
    _DRIVER.append(found)
    return found


def _param_sizes(function: int, info) -> list[int] | None:
    sizes: list[int] = []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    while len(sizes) < 1024:
        if info(ctypes.c_void_p(function), len(sizes), ctypes.byref(offset),
                ctypes.byref(size)) != 0:
            break  # CUDA_ERROR_INVALID_VALUE: past the last parameter
        sizes.append(size.value)
    return sizes or None


def layout(signature: dict, values: tuple) -> list[tuple[int, int]] | None:
    """(size, 64-bit pattern) of every parameter the kernel takes, from its Triton
    signature (name -> type) and the call's arguments in signature order (constexprs
    included, as ``kernel[grid]`` takes them); None for a type this does not lay out."""
    types = list(signature.values())
    if len(types) != len(values):
        return None
    out = []
    for ty, v in zip(types, values, strict=True):
        if not isinstance(ty, str):
            return None  # a tuple argument
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            v = 0 if v is None else v  # a null pointer, as Triton's launcher takes None
            if not isinstance(v, int):
                return None
            out.append((8, v & (2**64 - 1)))
        elif ty in ("fp16", "bf16", "fp32", "f32", "fp64"):
            if not isinstance(v, (int, float)):
                return None
            fmt = "d" if ty == "fp64" else "f"
            raw = ctypes.c_double(v) if fmt == "d" else ctypes.c_float(v)
            out.append((_SIZES[ty], int.from_bytes(bytes(raw).ljust(8, b"\0"), "little")))
        elif ty in _SIZES:
            if not isinstance(v, int):
                return None
            size = _SIZES[ty]
            out.append((size, v & (2 ** (8 * size) - 1)))
        else:
            return None  # tensor descriptors and anything newer
    return out


def spec(compiled, grid: tuple, ints: tuple) -> tuple | None:
    """(function, grid, block, shared, sizes, values, driver addresses) for
    ``Entry.set_raw``: the kernel's parameters with (x, out) first as zeros; None when
    this kernel must keep Triton's launcher."""
    params = _spec(compiled, grid, ints)
    BUILT["raw" if params is not None else "declined"] += 1
    return params


def _spec(compiled, grid: tuple, ints: tuple) -> tuple | None:
    if not ALLOW[0] or torch.version.hip is not None:
        return None
    drv = driver()
    meta = getattr(compiled, "metadata", None)
    src = getattr(compiled, "src", None)
    function = getattr(compiled, "function", None)
    signature = getattr(src, "signature", None)
    if drv is None or meta is None or not isinstance(signature, dict) or not function:
        return None
    if (getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False)
            or getattr(meta, "launch_pdl", False) or getattr(meta, "global_scratch_size", 0)
            or getattr(meta, "profile_scratch_size", 0)
            or tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in ((1, 1, 1), (0, 0, 0))):
        return None
    params = layout(signature, (0, 0) + tuple(ints))
    if params is None or len(params) < 2 or params[0][0] != 8 or params[1][0] != 8:
        return None
    sizes = drv["param_sizes"](function)
    if sizes is None or len(sizes) < len(params) or len(sizes) > len(params) + 4:
        return None
    if [s for s, _ in params] != sizes[:len(params)] or any(s != 8 for s in sizes[len(params):]):
        return None
    params += [(8, 0)] * (len(sizes) - len(params))  # Triton's scratch pointers: none
    gx, gy, gz = (int(g) for g in grid)
    if len(params) > MAX_PARAMS or min(gx, gy, gz) < 1:
        return None
    block = 32 * int(meta.num_warps)
    return (int(function), (gx, gy, gz), block, int(meta.shared),
            bytes(s for s, _ in params), tuple(v for _, v in params),
            tuple(drv[n] for n in ("cuLaunchKernel", "cuCtxGetCurrent", "cuGetErrorString",
                                   "cuStreamIsCapturing")))
