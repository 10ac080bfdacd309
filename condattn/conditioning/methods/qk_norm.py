"""QK-norm (Dehghani et al. 2023, ViT-22B; timm's `qk_norm=True`): a LayerNorm (or RMSNorm) over each head's
head_dim features of q and of k, before the logits. One norm for q and one for k per attention layer, shared by its
heads (as timm's `q_norm` / `k_norm`), initialised to weight 1, bias 0.

Two ways in, chosen per site:
- native: the attention module has timm's `q_norm` / `k_norm` slots holding nn.Identity (timm `Attention`, Eva's
  `EvaAttention`, `AttentionRope`). They receive the norms, so the model is the one timm builds with `qk_norm=True`
  (the same modules, state_dict keys and forward; RoPE rotates after the norm, as there).
- patched: a forward hook on the q and k projections normalises each head's slice of their output (fused qkv:
  one hook on the Linear covering both slices). The norms are registered on the attention module as
  `condattn_q_norm` / `condattn_k_norm`.

Both add parameters (2 · head_dim per norm with LayerNorm): the state_dict gains their keys; removal deletes them.
Not applied where the logits are not q·kᵀ over the tokens (XCiT's XCA, DaViT's channel attention: listed as
skipped), nor on 1×1-conv projections (channels on axis 1) or heads 1 wide (listed as skipped), nor where the module
reads its projection weight itself and never calls a projection the hook could see (timm BEiT with q/v biases,
nn.MultiheadAttention), nor where the layer has no W_Q (GCViT's global attention: its queries are the stage's
global query tokens; listed as skipped).
"""

from __future__ import annotations

import torch
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import require_attention
from ..spec import MethodSpec, choice, register_method
from .common import Undo, not_token_softmax

NORMS = ("layernorm", "rmsnorm")
EPS = 1e-6  # timm's ViT / Eva norm_layer (LayerNorm(eps=1e-6)), which its qk_norm=True uses


def make_norm(kind: str, dim: int) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=EPS)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=EPS)
    raise ValueError(f"qk_norm: norm={kind!r} is invalid; choose one of {list(NORMS)}")


class HeadNormHook:
    """Forward hook on a projection: each (cols, norm) slice of its output is normalised per head of head_dim."""

    def __init__(self, head_dim: int):
        self.head_dim = head_dim
        self.slices: list[tuple[torch.Tensor, nn.Module]] = []  # (output rows of the role, its norm)

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        for rows, norm in self.slices:  # out of place: index_select, then index_copy of the normalised heads
            idx = rows.to(output.device)
            seg = output.index_select(-1, idx)
            output = output.index_copy(-1, idx, norm(seg.unflatten(-1, (-1, self.head_dim))).flatten(-2))
        return output


def _restore_native(module: nn.Module) -> None:
    module.q_norm, module.k_norm = nn.Identity(), nn.Identity()


def _drop_added(module: nn.Module) -> None:
    for name in ("condattn_q_norm", "condattn_k_norm"):
        if name in module._modules:
            del module._modules[name]


def _why_not(site) -> str:
    """Why qk_norm cannot go on this site by the patch ('' when it can)."""
    reason = not_token_softmax(site)
    if reason:
        return reason + " (XCA already L2-normalises q and k)" if site.form.name == "xca" else reason
    if site.lacks("q", "k"):  # GCViT's global attention (layouts/timm_gcvit.py)
        return f"it has {site.lacks('q', 'k')}, so no q projection output for the per-head norm hook"
    if "BatchNorm" in site.note:  # layouts/timm_bn.py
        return f"its q/k projections are followed by BatchNorm ({site.note}): a norm of W x is not the q of q·kᵀ"
    if any(isinstance(site.proj[r].linear, nn.modules.conv._ConvNd) for r in ("q", "k")):
        return ("its q/k projections are 1×1 convolutions (channels on axis 1): the per-head norm hook normalises "
                "the last axis")
    if site.head_dim == 1:
        return "its heads are 1 wide: a norm over one feature is constant"
    if not (site.proj["q"].called and site.proj["k"].called):
        return (f"{type(site.module).__name__} reads its projection weight itself, so no q/k projection output "
                "passes a module a hook can reach")
    return ""


def _plan(site) -> str:
    """'native', 'patch', or why QK-norm cannot go on this site."""
    q_slot, k_slot = getattr(site.module, "q_norm", None), getattr(site.module, "k_norm", None)
    if isinstance(q_slot, nn.Module) and isinstance(k_slot, nn.Module) and not not_token_softmax(site):
        return "native" if type(q_slot) is nn.Identity and type(k_slot) is nn.Identity else "already has q/k norms"
    return _why_not(site) or "patch"


def apply_qk_norm(model: nn.Module, report: PatchReport, norm: str = "layernorm", partial: bool = False) -> list:
    """Put QK-norm on every token-softmax attention site of `model`; returns the handles that undo it. Every site
    is planned before the model is touched, so a refusal leaves it as it was."""
    make_norm(norm, 1)  # (the option's check, before anything is changed)
    sites, warnings = require_attention(model, "qk_norm", partial)
    report.warnings += warnings
    plan = [(site, _plan(site)) for site in sites]
    if not any(how in ("native", "patch") for _, how in plan):
        why = "; ".join(sorted({how for _, how in plan}))
        raise ValueError(f"qk_norm: no attention layer of {type(model).__name__} takes QK-norm ({why})")
    handles: list = []
    hooks: dict[int, tuple[nn.Module, HeadNormHook]] = {}
    added = 0
    for site, how in plan:
        m, d = site.module, site.head_dim
        if how == "native":
            m.q_norm, m.k_norm = make_norm(norm, d), make_norm(norm, d)
            handles.append(Undo(_restore_native, m))
            report.entries.append(PatchEntry(site.name, f"qk_norm:{site.layout}", f"native q_norm/k_norm {norm}({d})"))
        elif how == "patch":
            m.condattn_q_norm, m.condattn_k_norm = make_norm(norm, d), make_norm(norm, d)
            handles.append(Undo(_drop_added, m))
            for role, nm in (("q", m.condattn_q_norm), ("k", m.condattn_k_norm)):
                p = site.proj[role]
                if id(p.linear) not in hooks:
                    hooks[id(p.linear)] = (p.linear, HeadNormHook(d))
                hooks[id(p.linear)][1].slices.append((p.rows, nm))
            report.entries.append(PatchEntry(site.name, f"qk_norm:{site.layout}", f"hooked q/k outputs {norm}({d})"))
        else:
            report.skipped.append(PatchEntry(site.name, f"qk_norm:{site.layout}", how))
            continue
        added += 2
    for linear, hook in hooks.values():
        handles.append(linear.register_forward_hook(hook))
    per = 2 if norm == "layernorm" else 1
    report.notes.append(f"qk_norm adds {added} {norm} modules ({per} parameter vector(s) of head_dim each): the "
                        "state_dict gains their keys (weight 1, bias 0 at init)")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_qk_norm(model, report, norm=spec["norm"], partial=partial)


register_method(MethodSpec("qk_norm", {"norm": "layernorm"}, label="qk_norm (QK-norm)",
                           validators={"norm": choice(NORMS)}, apply=_apply))
