"""A site matched by structure alone is checked before anything is written: a copy of its module runs once on probe
inputs, and the assumed W_Q/W_K split must reproduce the module's own attention logits.

The module's logits are read where it forms them: the q and k of each F.scaled_dot_product_attention call (its logits
are their product), or the input of each softmax. The probe runs a copy (the model is never touched), with generic
weights in its projections (the split is a fact of the structure, so it is probed once per class and shape), on
token inputs of a few grid sizes (and a size argument where the forward takes one). Two checks, either suffices:
- linear: the split's q·kᵀ per head explains the module's logits, up to a per-position linear map over the heads (a
  scale, a head order, CaiT's talking heads) and additive terms that do not depend on the input (relative-position
  biases, masks: two probe inputs are differenced), to 1e-3 relative;
- dependencies (for q and k transformed per head before the product: pooled, normalised, cosine attention): nudging
  the assumed W_V rows leaves every logit as it was, nudging head h's assumed q (k) rows moves some logits, and two
  heads' q rows never move the same logit.

Outcomes, per site (AttentionSite.note carries it into the PatchReport):
- verified;
- re-read: a fused projection whose block-stacked [Q; K; V] reading fails but whose per-head interleave
  [q_h; k_h; v_h] passes is re-read as interleaved;
- refused, with the first contradiction: the site is left out, and `require_attention` refuses it as an unmatched
  attention layer (partial=True patches the others);
- unverified, with why: the probe could not call the module on inputs it can build (a forward that needs more than
  the tokens and a size), saw no logits, the module reads its projection weights itself, or it is on the meta device
  (no values to run); the site is patched as matched, and its report entry says it was not verified.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .sites import SITE_CHECKS, AttentionSite, Projection, interleaved

TOL = 1e-3
GRIDS = (4, 7, 8, 12, 14, 16)  # probe token grids (modules with fixed windows or biases take one of them)
SIZE_ARGS = ("size", "feat_size", "hw_shape", "hw", "shape", "resolution", "input_size", "feat_shape")
SOFTMAXES = {torch.softmax, torch.Tensor.softmax, F.softmax, torch.nn.functional.softmax}


class _Capture(TorchFunctionMode):
    """Records the logits the module forms: SDPA's (q, k, scale) and every softmax input (moved to the last axis)."""

    def __init__(self):
        super().__init__()
        self.sdpa: list[tuple[torch.Tensor, torch.Tensor, float | None]] = []
        self.softmax: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.sdpa.append((args[0].detach(), args[1].detach(), kwargs.get("scale")))
        elif func in SOFTMAXES:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            self.softmax.append(args[0].detach().movedim(dim, -1).float())
        return func(*args, **kwargs)


def _module_logits(cap: _Capture) -> list[torch.Tensor]:
    out = []
    for q, k, scale in cap.sdpa:
        if k.shape[-3] != q.shape[-3] and k.dim() == 4:  # grouped-query: k heads repeated
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        out.append((q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5))
    return out + cap.softmax


def _heads(t: torch.Tensor, p: Projection, width: int) -> torch.Tensor:
    """A projection's output (B, …, N, out) [1×1 conv: (B, out, H, W)] → its role's (B, …, heads, N, width)."""
    if t.dim() == 4 and isinstance(p.linear, nn.modules.conv._ConvNd):
        t = t.flatten(2).transpose(1, 2)  # (B, H·W, out)
    t = t.index_select(-1, p.rows.to(t.device))
    return t.unflatten(-1, (-1, width)).transpose(-2, -3)


def _split_logits(outputs: dict[int, torch.Tensor], proj: dict[str, Projection], head_dim: int) -> torch.Tensor:
    """q·kᵀ per head of the split: (B, …, H, Nq, Nk)."""
    q = _heads(outputs[id(proj["q"].linear)], proj["q"], head_dim).float()
    k = _heads(outputs[id(proj["k"].linear)], proj["k"], head_dim).float()
    if k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    return q @ k.transpose(-1, -2)


def _fit(dl: torch.Tensor, da: torch.Tensor) -> float:
    """The relative residual of the best per-position linear map over the head axis (-3), ΔL ≈ M·ΔA."""
    h = da.shape[-3]
    ok = torch.isfinite(dl).all(-3, keepdim=True).expand_as(dl)  # (masked scores: -inf - -inf)
    x = da.movedim(-3, -1)[ok.movedim(-3, -1)].view(-1, h).double()  # (positions, H)
    y = dl.movedim(-3, -1)[ok.movedim(-3, -1)].view(-1, h).double()
    if y.norm() == 0 or x.shape[0] < h:
        return float("inf")
    m = torch.linalg.lstsq(x, y).solution
    return float((x @ m - y).norm() / y.norm())


def _explains(dl: torch.Tensor, da: torch.Tensor) -> float | None:
    """How well the split's ΔA explains the module's ΔL (the relative residual), or None when the two are over
    different tokens (a pooled or re-windowed q / k: no comparison). The module's head axis is any of its leading
    axes of the head count (timm NesT: (B, H, T, N, N) against the split's (B, T, H, N, N))."""
    if dl.numel() != da.numel() or dl.shape[-2:] != da.shape[-2:]:
        return None
    h = da.shape[-3]
    axes = [i for i, n in enumerate(dl.shape[:-2]) if n == h] or [None]
    best = float("inf")
    for i in axes:
        moved = dl if i is None else dl.movedim(i, -3)
        best = min(best, _fit(moved.reshape(da.shape), da))
    return best


class _Probe:
    """Runs a copy of one module on two probe inputs; keeps every projection output and the module's logits."""

    def __init__(self, site: AttentionSite):
        self.site = site
        self.copy = copy.deepcopy(site.module)
        self.copy.eval()  # (some modules override train() and return None)
        names = {id(m): n for n, m in site.module.named_modules()}
        self.linears = {id(p.linear): self.copy.get_submodule(names[id(p.linear)]) if names.get(id(p.linear))
                        else self.copy for p in site.proj.values()}
        self.runs: list[tuple[dict[int, torch.Tensor], list[torch.Tensor]]] = []
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # the split is a fact of the structure: the copy's projections get generic weights
            for m in self.linears.values():  # (a zero W_Q would hide which rows reach the logits)
                for param in m.parameters(recurse=False):
                    param.copy_(torch.randn(param.shape, generator=g).to(param) / max(param.shape[-1], 1) ** 0.5)

    def _inputs(self, g: torch.Generator) -> list[tuple[tuple, dict]]:
        """Candidate calls: tokens (2, N, C) with N a g × g grid (and one prefix token), (2, g, g, C), or a map
        (1, C, g, g) for 1×1-conv projections; with the grid (g, g) for a forward that takes a size."""
        p = self.site.proj["q"]
        w = p.linear.weight
        c = w.shape[0] if p.transposed else w.shape[1]
        dev, dt = w.device, w.dtype
        rnd = lambda *s: torch.randn(*s, generator=g).to(dev, dt)  # noqa: E731
        conv = isinstance(p.linear, nn.modules.conv._ConvNd)
        try:
            params = list(inspect.signature(self.copy.forward).parameters.values())[1:]
        except (TypeError, ValueError):
            params = []
        required = [q.name for q in params if q.default is inspect.Parameter.empty
                    and q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
        sized = bool(required) and all(r in SIZE_ARGS for r in required)
        hw = [r.lower() for r in required] == ["h", "w"]
        if required and not (sized or hw):
            return []
        out = []
        for side in GRIDS:
            extra = (side, side) if hw else ((side, side),) * len(required) if sized else ()
            if conv:
                out.append(((rnd(1, c, side, side), *extra), {}))
                continue
            out += [((rnd(2, side * side, c), *extra), {}), ((rnd(2, side * side + 1, c), *extra), {})]
            if not required:
                out.append(((rnd(2, side, side, c),), {}))
        return out

    def run(self) -> str:
        """'' when both probe runs captured (self.args: the first input); else why not."""
        g = torch.Generator().manual_seed(0)
        candidates = self._inputs(g)
        if not candidates:
            return "its forward needs arguments the probe cannot build"
        last = ""
        for args, kwargs in candidates:
            self.runs = []
            self.args = (args, kwargs)
            try:
                for i in range(2):
                    if i:
                        args = tuple(torch.randn(a.shape, generator=g).to(a) if isinstance(a, torch.Tensor) else a
                                     for a in args)
                    self.runs.append(self._once(args, kwargs))
                return ""
            except Exception as e:  # noqa: BLE001 - a probe input the module does not take: try the next
                last = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        return f"the probe inputs did not run ({last})"

    def _once(self, args: tuple, kwargs: dict, nudge: tuple[Projection, torch.Tensor] | None = None,
              cap: _Capture | None = None) -> tuple[dict[int, torch.Tensor], list[torch.Tensor]]:
        """One forward: every projection's output and the module's logits; `nudge` (projection, rows) adds a fixed
        perturbation to those output rows first (times a third element where given); `cap` (a _Capture of the
        caller's) sees the call."""
        outputs: dict[int, torch.Tensor] = {}

        def keep(key: int) -> Callable:
            def hook(module, a, out):
                if nudge is not None and id(nudge[0].linear) == key:
                    conv = out.dim() == 4 and isinstance(nudge[0].linear, nn.modules.conv._ConvNd)
                    idx, dim = nudge[1].to(out.device), 1 if conv else -1
                    shape = out.index_select(dim, idx).shape
                    noise = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(out)
                    scale = nudge[2] if len(nudge) > 2 else 1.0  # (traced.py: twice the nudge, for linearity)
                    out = out.index_add(dim, idx, noise * out.abs().mean() * scale)
                outputs.setdefault(key, out.detach())
                return out
            return hook

        handles = [m.register_forward_hook(keep(key)) for key, m in self.linears.items() if m is not self.copy]
        cap = _Capture() if cap is None else cap
        try:
            with torch.no_grad(), cap:
                self.copy(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()
        return outputs, _module_logits(cap)

    def dependencies(self, proj: dict[str, Projection], head_dim: int) -> str:
        """'' when the split's roles act as roles on the module's logits, else the first contradiction: nudging the
        assumed W_V rows must leave every logit as it was; nudging the q (k) rows of head h must move some logits,
        and heads' moves must not overlap (unless the module mixes heads, which the linear fit covers)."""
        args, kwargs = self.args
        _, base = self._once(args, kwargs)

        def moved(p: Projection, rows: torch.Tensor) -> list[torch.Tensor]:
            _, logits = self._once(args, kwargs, (p, rows))
            out = []
            for a, b in zip(base, logits):
                ok = torch.isfinite(a) & torch.isfinite(b)
                scale = a[ok].abs().max() if ok.any() else a.new_tensor(1.0)
                out.append(((a - b).abs() > 1e-4 * scale) & ok)
            return out

        if any(m.any() for m in moved(proj["v"], proj["v"].rows)):
            return "its logits move when the assumed W_V rows do"
        for role in ("q", "k"):
            p = proj[role]
            heads = [p.rows[h * head_dim:(h + 1) * head_dim] for h in range(p.out_features // head_dim)]
            masks = [moved(p, rows) for rows in heads]
            for h, m in enumerate(masks):
                if not any(x.any() for x in m):
                    return f"the assumed W_{role.upper()} rows of head {h} do not reach its softmax"
            for i in range(len(masks)):
                for j in range(i + 1, len(masks)):
                    if any((a & b).any() for a, b in zip(masks[i], masks[j])) and role == "q":
                        return f"the assumed W_Q rows of heads {i} and {j} move the same logits"
        return ""

    def residuals(self, proj: dict[str, Projection], head_dim: int) -> list[float]:
        """How well the split explains each of the module's logits (comparable ones only)."""
        (o1, l1), (o2, l2) = self.runs
        if any(id(proj[r].linear) not in o1 for r in ("q", "k")):
            return []
        da = _split_logits(o1, proj, head_dim) - _split_logits(o2, proj, head_dim)
        found = (_explains(a - b, da) for a, b in zip(l1, l2) if a.shape == b.shape)
        return [r for r in found if r is not None]


_CACHE: dict[tuple, tuple[str, str]] = {}  # (class, parameter shapes, heads, head_dim) -> (reading, words)


def _key(site: AttentionSite) -> tuple:
    shapes = tuple((n, tuple(p.shape)) for n, p in site.module.named_parameters())
    return type(site.module), shapes, site.num_heads, site.head_dim


def verify(site: AttentionSite) -> tuple[AttentionSite | None, str]:
    """(the site, possibly re-read, or None when refused; what the check found, in words): '' for a site a named
    layout matched. Probed once per module class and shape: the answer is a fact of the structure, not of the
    weights."""
    if site.layout != "structural":
        return site, ""
    if any(p.linear.weight.device.type == "meta" for p in site.proj.values()):
        return site, "matched by structure (not verified: on the meta device, no values to run)"
    key = _key(site)
    if key not in _CACHE:
        found, words = _verify(site)
        reading = "refused" if found is None else ("interleaved" if "re-read" in words else "as matched")
        _CACHE[key] = (reading, words)
    reading, words = _CACHE[key]
    if reading == "refused":
        return None, words
    if reading == "interleaved":
        q = site.proj["q"]
        _, alt = interleaved(q.linear, site.num_heads)
        site.proj = {r: Projection(p.linear, p.cols, transposed=q.transposed, called=q.called) for r, p in alt.items()}
    return site, words


def _verify(site: AttentionSite) -> tuple[AttentionSite | None, str]:
    if site.form.over != "tokens" or "q" not in site.proj or "k" not in site.proj:
        return site, "matched by structure (not probed: no token q·kᵀ to compare)"
    if not all(p.called for p in site.proj.values()):
        return site, "matched by structure (not probed: the module reads its projection weights itself)"
    probe = _Probe(site)
    why = probe.run()
    if why:
        return site, f"matched by structure (not verified: {why})"
    (_, l1), _ = probe.runs
    if not l1:
        return site, "matched by structure (not verified: the probe saw no SDPA call or softmax)"
    res = probe.residuals(site.proj, site.head_dim)
    if res and min(res) < TOL:
        return site, "matched by structure, verified by a probe (the split gives the module's own logits)"
    why = probe.dependencies(site.proj, site.head_dim)
    if not why:
        return site, ("matched by structure, verified by a probe (each head's q and k rows reach its own logits, the "
                      "v rows none)")
    q, k = site.proj["q"], site.proj["k"]
    if q.linear is k.linear and isinstance(q.cols, slice) and site.proj["v"].linear is q.linear:
        d, alt = interleaved(q.linear, site.num_heads)
        if d == site.head_dim and not probe.dependencies(alt, d):
            return site, ("matched by structure, re-read by a probe: its fused projection is interleaved per head "
                          "[q_h; k_h; v_h], not stacked [Q; K; V]")
    return None, f"{type(site.module).__name__}, matched by structure, refused by a probe: {why}"


SITE_CHECKS.append(verify)  # (sites.require_attention runs it on every matched site)
