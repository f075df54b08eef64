"""Data movement for every dtype: a tensor's bytes as int32 words, and back.

commlab's kernels move float32, float16, bfloat16 and int32; anything else (DDP
broadcasts int64, object collectives move uint8) travels as its bytes viewed as int32
rows, padded to a multiple of 4 bytes per row when needed (a copy only then).
"""

from __future__ import annotations

import torch

NATIVE = (torch.float32, torch.float16, torch.bfloat16, torch.int32)  # the kernels' dtypes


def to_words(t: torch.Tensor, rows: int = 1) -> tuple[torch.Tensor, int]:
    """``t``'s bytes as ``[rows, k]`` int32 and the bytes per row before padding."""
    b = t.contiguous().reshape(-1).view(torch.uint8)
    per = b.numel() // rows
    if per == 0:  # an empty tensor has no bytes to view as words (any dtype)
        return torch.empty(rows, 0, dtype=torch.int32, device=t.device), 0
    if per % 4 == 0 and b.data_ptr() % 4 == 0:
        return b.view(rows, per).view(torch.int32), per
    padded = torch.zeros(rows, (per + 3) // 4 * 4, dtype=torch.uint8, device=t.device)
    padded[:, :per] = b.view(rows, per)
    return padded.view(torch.int32), per


def from_words(w: torch.Tensor, per: int, dtype: torch.dtype, shape) -> torch.Tensor:
    """Rows of int32 words (``[rows, k]``) holding ``per`` bytes each, as ``dtype`` in ``shape``."""
    if per == 0:
        return torch.empty([0 if s == -1 else s for s in shape], dtype=dtype, device=w.device)
    b = w.contiguous().view(torch.uint8).view(w.shape[0], -1)
    if b.shape[1] != per:
        b = b[:, :per].contiguous()
    return b.view(dtype).view(shape)
