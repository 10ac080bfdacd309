"""One-call bundles for training loops and the diagnose CLI.

Flat keys (one value per layer i / block j, then the mean over layers/blocks under `/mean`):
    kappa_wq/l{i}, kappa_wk/l{i}, kappa_wv/l{i}          κ of the full W_Q, W_K, W_V block (effective: W + λI)
    sigma_min_wq/l{i}, ... sigma_max_wq/l{i}, ...         their extreme singular values
    kappa_head_wq/l{i}, ...                               per-head κ averaged over heads
    kappa_x/b{j}, kappa_x_max/b{j}                        κ(X) entering block j, mean / max over samples
    kappa_attn/l{i}                                       κ of attention output i, mean over samples
    entropy/l{i}, maxprob/l{i}                            attention entropy (nats) and max probability
    entropy_uniform/l{i}                                  the entropy of uniform attention (mean log #keys)
    self_argmax/l{i}                                      share of queries whose attention argmax is themselves
    cls_self/l{i}                                         the class token's attention to itself (models with one)
    self_logit_unit/l{i}                                  ‖x_h‖²/√d_h of the attention input (mean over tokens,
                                                          heads): the self-logit a fixed λI on W_Q, W_K adds per λ²
    feature_spread                                        spread of the final pooled feature across the batch
    gradnorm_wq/l{i}, gradnorm_wk/l{i}, gradnorm_wv/l{i}  (grad_diagnostics) ‖∇W‖_F
    gradnorm_embed                                        (grad_diagnostics) ‖∇‖_F of the patch / token embedding
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..conditioning.api import apply_conditioning
from ..conditioning.sites import ROLES
from .attention import AttentionProbe
from .grads import qkv_grad_norms
from .saturation import FeatureProbe, embed_grad_norm
from .tokens import TokenProbe
from .weights import weight_conditioning


def _series(flat: dict, name: str, tag: str, values: list) -> None:
    for i, v in enumerate(values):
        if v is not None:
            flat[f"{name}/{tag}{i}"] = float(v)
    vals = [float(v) for v in values if v is not None]
    if vals:
        flat[f"{name}/mean"] = sum(vals) / len(vals)


def flat_metrics(nested: dict) -> dict[str, float]:
    """The flat scalar dict (module docstring) of a cheap_diagnostics nested result."""
    flat: dict[str, float] = {}
    w = nested.get("weights", [])
    for r in ROLES:  # (a role a layer does not have, e.g. GCViT's global W_Q, is None: left out, as absent)
        _series(flat, f"kappa_w{r}", "l", [e[r] and e[r]["kappa"] for e in w])
        _series(flat, f"sigma_min_w{r}", "l", [e[r] and e[r]["sigma_min"] for e in w])
        _series(flat, f"sigma_max_w{r}", "l", [e[r] and e[r]["sigma_max"] for e in w])
        _series(flat, f"kappa_head_w{r}", "l", [e[r] and sum(e[r]["kappa_heads"]) / len(e[r]["kappa_heads"])
                                                for e in w])
    blocks = nested.get("blocks", [])
    _series(flat, "kappa_x", "b", [b["kappa_mean"] for b in blocks])
    _series(flat, "kappa_x_max", "b", [b["kappa_max"] for b in blocks])
    _series(flat, "kappa_attn", "l", [a["kappa_mean"] for a in nested.get("attn_out", [])])
    att = nested.get("attention", [])
    _series(flat, "entropy", "l", [a["entropy"] for a in att])
    _series(flat, "maxprob", "l", [a["maxprob"] for a in att])
    _series(flat, "entropy_uniform", "l", [a["entropy_uniform"] for a in att])
    _series(flat, "self_argmax", "l", [a.get("self_argmax") for a in att])
    _series(flat, "cls_self", "l", [a.get("cls_self") for a in att])
    _series(flat, "self_logit_unit", "l", [a.get("self_logit_unit") for a in att])
    spread = nested.get("features", {}).get("feature_spread")
    if spread is not None:
        flat["feature_spread"] = float(spread)
    return flat


def _modes(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    return [(m, m.training) for m in model.modules()]


def cheap_diagnostics(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None) -> dict:
    """Weight κ/σ, token κ per block, attention-output κ and attention entropy from ONE forward pass
    `forward(model, batch)` under torch.no_grad() and model.eval(); every module's train/eval mode is
    restored afterwards. mask: (B, N) padding mask, 1/True = real token (None for images).

    Returns a JSON-serialisable dict:
        {"weights": weight_conditioning(model), "blocks": [...], "attn_out": [...] (TokenProbe.results()),
         "attention": AttentionProbe.results(), "features": FeatureProbe.results(), "flat": flat_metrics(...)}
    """
    modes = _modes(model)
    model.eval()
    try:
        with torch.no_grad(), TokenProbe(model, mask) as tok, AttentionProbe(model, mask) as att, \
                FeatureProbe(model) as feat:
            forward(model, batch)
        nested = {
            "weights": weight_conditioning(model, effective=True),
            **tok.results(),
            "attention": att.results(),
            "features": feat.results(),
        }
    finally:
        for m, training in modes:
            m.training = training
    nested["flat"] = flat_metrics(nested)
    return nested


def grad_diagnostics(model: nn.Module) -> dict[str, float]:
    """Flat {gradnorm_wq/l{i}, gradnorm_wk/l{i}, gradnorm_wv/l{i}, gradnorm_w*/mean, gradnorm_embed} from the
    current .grad; layers without a gradient are left out (empty dict before the first backward)."""
    flat: dict[str, float] = {}
    norms = qkv_grad_norms(model)
    for r in ROLES:
        _series(flat, f"gradnorm_w{r}", "l", [e[r] for e in norms])
    g = embed_grad_norm(model)
    if g is not None:
        flat["gradnorm_embed"] = g
    return flat


def compare_conditioning(model: nn.Module, forward: Callable, batch, method: str = "spectral",
                         mask: torch.Tensor | None = None, loss: Callable | None = None, **options) -> dict:
    """Baseline vs conditioned on one's own model: deep-copies `model` (left untouched), applies `none` and
    `method(**options)` to the two copies and returns {"baseline": ..., "conditioned": ...} (cheap_diagnostics of
    each, plus grad_diagnostics in "flat" after one backward of `loss(model, batch)` when given) and "patch" (the
    PatchReport as a dict)."""
    arms, report = {}, None
    for arm in ("baseline", "conditioned"):
        m = copy.deepcopy(model)
        rep = apply_conditioning(m, "none" if arm == "baseline" else method, **({} if arm == "baseline" else options))
        report = rep if arm == "conditioned" else report
        arms[arm] = cheap_diagnostics(m, forward, batch, mask)
        if loss is not None:
            m.zero_grad(set_to_none=True)
            loss(m, batch).backward()
            arms[arm]["flat"].update(grad_diagnostics(m))
    return {**arms, "patch": report.to_dict()}
