"""This process's rank before any framework starts (a leaf: the standard library only)."""

from __future__ import annotations

import os


def launcher_rank() -> int:
    """The rank its launcher set (accelerate/torchrun: RANK; srun with one task per GPU: SLURM_PROCID); 0 for a single
    process."""
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0
