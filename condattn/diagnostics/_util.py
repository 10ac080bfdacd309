"""Helpers shared by the forward probes (token and mask reading lives in conditioning/tokens.py)."""

from __future__ import annotations

import torch


def rows_kept(mask: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor | None:
    """The padding mask (B, N) as bool on `device` (True = real token), or None when there is none.

    A mask whose shape does not match (batch, n) is an error unless it masks nothing (then the tensor is
    simply not token-aligned, e.g. a windowed layout, and has no padding to exclude).
    """
    if mask is None:
        return None
    keep = mask.to(device=device, dtype=torch.bool)
    if keep.shape == (batch, n):
        return None if bool(keep.all()) else keep
    if bool(keep.all()):
        return None
    raise ValueError(f"padding mask of shape {tuple(keep.shape)} does not match a tensor of {batch}x{n} tokens")


def summarise(values: list[float], prefix: str = "kappa") -> dict:
    t = torch.tensor(values, dtype=torch.float64)
    if t.numel() == 0:
        nan = float("nan")
        return {f"{prefix}_mean": nan, f"{prefix}_max": nan, f"{prefix}_min": nan, prefix: []}
    return {
        f"{prefix}_mean": float(t.mean()),
        f"{prefix}_max": float(t.max()),
        f"{prefix}_min": float(t.min()),
        prefix: [float(v) for v in values],
    }
