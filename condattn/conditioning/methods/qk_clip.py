"""QK-clip (Kimi K2's MuonClip; public reference: Megatron-LM's `clip_qk`, restated here in our words): during the
training forwards of a step each attention layer records, per head, its largest logit q·kᵀ·scale (over the batch
and the (query, key) pairs its mask keeps); after the optimizer step, a head whose largest logit S passed the
threshold τ has its W_Q rows scaled by η^α and its W_K rows by η^(1−α), η = τ / S, so that the next logits of the
same inputs peak at τ. α = 0.5 by default: both scaled by √(τ / S). Under grouped-query attention a key head is shared
by a group of query heads: η is taken from the group's largest S and applied to every query head of the group and to
its key head (Megatron's SelfAttention.clip_qk). Biases are left as they are (Megatron scales the weights only).
The records are cleared after every clip, so each step is judged by its own forwards.

No parameters and no change to the forward's numbers: the largest logit is read by one more q·kᵀ under no_grad
beside the fused kernel (methods/logits.py routes the kernel call). The clip needs a call after each optimizer step:
the trainer makes it (MethodSpec.after_step); with your own loop call `condattn.after_optimizer_step(model)` after
`optimizer.step()`. Under torch.distributed the records are reduced (max) over the ranks first.

Refused where q and k are normalised after their projections (q_norm / k_norm: Qwen3, OLMo2, timm qk_norm=True):
a norm undoes any scaling of W_Q and W_K, so the clip would change nothing; and where the layer has no W_Q.
"""

from __future__ import annotations

import torch
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import AttentionSite, as_matrix, stored_weight
from ..spec import MethodSpec, finite_number, register_method
from .common import head_rows
from .logits import patchable, rule_of

KIMI_TAU = 100.0  # Kimi K2's threshold τ


def has_qk_norm(site: AttentionSite) -> str:
    """The name of a norm the site applies to q or k after their projections ('' when none)."""
    for name in ("q_norm", "k_norm", "condattn_q_norm", "condattn_k_norm", "q_layernorm", "k_layernorm"):
        m = getattr(site.module, name, None)
        if isinstance(m, nn.Module) and type(m) is not nn.Identity:
            return name
    return ""


def _why_not(site: AttentionSite) -> str:
    if site.lacks("q", "k"):
        return site.lacks("q", "k")
    norm = has_qk_norm(site)
    if norm:
        return f"its {norm} normalises q/k after W_Q/W_K, so scaling those weights leaves its logits unchanged"
    return ""


class QKClip:
    """One layer's clip (a handle: remove() does nothing; the rule's own handles undo the tracking)."""

    def __init__(self, site: AttentionSite, rule, tau: float, alpha: float):
        self.site, self.rule, self.tau, self.alpha = site, rule, tau, alpha
        self.clipped = 0  # heads clipped so far, summed over steps

    def remove(self) -> None:
        pass

    @torch.no_grad()
    def clip(self) -> None:
        site, heads = self.site, self.site.num_heads
        seen = self.rule.max_logits
        self.rule.max_logits = None
        seen = torch.full((heads,), -torch.inf) if seen is None else seen.float().reshape(-1)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(seen, op=torch.distributed.ReduceOp.MAX)
        if seen.numel() != heads:
            raise RuntimeError(f"qk_clip: {site.name} recorded {seen.numel()} heads' logits, its layout says {heads}")
        q_rows, k_rows = head_rows(site.proj["q"], site.head_dim), head_rows(site.proj["k"], site.head_dim)
        group_max = seen.view(len(k_rows), -1).amax(1)  # (key heads,): the largest logit its query heads saw
        if not bool((group_max > self.tau).any()):
            return
        eta = (self.tau / group_max).clamp(max=1.0)
        per_q = heads // len(k_rows)
        for h, rows in enumerate(q_rows):
            _scale_rows(site.proj["q"], rows, float(eta[h // per_q]) ** self.alpha)
        for g, rows in enumerate(k_rows):
            _scale_rows(site.proj["k"], rows, float(eta[g]) ** (1.0 - self.alpha))
        self.clipped += int((group_max > self.tau).sum()) * per_q


def _scale_rows(p, rows: torch.Tensor, factor: float) -> None:
    """Multiply a role's output rows (torch layout) of the stored weight by `factor` (Conv1D: its columns)."""
    if factor == 1.0:
        return
    w = as_matrix(stored_weight(p))
    idx = rows.to(w.device)
    if p.transposed:
        w[:, idx] *= factor
    else:
        w[idx] *= factor


def after_step(handles: list) -> None:
    """After an optimizer step: every layer's clip (MethodSpec.after_step)."""
    for h in handles:
        if isinstance(h, QKClip):
            h.clip()


def apply_qk_clip(model: nn.Module, report: PatchReport, tau: float = KIMI_TAU, alpha: float = 0.5,
                  partial: bool = False) -> list:
    """Track each head's largest logit at every layer that can be clipped; returns the handles (QKClip among them)."""
    handles: list = []
    for site, how, words in patchable(model, report, "qk_clip", partial, _why_not):
        rule = rule_of(site, how, handles)
        rule.track = True
        handles.append(QKClip(site, rule, float(tau), float(alpha)))
        bias = " (biases not scaled)" if getattr(site.proj["q"].linear, "bias", None) is not None else ""
        report.entries.append(PatchEntry(site.name, f"qk_clip:{site.layout}",
                                         f"{words}, fused kernel kept: after each step W_Q·η^{alpha:g}, "
                                         f"W_K·η^{1 - alpha:g} where max logit > τ={tau:g}{bias}"))
    report.notes.append("qk_clip acts after each optimizer step (condattn.after_optimizer_step(model); the trainer "
                        "calls it): without that call it only records the largest logits")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_qk_clip(model, report, tau=spec["qk_clip_tau"], alpha=spec["qk_clip_alpha"], partial=partial)


def _alpha(key: str, v) -> float:
    x = finite_number(0.0)(key, v)
    if x > 1:
        raise ValueError(f"conditioning.{key}={v!r} must be in [0, 1] (the share of the clip on W_Q; 0.5: √η each)")
    return x


register_method(MethodSpec("qk_clip", {"qk_clip_tau": KIMI_TAU, "qk_clip_alpha": 0.5},
                           label="qk_clip (QK-clip, MuonClip)", apply=_apply, after_step=after_step,
                           conflicts={"qk_norm": "QK-norm normalises q and k after W_Q / W_K, so the clip's scaling "
                                                 "would change nothing"},
                           validators={"qk_clip_tau": finite_number(1e-6, " (Kimi K2's τ is 100)"),
                                       "qk_clip_alpha": _alpha},
                           per_layer=True, short="QK-clip", rival=True,
                           bench_arms={"QK-clip": {}}, sources=("methods/qk_clip.py", "methods/logits.py"),
                           cost="one q·kᵀ per layer per training forward (no_grad) and a row rescale after each step"))
