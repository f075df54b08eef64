"""gloo for CUDA tensors where NCCL cannot run: ranks that share a GPU.

NCCL refuses a communicator given the same GPU twice ("Duplicate GPU"), so a world of
ranks sharing a GPU sends what commlab does not run natively through gloo on host copies:
every CUDA tensor of the call is copied to the host, gloo runs, and every copy is written
back to its tensor (outputs get the result; inputs get their own values back). Slow, and
only for the fallback's ops (point-to-point, gather/scatter, subgroups); commlab's own
collectives run on the GPU.
"""

from __future__ import annotations

import torch

from commlab.torch_backend._work import completed


class HostStaged:
    """Wraps a gloo group: each method call runs on host copies of its CUDA tensors."""

    def __init__(self, gloo, device: torch.device):
        self._gloo = gloo
        self._device = device

    def __getattr__(self, name: str):
        method = getattr(self._gloo, name)
        if not callable(method):
            return method

        def staged(*args, **kwargs):
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

            def to_host(x):
                if isinstance(x, torch.Tensor) and x.device.type == "cuda":
                    host = x.detach().to("cpu")
                    pairs.append((x, host))
                    return host
                if isinstance(x, (list, tuple)):
                    return type(x)(to_host(v) for v in x)
                return x

            work = method(*[to_host(a) for a in args], **kwargs)
            work.wait()
            with torch.no_grad():
                for dev, host in pairs:
                    dev.copy_(host)
            return completed(args[0] if args else None, self._device)

        return staged
