"""A seeded, resumable training order: epoch e is a permutation drawn from (seed, e), sharded over ranks."""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class EpochSampler(Sampler[int]):
    """Shuffled indices for one epoch of one rank. The order depends only on (seed, epoch), so a resumed run
    replays exactly the order of an uninterrupted one; after a resume the trainer starts the epoch at the batch it
    had reached (`set_epoch(epoch, skip=batches)`), without loading (or augmenting, which draws random numbers) the
    samples it skips. `len` stays the whole epoch's.

    The epoch's permutation is cut into blocks of `block` (the per-process micro-batch) dealt round-robin to
    the ranks: micro-batch i of rank r is block i·world + r. So the samples of one optimizer step (world ×
    accumulation micro-batches) are the same consecutive stretch of the permutation whatever the process
    count: 1 process with 2 accumulation steps and 2 processes with 1 see the same global batches. With
    world = 1 this is the plain permutation (the remainder smaller than a block is dropped either way)."""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1, shuffle: bool = True, block: int = 1,
                 num_repeats: int = 1, selected_round: int = 0):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside [0, {world})")
        self.n, self.seed, self.rank, self.world, self.shuffle = n, seed, rank, world, shuffle
        self.block, self.num_repeats = max(int(block), 1), int(num_repeats)
        self.epoch = 0
        self.skip = 0  # micro-batches of this epoch already consumed (a resumed run starts after them)
        # repeated augmentation keeps n // selected_round * selected_round indices (DeiT's RASampler)
        total = n // selected_round * selected_round if selected_round and n >= selected_round else n
        self.blocks_per_rank = total // (self.block * world)  # every rank takes the same number of steps
        self.per_rank = self.blocks_per_rank * self.block

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, int(skip)

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        if self.num_repeats > 1:
            order = order.repeat_interleave(self.num_repeats)
        used = order[: self.blocks_per_rank * self.block * self.world]
        mine = used.view(self.blocks_per_rank, self.world, self.block)[:, self.rank]
        return iter(mine[self.skip:].reshape(-1).tolist())

    def __len__(self) -> int:
        return self.per_rank
