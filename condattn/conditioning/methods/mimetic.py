"""Mimetic initialisation (Trockman & Kolter 2023, "Mimetic Initialization of Self-Attention Layers"): at
initialisation only, the attention weights are set so that they look like a pre-trained ViT's, then trained as usual.
Nothing is attached to the model.

In the paper's notation (x W, W of D_in × D_out), with Z a Gaussian D × D matrix of entries N(0, 1/D), drawn afresh
for every head and every product:
- per head h: W_Q^h W_K^hᵀ ≈ α₁ Z + β₁ I (D × D, of rank head_dim): the top-head_dim part of the SVD UΣVᵀ of the
  target, W_Q^h = U Σ^½, W_K^h = V Σ^½. Grouped-query attention shares W_K^g among the query heads of a group g:
  W_K^g comes from the group's first head and every W_Q^h of the group is the least-squares solution
  T_h W_K^g (W_K^gᵀ W_K^g)⁻¹ (exactly U Σ^½ for the first head).
- over all heads: W_V W_O ≈ α₂ Z − β₂ I (W_V of D × H·d, W_O of H·d × D), W_V = U Σ^½, W_O = Σ^½ Vᵀ (the paper
  treats value and projection as full rank); under grouped-query attention each kv head's share of W_O is split
  evenly among the query heads that read it.
W_O is found by structure (methods/common.output_projection: the layout's, or the last Linear the forward applies to
the attention's output, whatever its name). A layer whose W_O is not found, or whose W_V / W_O widths differ from
D, refuses the whole call with why, unless `mimetic_missing_vo=accept`: then such a layer gets its QK half alone, its
report entry says "qk", and the report's note counts the layers whose VO was left as built. Biases
are left as built. Sites whose softmax runs over channels (XCiT's XCA, DaViT's channel attention) are skipped:
W_Q W_Kᵀ ≈ I means something else there; so are sites without a W_Q (GCViT's global attention: its queries are the
stage's global query tokens), where there is no W_Q W_Kᵀ to set.
"""

from __future__ import annotations

import torch
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import AttentionSite, as_matrix, require_attention, stored_weight
from ..spec import MethodSpec, choice, finite_number, register_method
from .common import head_rows, not_token_softmax, output_and_why

# Paper defaults: QK α₁ = β₁ = 0.7, VO α₂ = β₂ = 0.4. These are the values of a public timm fork implementing the
# method; the paper's own values could not be read in the sources searched here, so the fork's are used.
DEFAULTS = {"qk_alpha": 0.7, "qk_beta": 0.7, "vo_alpha": 0.4, "vo_beta": 0.4}
MISSING_VO = ("refuse", "accept")  # a layer whose VO half cannot be set: refuse the call, or set its QK half alone


def _target(n: int, alpha: float, beta: float, g: torch.Generator | None) -> torch.Tensor:
    # float32 whatever torch's default dtype is (transformers sets it to the model's fp16/bf16 while building it),
    # so the SVD runs on a CPU too; _set_rows casts to the weight's dtype
    z = torch.randn(n, n, generator=g, dtype=torch.float32) / n**0.5
    return alpha * z + beta * torch.eye(n, dtype=torch.float32)


def _factors(t: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of D × rank with A Bᵀ the best rank-`rank` approximation of t: A = U Σ^½, B = V Σ^½."""
    u, s, vh = torch.linalg.svd(t)
    r = s[:rank].sqrt()
    return u[:, :rank] * r, vh[:rank].T * r


def _set_rows(p, rows: torch.Tensor, block: torch.Tensor) -> None:
    """Write a torch-layout (rows, in) block into a projection's stored weight (Conv1D stores it transposed)."""
    w = as_matrix(stored_weight(p))  # (a view: a 1×1 convolution's (out, in))
    if p.transposed:
        w[:, rows] = block.T.to(w)
    else:
        w[rows] = block.to(w)


def _d_in(p) -> int:
    w = as_matrix(stored_weight(p))
    return w.shape[0] if p.transposed else w.shape[1]


def _vo_why(out, pv, dim: int) -> str:
    """Why W_V W_O cannot be set ('' when it can)."""
    if out is None:
        return "no output projection W_O found"
    w_o = out.weight()
    d_out = w_o.shape[1] if out.transposed else w_o.shape[0]
    if d_out != dim or _d_in(pv) != dim:
        return f"W_O {out.name} maps to {d_out}, W_V reads {_d_in(pv)}, not the width {dim}"
    return ""


def vo_why(model: nn.Module, site: AttentionSite) -> str:
    """Why this site's VO half cannot be set ('' when it can)."""
    out, why = output_and_why(model, site)
    return why or _vo_why(out, site.proj["v"], _d_in(site.proj["q"]))


@torch.no_grad()
def mimetic_site(model: nn.Module, site: AttentionSite, qk: tuple[float, float], vo: tuple[float, float],
                 g: torch.Generator | None = None) -> str:
    """Initialise one site; returns what was set ("qk+vo", or "qk" with the reason VO was not)."""
    d = site.head_dim
    pq, pk, pv = site.proj["q"], site.proj["k"], site.proj["v"]
    dim = _d_in(pq)
    q_rows, k_rows = head_rows(pq, d), head_rows(pk, d)
    group = len(q_rows) // len(k_rows)
    for j, kr in enumerate(k_rows):
        wk = None
        for h in range(j * group, (j + 1) * group):
            t = _target(dim, *qk, g)
            if wk is None:
                wq, wk = _factors(t, d)
            else:
                wq = t @ wk @ torch.linalg.inv(wk.T @ wk)
            _set_rows(pq, q_rows[h], wq.T)
        _set_rows(pk, kr, wk.T)
    out, why = output_and_why(model, site)
    why = why or _vo_why(out, pv, dim)
    if why:
        return f"qk ({why}: VO left as built)"
    w_o = out.weight()
    v_rows = head_rows(pv, d)
    a, b = _factors(_target(dim, vo[0], -vo[1], g), len(v_rows) * d)  # W_V = a, W_O = bᵀ (paper layout)
    o = torch.empty(dim, site.num_heads * d, dtype=torch.float32)  # torch layout (D, H·d) of W_O
    for j, vr in enumerate(v_rows):
        _set_rows(pv, vr, a[:, j * d:(j + 1) * d].T)
        for h in range(j * group, (j + 1) * group):
            o[:, h * d:(h + 1) * d] = b[:, j * d:(j + 1) * d] / group
    w_o.copy_((o.T if out.transposed else o).to(w_o))
    return "qk+vo"


def _skip_why(site: AttentionSite) -> str:
    reason = not_token_softmax(site) or site.lacks("q", "k", "v") or site.heads_unknown  # (GCViT global: no W_Q)
    if not reason and _d_in(site.proj["k"]) != _d_in(site.proj["q"]):
        reason = (f"keys read width {_d_in(site.proj['k'])}, queries {_d_in(site.proj['q'])}: W_Q W_Kᵀ ≈ I "
                  "needs one width")
    return reason


def apply_mimetic(model: nn.Module, report: PatchReport, qk_alpha: float = 0.7, qk_beta: float = 0.7,
                  vo_alpha: float = 0.4, vo_beta: float = 0.4, generator: torch.Generator | None = None,
                  partial: bool = False, missing_vo: str = "refuse") -> list:
    """Mimetic initialisation of every token-softmax attention site of `model`, once; attaches nothing. A layer
    whose VO half cannot be set refuses the call (nothing changed) unless `missing_vo="accept"`."""
    sites, warnings = require_attention(model, "mimetic_init", partial)
    report.warnings += warnings
    todo = [(s, _skip_why(s)) for s in sites]
    half = {s.name: vo_why(model, s) for s, why in todo if not why}
    half = {k: v for k, v in half.items() if v}
    if half and missing_vo != "accept":
        name, why = next(iter(half.items()))
        raise ValueError(f"mimetic_init: {len(half)} attention layers of {type(model).__name__} cannot take the VO "
                         f"half (e.g. {name}: {why}); nothing was changed. conditioning.mimetic_missing_vo=accept "
                         "sets their QK half alone, and the report says so")
    for site, reason in todo:
        if reason:
            report.skipped.append(PatchEntry(site.name, f"mimetic_init:{site.layout}", reason))
            continue
        done = mimetic_site(model, site, (qk_alpha, qk_beta), (vo_alpha, vo_beta), generator)
        report.entries.append(PatchEntry(site.name, f"mimetic_init:{site.layout}", done))
    if not report.entries:
        raise ValueError(f"mimetic_init: no attention layer of {type(model).__name__} has token-softmax logits "
                         f"({report.skipped[0].detail})")
    full = sum(e.detail == "qk+vo" for e in report.entries)
    qk_only = len(report.entries) - full
    what = "W_Q, W_K (per head) set once so that W_Q W_Kᵀ ≈ α₁Z + β₁I"
    if full:
        what += f", and W_V, W_O so that W_V W_O ≈ α₂Z − β₂I, in {full} layers"
    if qk_only:
        what += (f"; in {qk_only} layers only W_Q, W_K (VO left as built: mimetic_missing_vo=accept; each entry says "
                 "why)")
    report.notes.append(f"mimetic_init: {what}; plain weights trained from here (remove_conditioning cannot undo it)")
    return []


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_mimetic(model, report, **{k: spec[k] for k in DEFAULTS}, partial=partial,
                         missing_vo=spec["mimetic_missing_vo"])


register_method(MethodSpec("mimetic_init", {**DEFAULTS, "mimetic_missing_vo": "refuse"},
                           label="mimetic_init (mimetic initialisation)",
                           validators={**{k: finite_number(0) for k in DEFAULTS},
                                       "mimetic_missing_vo": choice(MISSING_VO)},
                           permissions=frozenset({"mimetic_missing_vo"}), apply=_apply, per_layer=True,
                           init_only=True, short="mimetic init", rival=True,
                           # the conditioned-init paper ran it as its control: its numbers, no claimed effect
                           claim="mimetic init (as the conditioned-init paper ran it)", paper_key="ci_mimetic",
                           paper_baseline_key="ci_baseline", effect=False,
                           # only sets weights: its arm shows ≈ 1× by design
                           sources=("methods/mimetic.py",), bench_arms={"mimetic": {}}))
