"""NS-attention: each head's output O_h (the head_dim × tokens matrix of one sample) is divided by its Frobenius
norm, given Newton–Schulz steps towards its polar factor, and has its norm restored, before the heads merge in W_O:

    X = O_h / ‖O_h‖_F;  X ← a X + (b A + c A²) X  with A = X Xᵀ  (`ns_steps` times);  O_h ← ‖O_h‖_F · X

with Muon's quintic coefficients (a, b, c) = (3.4445, −4.7750, 2.0315) by default (`ns_coefficients`). The step
lifts the small singular values of O_h towards the large ones (a flatter spectrum). Parameter-free: a forward
pre-hook on W_O's input, reshaped to heads (the merged input is head-major, H·d wide, in every zoo layout).

Padded tokens (the model's padding mask, where its token site names one and the site's queries are masked) are
left out of O_h and left as they came, as CET leaves padded rows. Refused for causal decoders (GPT-2, Llama):
A sums over every token, so each position's output would depend on later tokens. Refused where W_O's input is never
a module call (nn.MultiheadAttention applies out_proj inside F.multi_head_attention_forward).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import find_tokens, require_attention
from ..spec import MethodSpec, integer, register_method
from ..tokens import track_model_mask
from .common import is_causal, output_and_why

MUON = (3.4445, -4.7750, 2.0315)


def ns_heads(o: torch.Tensor, steps: int = 1, coefficients: tuple[float, float, float] = MUON,
             keep: torch.Tensor | None = None) -> torch.Tensor:
    """o (..., H, N, d): each head's N × d matrix (O_hᵀ) normalised, `steps` quintic NS steps, norm restored.
    keep (..., 1, N, 1) bool: the tokens that enter (the others come back unchanged)."""
    a, b, c = coefficients
    x = o if keep is None else o * keep
    norm = torch.linalg.vector_norm(x.float(), dim=(-2, -1), keepdim=True).clamp_min(1e-7)
    y = x.float() / norm
    for _ in range(steps):
        gram = y.transpose(-1, -2) @ y  # d × d: X Xᵀ of the paper's d × N matrix X = yᵀ
        y = a * y + y @ (b * gram + c * gram @ gram)
    y = (y * norm).to(o.dtype)
    return y if keep is None else torch.where(keep, y, o)


class HeadNS:
    """Forward pre-hook on W_O: its input (..., N, H·d) gets ns_heads per sample and head."""

    def __init__(self, num_heads: int, steps: int, coefficients: tuple[float, float, float], masked: bool):
        self.num_heads, self.steps, self.coefficients, self.masked = num_heads, steps, tuple(coefficients), masked
        self.mask: torch.Tensor | None = None  # (B, N) bool of the model's current call, True = a real token

    def set_mask(self, mask: torch.Tensor | None) -> None:
        self.mask = mask

    def __call__(self, module: nn.Module, args: tuple):
        x = args[0]
        n = x.shape[-2]
        heads = x.unflatten(-1, (self.num_heads, -1)).transpose(-2, -3)  # (..., H, N, d)
        keep = None
        m = self.mask if self.masked else None
        if m is not None and x.dim() == 3 and tuple(m.shape) == (x.shape[0], n):
            keep = m.to(x.device)[:, None, :, None]
        out = ns_heads(heads, self.steps, self.coefficients, keep).transpose(-2, -3).flatten(-2)
        return (out, *args[1:])


def apply_ns_attention(model: nn.Module, report: PatchReport, ns_steps: int = 1,
                       ns_coefficients: tuple[float, float, float] = MUON, partial: bool = False) -> list:
    """NS-attention before W_O of every attention site of `model`; returns the hook handles."""
    sites, warnings = require_attention(model, "ns_attention", partial)
    report.warnings += warnings
    causal = [s for s in sites if is_causal(s)]
    if causal:
        kind = type(causal[0].module).__name__
        raise ValueError(f"ns_attention: {causal[0].name} is causal self-attention ({kind}): the "
                         "Newton–Schulz step mixes every token's head output into each, so outputs would see "
                         "later tokens; use it on encoders")
    token_site = find_tokens(model)
    hooks, handles = [], []
    for site in sites:
        out, why = output_and_why(model, site)
        if site.heads_unknown:
            out, why = None, site.heads_unknown
        elif out is not None and not out.called:
            out, why = None, f"{type(site.module).__name__} applies {out.name} inside its own forward, {out.how}"
        if out is None:
            report.skipped.append(PatchEntry(site.name, f"ns_attention:{site.layout}", why))
            continue
        hook = HeadNS(site.num_heads, ns_steps, ns_coefficients, masked=site.masked_queries)
        handles.append(out.module.register_forward_pre_hook(hook))
        hooks.append(hook)
        report.entries.append(PatchEntry(site.name, f"ns_attention:{site.layout}",
                                         f"before {out.name} (W_O, {out.how}) "
                                         f"heads={site.num_heads}x{site.head_dim}"))
    if not report.entries:
        raise ValueError(f"ns_attention: no attention layer of {type(model).__name__} has a W_O whose input a hook "
                         f"can see ({report.skipped[0].detail})")
    if token_site is not None and token_site.mask_owner is not None:
        handles += track_model_mask(token_site, _Broadcast(hooks))
    return handles


class _Broadcast:
    """Hands each call's padding mask to every site's hook (a class, so deepcopy carries it to the copy's hooks)."""

    def __init__(self, hooks: list[HeadNS]):
        self.hooks = hooks

    def __call__(self, mask: torch.Tensor | None) -> None:
        for h in self.hooks:
            h.set_mask(mask)


def _coefficients(key: str, v) -> tuple[float, float, float]:
    try:
        out = tuple(float(x) for x in v)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or not all(math.isfinite(x) for x in out):
        raise ValueError(f"conditioning.{key}={v!r} must be three finite numbers (a, b, c), e.g. Muon's "
                         f"{list(MUON)}")
    return out


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_ns_attention(model, report, ns_steps=spec["ns_steps"], ns_coefficients=spec["ns_coefficients"],
                              partial=partial)


register_method(MethodSpec("ns_attention", {"ns_steps": 1, "ns_coefficients": MUON},
                           label="ns_attention (NS-attention)", apply=_apply,
                           validators={"ns_steps": integer(1), "ns_coefficients": _coefficients}, per_layer=True,
                           short="NS-attention", rival=True,
                           cost="ns_steps quintic Newton–Schulz steps on each head's d × N output per forward",
                           sources=("methods/ns_attention.py",), bench_arms={"NS-attn": {}}))
