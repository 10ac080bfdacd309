"""Reading a model's tokens and padding mask at its sites: shared by CET's hooks and the diagnostics' probes."""

from __future__ import annotations

import torch


def as_tokens(x: torch.Tensor, channels_first: bool = False) -> torch.Tensor:
    """(B, N, D) as is; 4-D (B, H, W, C) layouts (or (B, C, H, W) when channels_first) as (B, H·W, C)."""
    if x.dim() == 4:
        return x.flatten(2).transpose(1, 2) if channels_first else x.reshape(x.shape[0], -1, x.shape[-1])
    if x.dim() != 3:
        raise ValueError(f"expected tokens (B, N, D) or (B, H, W, C), got shape {tuple(x.shape)}")
    return x


def from_tokens(t: torch.Tensor, shape: torch.Size, channels_first: bool = False) -> torch.Tensor:
    """The inverse of `as_tokens`: tokens (B, H·W, C) back to a block input of `shape`."""
    if len(shape) == 4 and channels_first:
        return t.transpose(1, 2).reshape(shape)
    return t.reshape(shape)


def first_tensor(out) -> torch.Tensor:
    """A module's output, or element 0 of a tuple output (transformers modules)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The token tensor among a block's (or attention module's) forward inputs: first positional, else the
    `hidden_states` / `x` keyword."""
    if args and torch.is_tensor(args[0]):
        return args[0]
    for key in ("hidden_states", "x"):
        if key in kwargs:
            return kwargs[key]
    raise RuntimeError("cannot find the token tensor among a block's inputs")


def key_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, N) bool, True for real tokens, from a 2-D padding mask (1 = token) or a 4-D attention mask
    (B, 1, Q, N) that is boolean (True = attend) or additive (0 = attend, large negative = masked)."""
    if mask is None:
        return None
    if mask.dim() == 4:
        mask = mask[:, 0].any(dim=1) if mask.dtype == torch.bool else (mask[:, 0] == 0).any(dim=1)
        return mask
    if mask.dim() != 2:
        raise ValueError(f"CET: cannot read a padding mask of shape {tuple(mask.shape)}")
    return mask.bool()


def call_mask(site, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The padding mask (B, N) bool of one call of `site.mask_owner` (TokenSite), from its declared argument."""
    name, idx = site.mask_arg
    mask = key_mask(kwargs.get(name, args[idx] if len(args) > idx else None))
    return ~mask if mask is not None and getattr(site, "mask_marks_padding", False) else mask


def track_model_mask(site, setter) -> list:
    """When the model's token site names the module that receives the padding mask (HF encoders), a
    forward pre-hook hands every call's mask, as (B, N) bool, to `setter`. A two-tower model (LRA
    Retrieval) runs its encoder once per document with that document's mask, so a single mask given up
    front cannot be right for both calls. Returns the hook handles (none when the site has no mask owner)."""
    if site is None or site.mask_owner is None:
        return []
    name, idx = site.mask_arg
    capture = MaskCapture(name, idx, setter, getattr(site, "mask_marks_padding", False))
    return [site.mask_owner.register_forward_pre_hook(capture, with_kwargs=True)]


class MaskCapture:
    """The forward pre-hook of track_model_mask: a class, not a closure, so a model carrying it deep-copies and
    pickles (the copy's hook acts on the copy's setter)."""

    def __init__(self, name: str, idx: int, setter, marks_padding: bool = False):
        self.name, self.idx, self.setter, self.marks_padding = name, idx, setter, marks_padding

    def __call__(self, module, args, kwargs):
        m = key_mask(kwargs.get(self.name, args[self.idx] if len(args) > self.idx else None))
        # a call without a mask: every token is real (no stale mask); torch's src_key_padding_mask marks padding
        self.setter(~m if m is not None and self.marks_padding else m)
