"""CUDA IPC through the driver API (``libcuda``), called with ctypes.

The IPC heap (``runtime/_ipc_heap.py``) needs four things: allocate device memory that can
be exported, export it as a 64-byte handle, open a peer's handle (which maps the peer's
allocation into this process), and close/free in the right order. The driver API does
each in one call and owns nothing else, which is why it is used here rather than torch's
own CUDA tensor sharing: torch exports the caching allocator's whole segment with an
offset, keeps a reference-count file in /dev/shm for the producer, and cannot export at
all under ``expandable_segments``; the heap wants one plain ``cuMemAlloc`` whose lifetime
it decides. ``libcuda.so.1`` ships with the driver (no cuda-python needed), and every
call runs in the device's primary context, the one torch and Triton use.
"""

from __future__ import annotations

import ctypes
import threading

from commlab.errors import CommlabError

HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE
_LAZY_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

_LIB = None
_LOCK = threading.Lock()


class CudaIpcError(CommlabError):
    """A CUDA driver call of the IPC heap failed (the message names the call and code)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]  # c_char would stop at a NUL


def _lib():
    global _LIB
    with _LOCK:
        if _LIB is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise CudaIpcError(
                    f"the IPC heap needs the CUDA driver library libcuda.so.1, which did not "
                    f"load ({e}); install the NVIDIA driver, or use COMMLAB_HEAP=symmetric"
                ) from e
            _declare(lib)
            _check(lib.cuInit(0), "cuInit")
            _LIB = lib
    return _LIB


def _declare(lib) -> None:
    """Argument types for every call: the handle goes *by value* (64 bytes on the stack),
    which ctypes gets right only when told."""
    P, u64, uint, vp = ctypes.POINTER, ctypes.c_uint64, ctypes.c_uint, ctypes.c_void_p
    sigs = {
        "cuInit": [uint],
        "cuGetErrorName": [ctypes.c_int, P(ctypes.c_char_p)],
        "cuDeviceGet": [P(ctypes.c_int), ctypes.c_int],
        "cuDevicePrimaryCtxRetain": [P(vp), ctypes.c_int],
        "cuDevicePrimaryCtxRelease_v2": [ctypes.c_int],
        "cuCtxPushCurrent_v2": [vp],
        "cuCtxPopCurrent_v2": [P(vp)],
        "cuMemAlloc_v2": [P(u64), ctypes.c_size_t],
        "cuMemFree_v2": [u64],
        "cuIpcGetMemHandle": [P(_Handle), u64],
        "cuIpcOpenMemHandle_v2": [P(u64), _Handle, uint],
        "cuIpcCloseMemHandle": [u64],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int


def _check(code: int, what: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        lib = _LIB
        if lib is not None:
            lib.cuGetErrorName(code, ctypes.byref(name))
        label = name.value.decode() if name.value else "CUDA_ERROR"
        raise CudaIpcError(f"{what} failed: {label} ({code})")


class Driver:
    """The four IPC operations on device ``index``, each run in its primary context."""

    def __init__(self, index: int):
        self.index = index
        lib = _lib()
        dev = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self._ctx = ctypes.c_void_p()
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self._ctx), dev),
               "cuDevicePrimaryCtxRetain")
        self._dev = dev

    def _in_ctx(self, fn, *args, what: str):
        lib = _lib()
        _check(lib.cuCtxPushCurrent_v2(self._ctx), "cuCtxPushCurrent")
        try:
            _check(fn(*args), what)
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._in_ctx(_lib().cuMemAlloc_v2, ctypes.byref(ptr), nbytes,
                     what=f"cuMemAlloc({nbytes} B)")
        return ptr.value

    def export(self, ptr: int) -> bytes:
        h = _Handle()
        self._in_ctx(_lib().cuIpcGetMemHandle, ctypes.byref(h), ptr,
                     what="cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(h), HANDLE_BYTES)

    def open(self, handle: bytes) -> int:
        if len(handle) != HANDLE_BYTES:
            raise CudaIpcError(f"a CUDA IPC handle has {HANDLE_BYTES} bytes, got {len(handle)}")
        h = _Handle.from_buffer_copy(handle)
        ptr = ctypes.c_uint64()
        self._in_ctx(_lib().cuIpcOpenMemHandle_v2, ctypes.byref(ptr), h, _LAZY_PEER_ACCESS,
                     what="cuIpcOpenMemHandle")
        return ptr.value

    def close(self, ptr: int) -> None:
        self._in_ctx(_lib().cuIpcCloseMemHandle, ptr,
                     what="cuIpcCloseMemHandle")

    def free(self, ptr: int) -> None:
        self._in_ctx(_lib().cuMemFree_v2, ptr, what="cuMemFree")

    def release(self) -> None:
        """Drop this object's reference on the primary context (torch keeps its own)."""
        _lib().cuDevicePrimaryCtxRelease_v2(self._dev)
