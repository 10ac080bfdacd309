"""What one traced call of an attention module shows: its output projection W_O and, where it names none, its head
count. Both are found as q/k/v are checked (verify.py): a copy of the module, with generic weights, runs on probe
inputs; the model itself is never touched.

- W_O is the last Linear (or transformers Conv1D) called in the module's forward whose input moves when the W_V rows
  of the split do, and moves linearly (twice the nudge, twice the move: softmax(q kᵀ) V is linear in V, so nothing
  nonlinear lies between): the module applied to the attention's output, whatever its name (`wo`, `to_out[0]`,
  `o_proj`, `mix`, ...). A Linear followed by a BatchNorm is none (BN∘W is no fixed matrix). Where the forward
  could not be traced (it needs arguments the probe cannot build), a child named as W_O usually is (OUTPUT_HINTS)
  and of the heads' merged width is taken, and the report says it was found by its name.
- The head count: for each divisor h of W_Q's width (with W_K's and W_V's widths whole numbers of heads of that
  width), the attention of the split's q, k, v in h heads (softmax(q kᵀ/√d) v, with and without a causal mask) is
  recomputed and compared with what the module hands its W_O; or, for a module that forms its logits where the probe
  reads them (an SDPA call, a softmax), with those logits. The one divisor that reproduces the module is its head
  count; several or none: no head count, and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .sites import AttentionSite, OutputProjection, Projection, is_conv1d, stored_weight
from .verify import TOL, _Capture, _heads, _module_logits, _Probe

# child names that usually hold W_O (a hint for a forward the probe cannot run; the trace decides where it can)
OUTPUT_HINTS = ("o_proj", "out_proj", "proj", "c_proj", "dense", "out_lin", "Wo", "wo", "o", "to_out", "out",
                "output", "proj_out", "attn_out")


def _linear_like(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or is_conv1d(m)


def _in_width(m: nn.Module) -> int:
    return int(m.weight.shape[0]) if is_conv1d(m) else int(m.in_features)


class _SdpaOut(_Capture):
    """_Capture that also keeps each SDPA call's output (B, …, H, N, d)."""

    def __init__(self):
        super().__init__()
        self.outputs: list[torch.Tensor] = []
        self.causal: list[bool] = []  # each SDPA call: is_causal, or a mask that hides exactly the later keys

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs)
        if func is F.scaled_dot_product_attention:
            self.outputs.append(out.detach())
            kw = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal"), args)) | (kwargs or {})
            self.causal.append(bool(kw.get("is_causal")) or _triangular(kw.get("attn_mask")))
        return out


def _triangular(mask) -> bool:
    """Whether an SDPA mask hides exactly the keys after each query (a causal mask written out)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        return False
    hidden = ~mask if mask.dtype == torch.bool else torch.isneginf(mask) | (mask <= torch.finfo(mask.dtype).min / 2)
    later = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(1)
    return bool((hidden == later).all())


@dataclass
class _Call:
    name: str  # the submodule's dotted name inside the attention module
    inp: torch.Tensor
    out: torch.Tensor


class Trace(_Probe):
    """A copy of one module with generic weights in every Linear, run on the probe's inputs; each run records the
    Linear-like submodules called, in order, with their inputs and outputs."""

    def __init__(self, site: AttentionSite):
        super().__init__(site)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():  # (a zero-initialised W_O or gate would hide what reaches it)
            for m in self.copy.modules():
                if _linear_like(m) and not m.weight.is_meta:
                    for p in m.parameters(recurse=False):
                        p.copy_(torch.randn(p.shape, generator=g).to(p) / max(p.shape[-1], 1) ** 0.5)

    def calls(self, nudge: tuple[Projection, torch.Tensor] | None = None
              ) -> tuple[list[_Call], dict[int, torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """(the Linear-like calls in order, the q/k/v projections' outputs, the module's logits, SDPA outputs) of
        one run on the first probe input; `nudge` as in _Probe._once."""
        args, kwargs = self.args
        seen: list[_Call] = []
        names = {id(m): n for n, m in self.copy.named_modules() if n and _linear_like(m)}
        roles = {id(m) for m in self.linears.values()}

        def enter(m, a):  # (first of the pre-hooks: the input as the caller passed it, before a method's hooks)
            if a and isinstance(a[0], torch.Tensor):
                seen.append(_Call(names[id(m)], a[0].detach(), a[0].detach()))

        def record(m, a, out):
            if isinstance(out, torch.Tensor) and seen and seen[-1].name == names[id(m)]:
                seen[-1].out = out.detach()

        handles = []
        for m in self.copy.modules():
            if id(m) in names and id(m) not in roles:
                handles += [m.register_forward_pre_hook(enter, prepend=True), m.register_forward_hook(record)]
        cap = _SdpaOut()
        try:
            outputs, _ = self._once(args, kwargs, nudge, cap)
        finally:
            for h in handles:
                h.remove()
        self.causal = any(cap.causal)
        return seen, outputs, _module_logits(cap), cap.outputs


def _normed(module: nn.Module, name: str) -> bool:
    """Whether the container of submodule `name` holds a BatchNorm (LeViT's Linear + BatchNorm1d)."""
    parent = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
    return parent is not module and any(isinstance(c, nn.modules.batchnorm._BatchNorm) for c in parent.children())


def _trace(site: AttentionSite) -> tuple[Trace | None, str]:
    if site.lacks("q", "k", "v"):
        return None, site.lacks("q", "k", "v")
    if any(stored_weight(p).is_meta for p in site.proj.values()):
        return None, "on the meta device, no values to run"
    if not all(p.called for p in site.proj.values()):
        return None, "the module reads its projection weights itself"
    trace = Trace(site)
    why = trace.run()
    return (None, why) if why else (trace, "")


def _hint(model: nn.Module, site: AttentionSite, width: int, traced: bool) -> OutputProjection | None:
    """A child named as W_O (OUTPUT_HINTS; the last Linear of an nn.Sequential so named), else the parent's
    `output.dense` (transformers' BERT-style encoders), of the heads' merged input width."""
    for child in OUTPUT_HINTS:
        m = getattr(site.module, child, None)
        if isinstance(m, nn.Sequential):
            m = next((c for c in m if _linear_like(c)), None)
        if m is not None and _linear_like(m) and _in_width(m) == width:
            called = not isinstance(site.module, nn.MultiheadAttention)
            how = "found by its name" + ("" if traced else " (its forward could not be traced)")
            return OutputProjection(m, _name(site.module, m, site.name), is_conv1d(m), called, how)
    parent_name = site.name.rpartition(".")[0]
    parent = model.get_submodule(parent_name) if site.name else None
    dense = getattr(getattr(parent, "output", None), "dense", None)
    if isinstance(dense, nn.Linear) and dense.in_features == width:
        return OutputProjection(dense, f"{parent_name}.output.dense", False, True,
                                "found by its name: the parent's output.dense")
    return None


def _name(module: nn.Module, child: nn.Module, prefix: str) -> str:
    for n, m in module.named_modules():
        if m is child:
            return f"{prefix}.{n}" if prefix else n
    return prefix


def find_output(model: nn.Module, site: AttentionSite) -> tuple[OutputProjection | None, str]:
    """(the site's W_O, '') or (None, why none was found). A layout's own `out` is kept as named."""
    if site.out is not None:
        if not site.out.name:
            site.out.name = _name(site.module, site.out.module, site.name)
        return site.out, ""
    key = _key(site)
    if key in _OUT_CACHE:  # (a fact of the structure: once per class and shape, as verify.py probes)
        rel, transposed, called, how, why = _OUT_CACHE[key]
        if rel is None:
            return None, why
        full = f"{site.name}.{rel}" if site.name else rel
        return OutputProjection(site.module.get_submodule(rel), full, transposed, called, how), ""
    out, why = _traced_output(model, site)
    inside = {id(m): n for n, m in site.module.named_modules() if n}
    if out is None or id(out.module) in inside:
        rel = None if out is None else inside[id(out.module)]
        _OUT_CACHE[key] = (rel, False if out is None else out.transposed, False if out is None else out.called,
                           "" if out is None else out.how, why)
    return out, why


_OUT_CACHE: dict[tuple, tuple] = {}


def _key(site: AttentionSite) -> tuple:
    ints = tuple(sorted((k, v) for k, v in vars(site.module).items() if type(v) in (int, bool)))
    return (type(site.module), tuple((n, tuple(p.shape), p.dtype) for n, p in site.module.named_parameters()),
            site.num_heads, site.head_dim, tuple(sorted(site.proj)), ints)


def _traced_output(model: nn.Module, site: AttentionSite) -> tuple[OutputProjection | None, str]:
    width = site.num_heads * site.role_head_dim("v") if "v" in site.proj else site.num_heads * site.head_dim
    trace, why = _trace(site) if "v" in site.proj else (None, "no W_V")
    if trace is None:
        hint = _hint(model, site, width, False)
        return (hint, "") if hint is not None else (None, f"no output projection W_O found (not traced: {why}; no "
                                                          "child named as W_O has the heads' merged width)")
    v = site.proj["v"]
    base, _, _, _ = trace.calls()
    once, _, _, _ = trace.calls((v, v.rows, 1.0))
    twice, _, _, _ = trace.calls((v, v.rows, 2.0))
    downstream = []
    for b, m1, m2 in zip(base, once, twice):
        if not (b.name == m1.name == m2.name and b.inp.shape == m1.inp.shape == m2.inp.shape):
            continue
        d1, d2 = (m1.inp - b.inp).double(), (m2.inp - b.inp).double()
        scale, size = float(d1.abs().max()), float(b.inp.abs().max())
        eps = torch.finfo(b.inp.dtype).eps  # rounding of the inputs themselves (a half-precision model: 2⁻⁸, 2⁻¹¹)
        if scale > max(1e-6, 8 * eps) * (size + 1):  # moved by the values
            tol = TOL * scale + 64 * eps * (size + scale)
            downstream.append((b.name, bool(torch.allclose(d2, 2 * d1, rtol=0, atol=tol))))
    if downstream:
        name, linear = downstream[-1]
        m = site.module.get_submodule(name)
        full = f"{site.name}.{name}" if site.name else name
        if not linear:
            return None, (f"no output projection W_O found: the last Linear applied to the attention's output, "
                          f"`{full}`, reads a nonlinear function of it (an activation or norm between), not the "
                          "heads' merged output")
        if _in_width(m) != width:
            return None, (f"no output projection W_O found: the last Linear applied to the attention's output, "
                          f"`{full}`, reads {_in_width(m)} features, not the heads' merged {width}")
        if _normed(site.module, name):
            return None, (f"no output projection W_O found: the last Linear applied to the attention's output, "
                          f"`{full}`, is followed by a BatchNorm (BN∘W is no fixed matrix)")
        how = "found by a traced call: the last Linear applied to the attention's output, linear in the values"
        return OutputProjection(m, full, is_conv1d(m), True, how), ""
    hint = _hint(model, site, width, True)
    if hint is not None and hint.module in set(site.module.modules()):
        hint.called = False
        hint.how = f"never called as a module: {type(site.module).__name__}'s forward reads its weight itself"
        return hint, ""
    if hint is not None:
        return hint, ""
    return None, ("no output projection W_O found: no Linear is applied to the attention's output in "
                  f"{type(site.module).__name__}'s forward")


# ---------------------------------------------------------------- head count by recomputation


def _divisors(proj: dict[str, Projection]) -> list[int]:
    q = proj["q"].out_features
    out = []
    for h in range(1, q + 1):
        if q % h:
            continue
        d = q // h
        if all(p.out_features % d == 0 and h % (p.out_features // d) == 0 for r, p in proj.items() if r == "k"):
            out.append(h)
    return out


def _recomputed(outputs: dict[int, torch.Tensor], proj: dict[str, Projection], heads: int,
                causal: bool) -> torch.Tensor:
    """merge(softmax(q kᵀ/√d [+ causal]) v) of the split in `heads` heads: (B, …, N, H·d_v)."""
    d = proj["q"].out_features // heads
    q = _heads(outputs[id(proj["q"].linear)], proj["q"], d).float()
    k = _heads(outputs[id(proj["k"].linear)], proj["k"], d).float()
    kv = k.shape[-3]
    v = _heads(outputs[id(proj["v"].linear)], proj["v"], proj["v"].out_features // kv).float()
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv != heads)
    return o.transpose(-2, -3).flatten(-2)


def find_heads(site: AttentionSite) -> tuple[int | None, str]:
    """(the head count, how it was found) or (None, why none): the divisor of W_Q's width whose recomputed attention
    is the module's (module docstring). `site.num_heads` is ignored."""
    if not {"q", "k", "v"} <= set(site.proj):
        return None, "no head count on the module, and without W_Q, W_K, W_V none can be recomputed"
    trace, why = _trace(site)
    if trace is None:
        return None, f"no head count on the module, and its forward could not be traced to find one ({why})"
    calls, outputs, logits, _ = trace.calls()
    if any(id(p.linear) not in outputs for p in site.proj.values()):
        return None, "no head count on the module, and its projections were not called in the probe's forward"
    candidates = _divisors(site.proj)
    matched = []
    for h in candidates:
        if _matches(calls, outputs, logits, site.proj, h, trace):
            matched.append(h)
    tried = f"divisors of its W_Q width {site.proj['q'].out_features} tried: {candidates}"
    if len(matched) == 1:
        return matched[0], f"{matched[0]} heads found by recomputation ({tried})"
    if matched:
        return None, f"no head count on the module, and several reproduce its attention: {matched} ({tried})"
    return None, f"no head count on the module, and no head count reproduces its attention ({tried})"


def _matches(calls: list[_Call], outputs, logits, proj, heads: int, trace: Trace) -> bool:
    for causal in (False, True):
        try:
            o = _recomputed(outputs, proj, heads, causal)
        except RuntimeError:
            return False
        for c in calls:
            if c.inp.shape == o.shape and torch.allclose(c.inp.float(), o, rtol=TOL, atol=TOL * float(o.abs().max())):
                return True
    if logits:  # the module forms its logits where the probe reads them: compare with those
        res = trace.residuals(proj, proj["q"].out_features // heads)
        return bool(res) and min(res) < TOL
    return False


def traced_causal(site: AttentionSite) -> bool:
    """Whether the module's own forward masks later keys (an SDPA call with is_causal=True, or a causal mask written
    out), read from a traced call; False where it cannot be traced."""
    key = _key(site)
    if key not in _CAUSAL_CACHE:
        trace, _ = _trace(site)
        if trace is not None:
            trace.calls()
        _CAUSAL_CACHE[key] = trace is not None and trace.causal
    return _CAUSAL_CACHE[key]


_CAUSAL_CACHE: dict[tuple, bool] = {}
