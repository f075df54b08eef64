"""Choose Triton's interpreter at import, before any kernel is defined.

Triton decides between compiling and interpreting when ``@triton.jit`` *decorates* a
function, reading ``TRITON_INTERPRET`` at that moment. commlab therefore decides at
``import commlab``: the CPU backend (``COMMLAB_BACKEND=cpu``, or no CUDA GPU visible)
turns the interpreter on, so every kernel defined after the import, commlab's own and
the user's, runs on the CPU. An explicit ``TRITON_INTERPRET`` always wins.
"""

from __future__ import annotations

import os

from commlab import _config

_BACKENDS = ("auto", "cpu", "cuda")


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def decide() -> bool:
    """Set ``TRITON_INTERPRET`` if the CPU backend will be used; return whether it is on."""
    if "TRITON_INTERPRET" not in os.environ:
        wanted = _config.get("COMMLAB_BACKEND")
        if wanted == "cpu" or (wanted == "auto" and not _cuda_visible()):
            os.environ["TRITON_INTERPRET"] = "1"
    return interpreting()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
