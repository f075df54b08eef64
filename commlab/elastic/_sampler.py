"""``ElasticSampler``: an epoch's samples split among whatever ranks the world has now."""

from __future__ import annotations

import torch

from commlab.runtime import get_communicator


class ElasticSampler:
    """Hands each rank its part of the next global batch of an epoch's order.

    Every step the world takes the next ``world_size * batch_size`` samples of the
    epoch's order (the same on every rank: ``seed + epoch``), split in contiguous parts
    whose sizes differ by at most one. The position (``consumed``) is global, so after a
    shrink or a grow the remaining samples are split among the new ranks: with the
    sampler in a ``commlab.elastic.State``, no sample of an epoch is lost or seen twice
    (a step rolled back returns its samples)."""

    def __init__(self, dataset_len: int, batch_size: int = 1, *, shuffle: bool = True,
                 seed: int = 0):
        if dataset_len < 0 or batch_size < 1:
            raise ValueError(f"ElasticSampler: dataset_len >= 0 and batch_size >= 1 needed, "
                             f"got {dataset_len} and {batch_size}")
        self.dataset_len, self.batch_size = dataset_len, batch_size
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.consumed = 0, 0
        self._order: tuple[int, torch.Tensor] | None = None

    @property
    def done(self) -> bool:
        """Whether this epoch's samples are all taken."""
        return self.consumed >= self.dataset_len

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.consumed = epoch, 0

    def order(self) -> torch.Tensor:
        """This epoch's order of sample indices."""
        if self._order is None or self._order[0] != self.epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + self.epoch)
                perm = torch.randperm(self.dataset_len, generator=g)
            else:
                perm = torch.arange(self.dataset_len)
            self._order = (self.epoch, perm)
        return self._order[1]

    def next_batch(self, rank: int | None = None, world_size: int | None = None) -> list[int]:
        """This rank's indices for the next step (default: the current communicator's
        rank and size); may be short or empty at the end of an epoch."""
        if rank is None or world_size is None:
            comm = get_communicator()
            rank, world_size = comm.rank, comm.world_size
        chunk = self.order()[self.consumed: self.consumed + world_size * self.batch_size]
        self.consumed += len(chunk)
        base, extra = divmod(len(chunk), world_size)
        lo = rank * base + min(rank, extra)
        return chunk[lo: lo + base + (rank < extra)].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed,
                "dataset_len": self.dataset_len, "seed": self.seed}

    def load_state_dict(self, d: dict) -> None:
        if (d["dataset_len"], d["seed"]) != (self.dataset_len, self.seed):
            raise ValueError(f"ElasticSampler.load_state_dict: dataset_len/seed "
                             f"{d['dataset_len']}/{d['seed']} differ from this sampler's "
                             f"{self.dataset_len}/{self.seed}; make it with the same ones")
        self.epoch, self.consumed = d["epoch"], d["consumed"]
