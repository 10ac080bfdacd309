"""QK-clip (Kimi K2's MuonClip; public reference: Megatron-LM's `clip_qk`, restated here in our words): during the
training forwards of a step each attention layer records, per head, its largest logit q·kᵀ·scale (over the batch
and the (query, key) pairs its mask keeps); after the optimizer step, a head whose largest logit S passed the
threshold τ has its W_Q rows scaled by η^α and its W_K rows by η^(1−α), η = τ / S, α = 0.5 by default (√(τ / S)
each). Under grouped-query attention a key head is shared by a group of query heads: η is taken from the group's
largest S and applied to every query head of the group and to its key head (Megatron's SelfAttention.clip_qk), and
the clip is counted once per group (`QKClip.clipped`: groups clipped, summed over steps). The records are cleared
after every clip, so each step is judged by its own forwards.

What holds, exactly: the bound is on the logits read in the step's own forwards. With the weights those forwards
used, the clipped group's largest logit on those inputs becomes τ (the logit is bilinear in the q and k rows). The
clip runs after `optimizer.step()` on the weights the step produced, so the next forward's largest logit is τ times
the step's change, not τ: it is a bound on what was read, re-applied every step, not a guarantee on new inputs.

Biases: on a bias-free model the clip is Megatron's `clip_qk` as it stands (weights only). Where W_Q / W_K have
biases (timm's ViT default `qkv_bias=True`), each scaled row's bias entry is scaled with it (q = x W_qᵀ + b_q: both
terms by η^α), so the logit on the measured inputs is exactly τ there too: our extension for biased models; scaling
the weights alone leaves the logit above τ. A bias the module keeps apart from its projection (timm Eva / BEiT's
`q_bias`, read by F.linear itself) is not scaled: those sites say so in their report entry.

No parameters and no change to the forward's numbers: the largest logit is read by one more q·kᵀ under no_grad
beside the fused kernel (methods/logits.py routes the kernel call). The clip needs a call after each optimizer step:
the trainer makes it (MethodSpec.after_step); with your own loop call `condattn.after_optimizer_step(model)` after
`optimizer.step()`. A model that runs WARN_AFTER training forwards with the clip armed and that call never made warns
once (QKClipNotCalled). Under torch.distributed the records are reduced (max) over the ranks first. The clip lives in
the weights: a plain load of a qk_clip checkpoint gives the same outputs, and loses only the clip in further training.

Refused where q and k are normalised after their projections (q_norm / k_norm: Qwen3, OLMo2, timm qk_norm=True):
a norm undoes any scaling of W_Q and W_K, so the clip would change nothing; and where the layer has no W_Q.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import AttentionSite, as_matrix, stored_weight
from ..spec import MethodSpec, finite_number, register_method
from .common import head_rows
from .logits import patchable, rule_of

KIMI_TAU = 100.0  # Kimi K2's threshold τ
WARN_AFTER = 200  # training forwards with the clip armed and never applied before the one warning


class QKClipNotCalled(UserWarning):
    """qk_clip recorded logits over many training forwards, and condattn.after_optimizer_step was never called."""


class _Watch:
    """Counts one layer's training forwards since its clip last ran; warns once (for the whole model) when
    WARN_AFTER pass with the clip never applied."""

    def __init__(self, shared: dict):
        self.shared = shared  # {"warned": bool, "clipped_ever": bool}: one per model
        self.forwards = 0

    def seen(self) -> None:
        self.forwards += 1
        if self.forwards >= WARN_AFTER and not self.shared["clipped_ever"] and not self.shared["warned"]:
            self.shared["warned"] = True
            warnings.warn(f"qk_clip: {self.forwards} training forwards recorded their largest logits and no clip ran: "
                          "call condattn.after_optimizer_step(model) after every optimizer.step() (or once: "
                          "optimizer.register_step_post_hook(lambda *_: condattn.after_optimizer_step(model))); "
                          "without it the logits are never bounded", QKClipNotCalled, stacklevel=3)


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

    def __init__(self, site: AttentionSite, rule, tau: float, alpha: float, watch: _Watch):
        self.site, self.rule, self.tau, self.alpha, self.watch = site, rule, tau, alpha, watch
        self.clipped = 0  # key/value groups clipped so far (heads, without grouped-query attention), over steps
        rule.on_seen = watch.seen

    def remove(self) -> None:
        self.rule.on_seen = None

    @torch.no_grad()
    def clip(self) -> None:
        site, heads = self.site, self.site.num_heads
        self.watch.forwards = 0
        self.watch.shared["clipped_ever"] = True
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
        self.clipped += int((group_max > self.tau).sum())  # (per key/value group: one clip scales the whole group)


def _scale_rows(p, rows: torch.Tensor, factor: float) -> None:
    """Multiply a role's output rows (torch layout) of the stored weight by `factor` (Conv1D: its columns), and the
    same entries of its projection's bias, where it has one (the module docstring: our extension for biases)."""
    if factor == 1.0:
        return
    w = as_matrix(stored_weight(p))
    idx = rows.to(w.device)
    if p.transposed:
        w[:, idx] *= factor
    else:
        w[idx] *= factor
    bias = _bias(p)
    if bias is not None:
        bias[idx.to(bias.device)] *= factor


def _bias(p) -> torch.Tensor | None:
    """The bias added to this projection's output rows by the projection itself (None when it has none)."""
    b = getattr(p.linear, "bias", None) if p.param == "weight" and p.called else None
    return b if isinstance(b, torch.Tensor) else None


def _apart(site: AttentionSite) -> str:
    """A q/k bias the module keeps apart from its projections ('' when none): not scaled by the clip."""
    names = [n for n in ("q_bias", "k_bias") if isinstance(getattr(site.module, n, None), torch.Tensor)]
    return f" ({'/'.join(names)} kept apart from the projection: not scaled)" if names else ""


def after_step(handles: list) -> None:
    """After an optimizer step: every layer's clip (MethodSpec.after_step)."""
    for h in handles:
        if isinstance(h, QKClip):
            h.clip()


def apply_qk_clip(model: nn.Module, report: PatchReport, tau: float = KIMI_TAU, alpha: float = 0.5,
                  partial: bool = False) -> list:
    """Track each head's largest logit at every layer that can be clipped; returns the handles (QKClip among them)."""
    handles: list = []
    shared = {"warned": False, "clipped_ever": False}
    for site, how, words in patchable(model, report, "qk_clip", partial, _why_not):
        rule = rule_of(site, how, handles)
        rule.track = True
        handles.append(QKClip(site, rule, float(tau), float(alpha), _Watch(shared)))
        biased = [r for r in ("q", "k") if _bias(site.proj[r]) is not None]
        bias = f" (with their {'/'.join(f'b_{r.upper()}' for r in biased)} entries)" if biased else ""
        groups = len(head_rows(site.proj["k"], site.head_dim))
        per = f", per key/value group ({groups} groups)" if groups != site.num_heads else ""
        report.entries.append(PatchEntry(site.name, f"qk_clip:{site.layout}",
                                         f"{words}, fused kernel kept: after each step W_Q·η^{alpha:g}, "
                                         f"W_K·η^{1 - alpha:g}{bias} where max logit > τ={tau:g}{per}{_apart(site)}"))
    report.notes.append("qk_clip acts after each optimizer step (condattn.after_optimizer_step(model); the trainer "
                        "calls it): without that call it only records the largest logits, and warns once after "
                        f"{WARN_AFTER} training forwards. It bounds the logits its step's forwards read: with those "
                        "weights and inputs the clipped group's largest logit becomes τ")
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
                           plain_load=("the clip lives in the weights, so the outputs are the conditioned model's; "
                                       "what is lost is the clip itself: further training runs without it"),
                           bench_arms={"QK-clip": {}}, sources=("methods/qk_clip.py", "methods/logits.py"),
                           cost="one q·kᵀ per layer per training forward (no_grad) and a row rescale after each step"))
