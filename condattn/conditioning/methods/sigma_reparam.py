"""σReparam (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse";
reference: apple/ml-sigma-reparam): every reparametrised weight is used as Ŵ = γ / σ(W) · W.

- σ(W) = uᵀ W v, the spectral-norm estimate of power iteration: u, v are buffers (state_dict keys `sigma_u*`,
  `sigma_v*`), moved one power step per training forward (no_grad) and left alone in eval; gradients reach W
  through uᵀ W v with u, v constant, as in the reference.
- γ is a learnable scalar (`sigma_gamma*`), initialised to σ_max(W). u, v start at W's top singular vectors (one
  SVD when the method is applied), so Ŵ = W at init and σ(W) = σ_max(W) from the first step.
- scope=attention (default): W_Q, W_K and W_V of every attention site, one σ and γ per role (a fused qkv Linear
  holds three: the paper's W_Q, W_K, W_V are separate matrices; a site without W_Q, GCViT's global attention, has
  W_K and W_V only). scope=all_linear: also every other nn.Linear
  and transformers Conv1D of the model (the reference's `convert_to_sn` converts every Linear), one σ per weight.

Ŵ is built out of place from the parameter for the length of each forward of the module that reads it (the
module itself when it calls its weight, else the attention module that passes it to F.linear: timm Eva / BEiT
with q/v biases, nn.MultiheadAttention), as SCA's fold does; the parameter is never changed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import ROLES, as_matrix, require_attention
from ..spec import MethodSpec, choice, register_method
from .common import Undo, _is_conv1d

SCOPES = ("attention", "all_linear")


class SigmaReparam:
    """Ŵ of one weight parameter (`param` of `holder`): blocks of output rows (torch layout), each with its own
    σ = uᵀ W_b v and γ, registered on the holder as sigma_gamma{suffix}, sigma_u{suffix}, sigma_v{suffix}."""

    def __init__(self, holder: nn.Module, param: str, transposed: bool, owner: nn.Module):
        self.holder, self.param, self.transposed, self.owner = holder, param, transposed, owner
        self.blocks: list[tuple[str, torch.Tensor]] = []  # (suffix, torch-layout output rows)

    def _torch(self, w: torch.Tensor) -> torch.Tensor:
        return w.T if self.transposed else as_matrix(w)  # (a 1×1 convolution's (out, in) view)

    @torch.no_grad()
    def add_block(self, suffix: str, rows: torch.Tensor) -> None:
        w = self._torch(self.holder._parameters[self.param]).detach()[rows].float()
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        dt = self.holder._parameters[self.param].dtype
        self.holder.register_parameter(f"sigma_gamma{suffix}", nn.Parameter(s[0].to(dt).clone()))
        self.holder.register_buffer(f"sigma_u{suffix}", u[:, 0].to(dt).contiguous())
        self.holder.register_buffer(f"sigma_v{suffix}", vh[0].to(dt).contiguous())
        self.blocks.append((suffix, rows))

    def sigma(self, suffix: str, w_b: torch.Tensor, step: bool) -> torch.Tensor:
        u, v = getattr(self.holder, f"sigma_u{suffix}"), getattr(self.holder, f"sigma_v{suffix}")
        if step:  # one power iteration, no gradient (reference: SpectralNormedWeight.get_sigma)
            with torch.no_grad():
                wd = w_b.detach()
                v.copy_(F.normalize(wd.T @ u, dim=0))
                u.copy_(F.normalize(wd @ v, dim=0))
        return u.clone() @ w_b @ v.clone()  # (copies: a later call's power step must not touch saved tensors)

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        """Ŵ in the parameter's own layout, out of place: each block scaled by γ / σ."""
        wt = self._torch(w)
        step = self.owner.training and torch.is_grad_enabled()
        s = torch.ones(wt.shape[0], dtype=wt.dtype, device=wt.device)
        for suffix, rows in self.blocks:
            idx = rows.to(wt.device)
            gamma = getattr(self.holder, f"sigma_gamma{suffix}")
            factor = gamma / self.sigma(suffix, wt.index_select(0, idx), step)
            s = s.index_put((idx,), factor.to(s.dtype).expand(idx.numel()))
        return w * (s[None, :] if self.transposed else s.view(-1, *(1,) * (w.dim() - 1)))

    def drop(self) -> None:
        for suffix, _ in self.blocks:
            for name in (f"sigma_gamma{suffix}", f"sigma_u{suffix}", f"sigma_v{suffix}"):
                self.holder._parameters.pop(name, None)
                self.holder._buffers.pop(name, None)


class FoldReparam:
    """Hooks on an owner module: during its forward each holder's weight attribute is Ŵ (in the holder's instance
    __dict__, found before nn.Module's parameters), removed when the forward ends, also on an exception."""

    def __init__(self, reparams: list[SigmaReparam]):
        self.reparams = reparams

    def fold(self, module: nn.Module, args: tuple) -> None:
        for r in self.reparams:
            r.holder.__dict__[r.param] = r.weight(r.holder._parameters[r.param])

    def unfold(self, module: nn.Module, args: tuple, output) -> None:
        for r in self.reparams:
            r.holder.__dict__.pop(r.param, None)

    def attach(self, owner: nn.Module) -> list:
        return [owner.register_forward_pre_hook(self.fold), owner.register_forward_hook(self.unfold, always_call=True)]


def _drop_all(reparams: list[SigmaReparam]) -> None:
    for r in reparams:
        r.drop()


def apply_sigma_reparam(model: nn.Module, report: PatchReport, scope: str = "attention", partial: bool = False) -> list:
    """σReparam on the attention projections (scope=attention) or every Linear (all_linear); returns the handles."""
    if scope not in SCOPES:
        raise ValueError(f"sigma_reparam: scope={scope!r} is invalid; choose one of {list(SCOPES)}")
    sites, warnings = require_attention(model, "sigma_reparam", partial)
    report.warnings += warnings
    reparams: dict[tuple[int, str], SigmaReparam] = {}
    for site in sites:
        for role, p in site.proj.items():
            key = (id(p.linear), p.param)
            if key not in reparams:
                owner = p.linear if p.called else site.module
                reparams[key] = SigmaReparam(p.linear, p.param, p.transposed, owner)
            suffix = f"_{role}" if p.param == "weight" else f"_{p.param}_{role}"
            reparams[key].add_block(suffix, p.rows)
        lacks = f"; {site.lacks(*ROLES)}" if site.missing else ""  # (GCViT's global attention: W_K, W_V only)
        report.entries.append(PatchEntry(site.name, f"sigma_reparam:{site.layout}",
                                         f"{'/'.join(site.proj)} heads={site.num_heads}x{site.head_dim}{lacks}"))
    if scope == "all_linear":
        mha_out = {id(m.out_proj): m for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
        for name, m in model.named_modules():
            if not (isinstance(m, nn.Linear) or _is_conv1d(m)) or (id(m), "weight") in reparams:
                continue
            r = SigmaReparam(m, "weight", _is_conv1d(m), mha_out.get(id(m), m))  # MHA reads out_proj.weight itself
            r.add_block("", torch.arange(r._torch(m.weight).shape[0]))
            reparams[(id(m), "weight")] = r
            report.entries.append(PatchEntry(name, "sigma_reparam:linear", f"{tuple(m.weight.shape)}"))
    by_owner: dict[int, tuple[nn.Module, list[SigmaReparam]]] = {}
    for r in reparams.values():
        by_owner.setdefault(id(r.owner), (r.owner, []))[1].append(r)
    handles: list = []
    for owner, rs in by_owner.values():
        handles += FoldReparam(rs).attach(owner)
    handles.append(Undo(_drop_all, list(reparams.values())))
    blocks = sum(len(r.blocks) for r in reparams.values())
    report.notes.append(f"sigma_reparam adds {blocks} learnable γ (init σ_max(W)) and {2 * blocks} power-iteration "
                        "buffers u, v: the state_dict gains their keys (sigma_gamma*, sigma_u*, sigma_v*)")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_sigma_reparam(model, report, scope=spec["scope"], partial=partial)


register_method(MethodSpec("sigma_reparam", {"scope": "attention"}, label="sigma_reparam (σReparam)",
                           validators={"scope": choice(SCOPES)}, apply=_apply))
