"""Which CUDA IPC path works between two processes on one GPU here: commlab's driver
calls (cuMemAlloc + cuIpcGetMemHandle), cudaMalloc memory exported with the driver call,
CuPy's runtime IPC, and torch's own CUDA storage sharing.

    python bench/probes/gpu_ipc_paths.py
"""

from __future__ import annotations

import multiprocessing as mp
import traceback


def _child(q_in, q_out):
    import ctypes

    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    res = {}
    kind, payload = q_in.get()
    while kind != "stop":
        try:
            if kind == "driver":
                from commlab.runtime._cuda_ipc import Driver

                d = Driver(0)
                ptr = d.open(payload)
                t = torch.empty(4, dtype=torch.int32, device="cuda")
                torch.cuda.synchronize()
                ctypes.CDLL("libcuda.so.1").cuMemcpyDtoH_v2(
                    ctypes.c_void_p(t.data_ptr()), ctypes.c_uint64(ptr), ctypes.c_size_t(4))
                res[kind] = "opened"
            elif kind == "cupy":
                import cupy

                ptr = cupy.cuda.runtime.ipcOpenMemHandle(payload)
                res[kind] = f"opened {ptr:#x}"
            elif kind == "torch":
                st = torch.UntypedStorage._new_shared_cuda(*payload)
                res[kind] = f"opened {st.size()} B"
        except Exception as e:
            res[kind] = f"{type(e).__name__}: {e}"
        q_out.put(res.copy())
        kind, payload = q_in.get()


def main():
    import torch

    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_child, args=(q_in, q_out))
    p.start()
    torch.empty(1, device="cuda")
    try:
        from commlab.runtime._cuda_ipc import Driver

        d = Driver(0)
        ptr = d.alloc(1 << 20)
        q_in.put(("driver", d.export(ptr)))
        print("driver:", q_out.get(timeout=60))
    except Exception:
        traceback.print_exc()
    try:
        import cupy

        mem = cupy.cuda.runtime.malloc(1 << 20)
        q_in.put(("cupy", cupy.cuda.runtime.ipcGetMemHandle(mem)))
        print("cupy:", q_out.get(timeout=60))
    except Exception:
        traceback.print_exc()
    try:
        t = torch.zeros(1 << 18, device="cuda")
        q_in.put(("torch", t.untyped_storage()._share_cuda_()))
        print("torch:", q_out.get(timeout=60))
    except Exception:
        traceback.print_exc()
    q_in.put(("stop", None))
    p.join(30)


if __name__ == "__main__":
    main()
