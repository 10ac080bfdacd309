"""κ(X) of the tokens entering every transformer block, and κ of every attention layer's output.

X for one sample is its (N × D) token matrix ((H·W) × C for 4-D layouts), restricted to the non-padded
rows when a padding mask is given. Block inputs are read by forward pre-hooks registered after any
conditioning hooks, so with CET they see X + C.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..conditioning.sites import find_attention, find_tokens
from ..conditioning.tokens import as_tokens, block_input, first_tensor, track_model_mask
from ._util import rows_kept, summarise
from .linalg import batch_condition_numbers


class TokenProbe:
    """Context manager: while active, every forward records per-sample κ of each block input and of each
    attention module's output. `mask` (B, N), 1/True = real token, applies to every token-aligned tensor;
    models whose encoder receives the mask (HF) have it read from each call instead.
    """

    def __init__(self, model: nn.Module, mask: torch.Tensor | None = None):
        site = find_tokens(model)
        self.site = site
        self.blocks = site.blocks if site is not None else []
        self.channels_first = bool(getattr(site, "channels_first", False))
        self.sites = find_attention(model)
        self.mask = mask
        self.block_kappa: list[list[float]] = [[] for _ in self.blocks]
        self.attn_kappa: list[list[float]] = [[] for _ in self.sites]
        self._handles: list = []

    def _kappas(self, x: torch.Tensor, channels_first: bool = False, masked: bool = True) -> list[float]:
        if getattr(self.site, "sequence_first", False) and x.dim() == 3:  # (N, B, D): nn.TransformerEncoder
            x = x.transpose(0, 1)
        x = as_tokens(x.detach(), channels_first)
        keep = rows_kept(self.mask, x.shape[0], x.shape[1], x.device) if masked else None
        return batch_condition_numbers(x, keep).tolist()

    def __enter__(self) -> TokenProbe:
        self._handles += track_model_mask(self.site, lambda m: setattr(self, "mask", m))
        for j, (_, block) in enumerate(self.blocks):

            def pre(module, args, kwargs, j=j):
                self.block_kappa[j] += self._kappas(block_input(args, kwargs), self.channels_first)

            self._handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        for i, site in enumerate(self.sites):

            def post(module, args, output, i=i, masked=site.masked_queries):  # (DETR decoder: queries unpadded)
                self.attn_kappa[i] += self._kappas(first_tensor(output), masked=masked)

            self._handles.append(site.module.register_forward_hook(post))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def results(self) -> dict:
        """{"blocks": [{"block", "name", "kappa_mean", "kappa_max", "kappa_min", "kappa": [per sample]}],
        "attn_out": [{"layer", "name", same stats}]} (samples of all forwards run while active)."""
        return {
            "blocks": [
                {"block": j, "name": name, **summarise(v)}
                for j, ((name, _), v) in enumerate(zip(self.blocks, self.block_kappa))
            ],
            "attn_out": [
                {"layer": i, "name": s.name, **summarise(v)}
                for i, (s, v) in enumerate(zip(self.sites, self.attn_kappa))
            ],
        }


def token_conditioning(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None) -> dict:
    """Run `forward(model, batch)` once under no_grad and return TokenProbe.results()."""
    with torch.no_grad(), TokenProbe(model, mask) as probe:
        forward(model, batch)
    return probe.results()
