"""Gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models"; timm's `Attention(gated=True)`,
transformers' Qwen3-Next): the heads' merged output is multiplied by a sigmoid gate of the layer's input before W_O,

    o ← o ⊙ σ(x W_g + b_g)        x: the input of W_Q (the query stream); W_g: D_in × H·d

`gate=elementwise` (default; timm's and Qwen3-Next's): one gate per output feature of every head. `gate=headwise`:
one gate per head (W_g: D_in × H), the paper's head-wise variant, broadcast over the head's d features.

Two ways in, chosen per site:
- native: timm's `Attention` / `AttentionRope` built without a gate have a `gate` slot holding None; it receives
  nn.Linear(dim, attn_dim, bias=qkv_bias), so the patched module is the one timm builds with gated=True (the same
  state_dict keys and forward). Elementwise only.
- patched: W_Q's input is kept and W_O's input gated (a plain nn.Linear switches class in place, `GateInput` /
  `GatedOutput`, so torch.fx traces them; other projection classes get forward hooks); the gate is registered on the
  attention module as `condattn_gate`.
The gate is initialised as W_Q is drawn (weights N(0, std(W_Q)²), bias 0), as Qwen3-Next's gate rows are rows of its
q_proj; σ(0) = ½ halves the attention output at init. Adds parameters (new state_dict keys). Refused where the layer
has a gate already, has no W_Q, projects with 1×1 convolutions, or has no W_O that is called as a module (W_O is
found by structure, methods/common.output_projection: the last Linear the forward applies to the attention's output,
whatever its name).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx._symbolic_trace import is_fx_tracing

from ..report import PatchEntry, PatchReport
from ..sites import AttentionSite, as_matrix, require_attention, stored_weight
from ..spec import MethodSpec, choice, register_method
from .common import Undo, _is_conv1d, output_and_why

GATES = ("elementwise", "headwise")


class GateLink:
    """W_Q's last input, handed to W_O's gate (held only between the two calls)."""

    def __init__(self, gate: nn.Module, heads: int, headwise: bool):
        self.gate, self.heads, self.headwise = gate, heads, headwise
        self.x: torch.Tensor | None = None

    def keep(self, module: nn.Module, args: tuple) -> None:
        self.x = args[0]

    def gated(self, o: torch.Tensor) -> torch.Tensor:
        x, self.x = self.x, None
        if is_fx_tracing() and x is not None:  # torch.fx: shapes are proxies, so no checks; the same reshape
            return o * self._sigmoid(x.reshape(o.shape[:-1] + x.shape[-1:]), o)
        if x is not None and x.shape[:-1] != o.shape[:-1] and x[..., 0].numel() == o[..., 0].numel():
            x = x.reshape(*o.shape[:-1], x.shape[-1])  # the same tokens, shaped apart (CaiT/XCiT's class attention)
        if x is None or x.shape[:-1] != o.shape[:-1]:
            got = "no W_Q call" if x is None else f"W_Q input {tuple(x.shape)}"
            raise RuntimeError(f"gated_attention: W_O's input {tuple(o.shape)} does not follow its layer's W_Q call "
                               f"({got}); the gate needs the query stream of the same tokens")
        return o * self._sigmoid(x, o)

    def _sigmoid(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        g = torch.sigmoid(self.gate(x))
        return g.repeat_interleave(o.shape[-1] // self.heads, dim=-1) if self.headwise else g

    def pre_hook(self, module: nn.Module, args: tuple):
        return (self.gated(args[0]), *args[1:])


class GateInput(nn.Linear):
    """An nn.Linear (W_Q) that hands its input to its `_condattn_gate_link`; parameters unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._condattn_gate_link.keep(self, (x,))
        return F.linear(x, self.weight, self.bias)


class GatedOutput(nn.Linear):
    """An nn.Linear (W_O) whose input is gated by its `_condattn_gate_link`; parameters unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._condattn_gate_link.gated(x), self.weight, self.bias)


def _unswap(linear: nn.Module) -> None:
    if type(linear) in (GateInput, GatedOutput):
        linear.__class__ = nn.Linear
    linear.__dict__.pop("_condattn_gate_link", None)


def _attach(linear: nn.Module, link: GateLink, swap: type, hook) -> list:
    if type(linear) is nn.Linear:
        linear._condattn_gate_link = link
        linear.__class__ = swap
        return [Undo(_unswap, linear)]
    return [linear.register_forward_pre_hook(hook)]


def _native(site: AttentionSite) -> bool:
    m = site.module
    timm = type(m).__module__.startswith("timm.") and type(m).__name__ in ("Attention", "AttentionRope")
    return timm and "gate" in m.__dict__ and m.__dict__["gate"] is None and hasattr(m, "attn_dim")


def _new_gate(site: AttentionSite, width: int) -> nn.Linear:
    p = site.proj["q"]
    w = as_matrix(stored_weight(p)).detach()
    d_in = w.shape[0] if p.transposed else w.shape[1]
    gate = nn.Linear(d_in, width, bias=getattr(p.linear, "bias", None) is not None, dtype=w.dtype, device=w.device)
    if w.is_meta:  # (built on the meta device: no values to draw from; the loaded weights or _init_weights fill it)
        return gate
    with torch.no_grad():
        gate.weight.normal_(0.0, float(w.float().std()))
        if gate.bias is not None:
            gate.bias.zero_()
    return gate


def _why_not(model: nn.Module, site: AttentionSite, gate: str):
    """(W_O, '') where the hook path can go, (None, why) where nothing can."""
    m = site.module
    if isinstance(getattr(m, "gate", None), nn.Module):
        return None, f"{type(m).__name__} has an output gate already (`gate`)"
    if site.lacks("q"):
        return None, site.lacks("q")
    if site.form.over != "tokens":
        return None, f"{site.form.name} attention: its output is not heads × tokens"
    p = site.proj["q"]
    if not (isinstance(p.linear, nn.Linear) or _is_conv1d(p.linear)) or not p.called:
        return None, "its W_Q is not a Linear called as a module (a 1×1 convolution, or a weight read directly)"
    out, why = output_and_why(model, site)
    if out is None:
        return None, f"{why} (the gate multiplies W_O's input)"
    if not out.called:
        return None, f"its W_O {out.name} is {out.how} (the gate multiplies W_O's input, so it needs a module call)"
    return out, ""


def _drop_gate(m: nn.Module) -> None:
    m._modules.pop("condattn_gate", None)


def _unset_native(m: nn.Module) -> None:
    m._modules.pop("gate", None)
    m.__dict__["gate"] = None  # (as timm builds it with gated=False: a plain attribute)


def _patch(model, site, gate: str, report: PatchReport, handles: list) -> int:
    """Gate one site; returns the parameters added (0: skipped, with why in the report)."""
    kind = f"gated_attention:{site.layout}"
    if gate == "elementwise" and _native(site):
        site.module.gate = _new_gate(site, site.module.attn_dim)
        handles.append(Undo(_unset_native, site.module))
        report.entries.append(PatchEntry(site.name, kind, f"native gate: Linear → {site.module.attn_dim}, sigmoid"))
        return sum(p.numel() for p in site.module.gate.parameters())
    out, why = _why_not(model, site, gate)
    if out is None:
        report.skipped.append(PatchEntry(site.name, kind, why))
        return 0
    width = site.num_heads * site.head_dim if gate == "elementwise" else site.num_heads  # (= W_O's input width)
    g = _new_gate(site, width)
    site.module.condattn_gate = g
    handles.append(Undo(_drop_gate, site.module))
    link = GateLink(g, site.num_heads, gate == "headwise")
    handles += _attach(site.proj["q"].linear, link, GateInput, link.keep)
    handles += _attach(out.module, link, GatedOutput, link.pre_hook)
    report.entries.append(PatchEntry(site.name, kind, f"{gate} gate on the input of {out.name}: Linear → {width}, "
                                                      f"sigmoid, from W_Q's input; W_O {out.how}"))
    return sum(p.numel() for p in g.parameters())


def apply_gated_attention(model: nn.Module, report: PatchReport, gate: str = "elementwise",
                          partial: bool = False) -> list:
    if gate not in GATES:
        raise ValueError(f"gated_attention: gate={gate!r} is invalid; choose one of {list(GATES)}")
    sites, warnings = require_attention(model, "gated_attention", partial)
    report.warnings += warnings
    for site in sites:  # every site checked before anything is written
        if not (gate == "elementwise" and _native(site)) and _why_not(model, site, gate)[0] is None:
            continue
        break
    else:
        why = "; ".join(sorted({_why_not(model, s, gate)[1] for s in sites}))
        raise ValueError(f"gated_attention: no attention layer of {type(model).__name__} takes a gate ({why}); "
                         "nothing was changed")
    handles: list = []
    params = sum(_patch(model, site, gate, report, handles) for site in sites)
    report.notes.append(f"gated_attention adds {params} gate parameters (weights drawn as W_Q's, bias 0): the "
                        "state_dict gains their keys")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_gated_attention(model, report, gate=spec["gate"], partial=partial)


register_method(MethodSpec("gated_attention", {"gate": "elementwise"}, label="gated_attention (output gate)",
                           validators={"gate": choice(GATES)}, apply=_apply, per_layer=True, short="gated attention",
                           bench_arms={"gated": {}, "gated-head": {"gate": "headwise"}},
                           rival=True, adds_keys=True, sources=("methods/gated_attention.py",),
                           cost="one gate Linear (D × H·d, or D × H headwise) and a sigmoid per layer per forward"))
