"""Helpers shared by the forward probes."""

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


def as_tokens(x: torch.Tensor, channels_first: bool = False) -> torch.Tensor:
    """(B, N, D) as is; 4-D (B, H, W, C) layouts (or (B, C, H, W) when channels_first) as (B, H·W, C)."""
    if x.dim() == 4:
        return x.flatten(2).transpose(1, 2) if channels_first else x.reshape(x.shape[0], -1, x.shape[-1])
    if x.dim() != 3:
        raise ValueError(f"expected tokens (B, N, D) or (B, H, W, C), got shape {tuple(x.shape)}")
    return x


def first_tensor(out) -> torch.Tensor:
    """A module's output, or element 0 of a tuple output (transformers modules)."""
    return out[0] if isinstance(out, (tuple, list)) else out


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


def track_model_mask(site, setter) -> list:
    """When the model's token site names the module that receives the padding mask (HF encoders), a
    forward pre-hook hands every call's mask, as (B, N) bool, to `setter`. A two-tower model (LRA
    Retrieval) runs its encoder once per document with that document's mask, so a single mask given up
    front cannot be right for both calls. Returns the hook handles (none when the site has no mask owner)."""
    if site is None or site.mask_owner is None:
        return []
    from ..conditioning.embedded import key_mask

    name, idx = site.mask_arg

    def capture(module, args, kwargs):
        m = kwargs.get(name, args[idx] if len(args) > idx else None)
        if m is not None:
            setter(key_mask(m))

    return [site.mask_owner.register_forward_pre_hook(capture, with_kwargs=True)]
