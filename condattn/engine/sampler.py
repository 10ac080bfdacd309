"""A seeded, resumable training order: epoch e is a permutation drawn from (seed, e), sharded over ranks."""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class EpochSampler(Sampler[int]):
    """Shuffled indices for one epoch of one rank. The order depends only on (seed, epoch, rank), so a
    resumed run replays exactly the order of an uninterrupted one; the trainer skips the batches the
    epoch had already consumed."""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1, shuffle: bool = True):
        self.n, self.seed, self.rank, self.world, self.shuffle = n, seed, rank, world, shuffle
        self.epoch = 0
        self.per_rank = n // world  # drop the remainder so every rank takes the same number of steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        return iter(order[self.rank : self.per_rank * self.world : self.world].tolist())

    def __len__(self) -> int:
        return self.per_rank
