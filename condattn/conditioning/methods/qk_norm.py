"""QK-norm (Dehghani et al. 2023, ViT-22B; timm's `qk_norm=True`): a norm over each head's head_dim features of q and
of k, before the logits. One norm for q and one for k per attention layer, shared by its heads (as timm's `q_norm` /
`k_norm`), at its own init (weight 1, bias 0).

Which norm (`norm`): timm builds `q_norm = norm_layer(head_dim)` from the `norm_layer` the block gets, so by default
(`norm=model`) the norm is the model's own: the nearest last-axis norm around the attention layer (its block's
`norm1`, BERT's `output.LayerNorm`, Llama's `input_layernorm`), of the same class and eps, resized to head_dim.
That is LayerNorm(eps=1e-6) on a plain timm ViT, LayerNorm(eps=1e-5) on a CLIP-style one, timm's RmsNorm where the
model is built with `norm_layer='rmsnorm'`. Where no such norm is found (a model with channel-first or batch norms
only), LayerNorm(eps=1e-6), timm's default, and the report says so. `norm=layernorm` / `rmsnorm` overrides the
model's choice with torch's LayerNorm / RMSNorm at eps 1e-6.

Two ways in, chosen per site:
- native: the attention module has timm's `q_norm` / `k_norm` slots holding nn.Identity (timm `Attention`, Eva's
  `EvaAttention`, `AttentionRope`). They receive the norms, so the model is the one timm builds with `qk_norm=True`
  (the same modules, state_dict keys and forward; RoPE rotates after the norm, as there).
- patched: the q and k projections' outputs are normalised per head (fused qkv: one projection covering both
  slices). A plain nn.Linear switches class in place to `QKNormedLinear` (same parameters), whose forward applies
  the norms, so torch.fx and torch.export trace them (a forward hook on a leaf Linear is invisible to fx); any
  other projection class (GPT-2's Conv1D) gets a forward hook. The norms are registered on the attention module as
  `condattn_q_norm` / `condattn_k_norm`.

Both add parameters (the norm's weight, and bias where it has one): the state_dict gains their keys; removal deletes
them. Not applied where the logits are not q·kᵀ over the tokens (XCiT's XCA, DaViT's channel attention: listed as
skipped), nor on 1×1-conv projections (channels on axis 1) or heads 1 wide (listed as skipped), nor where the module
reads its projection weight itself and never calls a projection the hook could see (timm BEiT with q/v biases,
nn.MultiheadAttention), nor where the layer has no W_Q (GCViT's global attention: its queries are the stage's
global query tokens; listed as skipped).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import require_attention
from ..spec import MethodSpec, choice, register_method
from .common import Undo, not_token_softmax

NORMS = ("model", "layernorm", "rmsnorm")
EPS = 1e-6  # timm's ViT / Eva norm_layer (LayerNorm(eps=1e-6)): the fallback, and the eps of the two overrides


def make_norm(kind: str, dim: int) -> nn.Module:
    """The override norms (`norm=layernorm|rmsnorm`); `model` is resolved per site by `model_norm`."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=EPS)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=EPS)
    raise ValueError(f"qk_norm: norm={kind!r} is invalid; choose one of {list(NORMS)}")


def is_last_axis_norm(m: nn.Module) -> bool:
    """A LayerNorm / RMSNorm over the last axis only (not timm's LayerNorm2d, which permutes channels first)."""
    name = type(m).__name__
    if "2d" in name.lower() or "channels" in name.lower():
        return False
    if isinstance(m, nn.LayerNorm | nn.RMSNorm):
        return len(m.normalized_shape) == 1
    w = getattr(m, "weight", None)
    return name.lower().endswith("rmsnorm") and isinstance(w, torch.Tensor) and w.dim() == 1


def model_norm(model: nn.Module, site_name: str) -> tuple[nn.Module, str] | None:
    """(the norm, its name) that the site's block uses: the first last-axis norm (is_last_axis_norm) in the nearest
    ancestor of the site that holds one outside the site itself; None where the model has none around it."""
    parts = site_name.split(".") if site_name else []
    inside = site_name + "."
    for depth in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:depth])
        anc = model.get_submodule(prefix) if prefix else model
        for name, m in anc.named_modules(prefix=prefix):
            if name != site_name and not name.startswith(inside) and is_last_axis_norm(m):
                return m, name
    return None


@torch.no_grad()
def resized(norm: nn.Module, dim: int) -> nn.Module:
    """A fresh copy of `norm` (its class, eps and flags) over `dim` features, at its own init (weight 1, bias 0):
    what timm's `norm_layer(head_dim)` builds."""
    new = copy.deepcopy(norm)
    for name, p in norm.named_parameters(recurse=False):
        new._parameters[name] = nn.Parameter(torch.empty(dim, dtype=p.dtype, device=p.device),
                                             requires_grad=p.requires_grad)
    if hasattr(new, "normalized_shape"):
        new.normalized_shape = (dim,)
    if hasattr(new, "reset_parameters"):
        new.reset_parameters()
    else:  # (transformers' RMSNorms: weight ones at init)
        for name, p in new.named_parameters(recurse=False):
            p.fill_(0.0 if name == "bias" else 1.0)
    return new


def describe(norm: nn.Module) -> str:
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    return f"{type(norm).__name__}(eps={eps:g})" if isinstance(eps, float) else type(norm).__name__


class NormFactory:
    """The norm each site gets: the model's own (`model`), or an override."""

    def __init__(self, model: nn.Module, kind: str):
        make_norm(kind, 1) if kind != "model" else None  # (the option's check, before anything is changed)
        self.model, self.kind = model, kind

    def __call__(self, site_name: str, dim: int) -> tuple[nn.Module, str]:
        """(a norm over `dim`, where its kind comes from)."""
        if self.kind != "model":
            norm = make_norm(self.kind, dim)
            return norm, f"{describe(norm)}, norm={self.kind}"
        found = model_norm(self.model, site_name)
        if found is None:
            norm = nn.LayerNorm(dim, eps=EPS)
            return norm, f"{describe(norm)}: no last-axis norm around the layer, timm's default"
        norm = resized(found[0], dim)
        return norm, f"{describe(norm)} as {found[1]}"


class HeadNormHook:
    """On a projection's output: each (rows, norm) slice is normalised per head of head_dim (out of place:
    index_select, then index_copy of the normalised heads). A forward hook, or called by QKNormedLinear."""

    def __init__(self, head_dim: int):
        self.head_dim = head_dim
        self.slices: list[tuple[torch.Tensor, nn.Module]] = []  # (output rows of the role, its norm)

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        for rows, norm in self.slices:
            idx = rows.to(output.device)
            seg = output.index_select(-1, idx)
            output = output.index_copy(-1, idx, norm(seg.unflatten(-1, (-1, self.head_dim))).flatten(-2))
        return output


class QKNormedLinear(nn.Linear):
    """An nn.Linear whose output goes through its `_condattn_qk` (HeadNormHook): parameters and state_dict
    unchanged; not a torch.nn leaf, so torch.fx traces the norms inside it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._condattn_qk(self, (x,), F.linear(x, self.weight, self.bias))


def _unswap(linear: nn.Module) -> None:
    if type(linear) is QKNormedLinear:
        linear.__class__ = nn.Linear
    linear.__dict__.pop("_condattn_qk", None)


def _attach(linear: nn.Module, hook: HeadNormHook) -> list:
    if type(linear) is nn.Linear:
        linear._condattn_qk = hook
        linear.__class__ = QKNormedLinear
        return [Undo(_unswap, linear)]
    return [linear.register_forward_hook(hook)]


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


def plan_qk_norm(model: nn.Module, partial: bool = False) -> tuple[list, list[str]]:
    """((site, 'native' | 'patch' | why not) for every site, warnings), or a refusal when no site takes QK-norm:
    found before any part of a composite touches the model."""
    sites, warnings = require_attention(model, "qk_norm", partial)
    plan = [(site, _plan(site)) for site in sites]
    if not any(how in ("native", "patch") for _, how in plan):
        why = "; ".join(sorted({how for _, how in plan}))
        raise ValueError(f"qk_norm: no attention layer of {type(model).__name__} takes QK-norm ({why})")
    return plan, warnings


def apply_qk_norm(model: nn.Module, report: PatchReport, norm: str = "model", partial: bool = False,
                  planned: tuple[list, list[str]] | None = None) -> list:
    """Put QK-norm on every token-softmax attention site of `model`; returns the handles that undo it. Every site
    is planned before the model is touched, so a refusal leaves it as it was."""
    factory = NormFactory(model, norm)
    plan, warnings = planned or plan_qk_norm(model, partial)
    report.warnings += warnings
    handles: list = []
    hooks: dict[int, tuple[nn.Module, HeadNormHook]] = {}
    added, params = 0, 0
    for site, how in plan:
        m, d = site.module, site.head_dim
        if how not in ("native", "patch"):
            report.skipped.append(PatchEntry(site.name, f"qk_norm:{site.layout}", how))
            continue
        (qn, what), (kn, _) = factory(site.name, d), factory(site.name, d)
        if how == "native":
            m.q_norm, m.k_norm = qn, kn
            handles.append(Undo(_restore_native, m))
            detail = f"native q_norm/k_norm {what} over {d}"
        else:
            m.condattn_q_norm, m.condattn_k_norm = qn, kn
            handles.append(Undo(_drop_added, m))
            for role, nm in (("q", qn), ("k", kn)):
                p = site.proj[role]
                if id(p.linear) not in hooks:
                    hooks[id(p.linear)] = (p.linear, HeadNormHook(d))
                hooks[id(p.linear)][1].slices.append((p.rows, nm))
            detail = f"q/k outputs normed per head: {what} over {d}"
        report.entries.append(PatchEntry(site.name, f"qk_norm:{site.layout}", detail))
        added += 2
        params += sum(p.numel() for p in (*qn.parameters(), *kn.parameters()))
    for linear, hook in hooks.values():
        handles += _attach(linear, hook)
    report.notes.append(f"qk_norm adds {added} norm modules ({params} parameters): the state_dict gains their keys "
                        "(at the norm's own init: weight 1, bias 0)")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False, planned=None) -> list:
    return apply_qk_norm(model, report, norm=spec["norm"], partial=partial, planned=planned)


register_method(MethodSpec("qk_norm", {"norm": "model"}, label="qk_norm (QK-norm)",
                           validators={"norm": choice(NORMS)}, apply=_apply, per_layer=True, short="QK-norm",
                           plan=lambda model, spec, partial=False: plan_qk_norm(model, partial),
                           cost="two per-head norms of q and k per layer per forward", adds_keys=True, rival=True,
                           sources=("methods/qk_norm.py",), bench_arms={"QK-norm": {}}))
