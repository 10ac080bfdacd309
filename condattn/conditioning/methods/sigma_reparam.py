"""σReparam (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse";
reference: apple/ml-sigma-reparam, `vision/layers.py` and `vision/vit.py`): every reparametrised weight is used as
Ŵ = γ / σ(W) · W, as the reference's `SpectralNormedWeight` / `SNLinear` compute it:

- σ(W) is estimated by power iteration from one stored vector, the right singular vector v (`sigma_v*`, a buffer):
  each forward takes one step in the reference's order, left first, u = normalize(W v), then v' = normalize(Wᵀ u),
  and uses σ = uᵀ W v' with u, v' held constant, so gradients reach W through that bilinear form (and γ).
- In training mode the step is stored (v ← v'), also under torch.no_grad, as the reference's `if self.training`
  does; in eval mode the step is taken afresh on every forward and not stored.
- γ (`sigma_gamma*`) is learnable, initialised to σ_max(W), and v starts at W's top right singular vector, so Ŵ = W
  at init. That SVD is taken at the first forward, from the weight as it is then (the reference takes it when the
  layer is built; nothing changes W in between unless the model is re-initialised or loaded, and then this is the
  weight that counts): until then v holds the constant 1/√n (`start_vector`), so a freshly built or re-initialised
  model's buffers are the same on every build (transformers' `test_init_weights_can_init_buffers`). A v other than
  that constant (loaded, or set by hand) is kept. A graph traced by torch.compile / export before the first forward
  computes that start in the graph (torch.where on v = 1/√n), so its numbers are the eager model's.

`partition` says which matrix gets one σ and one γ:
- `fused` (default; the reference's reading): one per weight as the module stores it. The reference's `vit.py`
  builds timm's ViT and converts every nn.Linear, its fused `qkv` included, into one `SNLinear`: one σ over the
  stacked [W_Q; W_K; W_V]. Separate q/k/v projections (BERT, Llama) are three matrices either way.
- `per_role`: one per role, W_Q, W_K and W_V each (a fused qkv Linear holds three): the paper's equations name W_Q,
  W_K, W_V as separate matrices; a reading of its notation, not of its code. A site without W_Q (GCViT's global
  attention) has W_K and W_V only.

`scope=attention` (default): the attention projections of every site. `scope=all_linear`: also every other nn.Linear,
transformers Conv1D and nn.Conv2d (groups 1: the patch embedding) of the model, one σ per weight, as the reference's
`convert_to_sn` converts every Linear and Conv2d (a convolution's weight read as (out, in·k·k)). The reference's ViT
also removes every normalisation layer; that is a model change of its own, not part of this method.

A plain nn.Linear / nn.Conv2d that calls its own weight switches class in place (`SigmaLinear`, `SigmaConv2d`: same
parameters) and builds Ŵ in its forward, so torch.fx traces it; other holders (GPT-2's Conv1D, modules that read
their projection weight themselves: timm Eva / BEiT with q/v biases, nn.MultiheadAttention) get Ŵ folded into the
attribute for the length of the reading module's forward, as SCA's fold does. The parameter is never changed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..report import PatchEntry, PatchReport
from ..sites import ROLES, require_attention
from ..spec import MethodSpec, choice, register_method
from .common import Undo, _is_conv1d

SCOPES = ("attention", "all_linear")
PARTITIONS = ("fused", "per_role")


def power_step(w: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One power-iteration step in the reference's order (`get_sigma`): left u = normalize(W v), then the new right
    v' = normalize(Wᵀ u). No gradient."""
    with torch.no_grad():
        wd = w.detach()
        u = F.normalize(wd @ v.to(wd.dtype), dim=0)
        return u, F.normalize(wd.T @ u, dim=0)


def start_vector(n: int, like: torch.Tensor) -> torch.Tensor:
    """v before the first forward: the constant unit vector 1/√n (a buffer's value independent of W's draw)."""
    return torch.full((n,), n ** -0.5, dtype=like.dtype, device=like.device)


def _tracing() -> bool:
    """Under torch.compile, torch.export or jit tracing (tensors' values cannot be read; fx's Proxy tracing reads
    the module's real tensors and is not this)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or \
        getattr(torch.compiler, "is_exporting", lambda: False)()


def _start_in_graph(v: torch.Tensor, w_b: torch.Tensor) -> torch.Tensor:
    """SigmaReparam._start without reading values (a traced graph): W_b's top right singular vector where v is
    still the constant start, else v."""
    with torch.no_grad():
        top = torch.linalg.svd(w_b.detach().float(), full_matrices=False)[2][0].to(v.dtype)
        return torch.where((v == start_vector(v.numel(), v)).all(), top, v)


class SigmaReparam:
    """Ŵ of one weight parameter (`param` of `holder`): blocks of output rows (torch layout; None: all of them), each
    with its own σ and γ, registered on the holder as sigma_gamma{suffix} and sigma_v{suffix}."""

    def __init__(self, holder: nn.Module, param: str, transposed: bool, owner: nn.Module):
        self.holder, self.param, self.transposed, self.owner = holder, param, transposed, owner
        self.blocks: list[tuple[str, torch.Tensor | None]] = []  # (suffix, torch-layout output rows or None)
        self.starting: set[str] = set()  # blocks whose v takes W's top singular vector at the next eager forward

    def _ndim(self) -> int:
        return self.holder._parameters[self.param].dim()  # (the stored parameter's: `w` may be an fx Proxy)

    def _torch(self, w: torch.Tensor) -> torch.Tensor:
        if self.transposed:
            return w.T
        return w.flatten(1) if self._ndim() > 2 else w  # (a convolution's (out, in·k·k) view)

    @torch.no_grad()
    def _svd(self, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(σ_max, the top right singular vector) of a block of the current weight."""
        w = self._torch(self.holder._parameters[self.param].detach())
        _, s, vh = torch.linalg.svd((w if rows is None else w[rows]).float(), full_matrices=False)
        return s[0], vh[0]

    @torch.no_grad()
    def add_block(self, suffix: str, rows: torch.Tensor | None = None) -> None:
        s, v = self._svd(rows)
        w = self.holder._parameters[self.param]
        self.holder.register_parameter(f"sigma_gamma{suffix}", nn.Parameter(s.to(w.dtype).clone()))
        self.holder.register_buffer(f"sigma_v{suffix}", start_vector(v.numel(), w))
        self.blocks.append((suffix, rows))
        self.starting.add(suffix)

    @torch.no_grad()
    def reset(self) -> None:
        """γ and v as at application, from the current weight (after a model's own re-initialisation of it). A γ or v
        that transformers' from_pretrained loaded (flagged `_is_hf_initialized`, as its own init functions read it) is
        kept: its initialisation reaches only the weights a checkpoint lacked. Nothing while W is still on the meta
        device (transformers 4 initialises missing weights before it loads W): there is no σ(W) to take yet."""
        if self.holder._parameters[self.param].is_meta:
            return
        for suffix, rows in self.blocks:
            gamma = getattr(self.holder, f"sigma_gamma{suffix}")
            if not getattr(gamma, "_is_hf_initialized", False):
                gamma.copy_(self._svd(rows)[0])
            v = getattr(self.holder, f"sigma_v{suffix}")
            if not getattr(v, "_is_hf_initialized", False):
                v.copy_(start_vector(v.numel(), v))
                self.starting.add(suffix)

    @torch.no_grad()
    def _start(self, suffix: str, v: torch.Tensor) -> None:
        """At the first eager forward: v ← W's top right singular vector, unless v was set since (loaded)."""
        self.starting.discard(suffix)
        if torch.equal(v, start_vector(v.numel(), v)):
            rows = dict(self.blocks)[suffix]
            v.copy_(self._svd(rows)[1].to(v.dtype))

    def sigma(self, suffix: str, w_b: torch.Tensor) -> torch.Tensor:
        """σ = uᵀ W_b v' after one power step from the stored v; the step is stored in training mode only."""
        v = stored = getattr(self.holder, f"sigma_v{suffix}")
        if suffix in self.starting:
            if _tracing():
                v = _start_in_graph(stored, w_b)
            else:
                self._start(suffix, stored)
        u, v_new = power_step(w_b, v)
        if self.holder.training:
            with torch.no_grad():
                stored.copy_(v_new)
        return u @ w_b @ v_new

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        """Ŵ in the parameter's own layout, out of place: each block scaled by γ / σ."""
        wt = self._torch(w)
        if len(self.blocks) == 1 and self.blocks[0][1] is None:  # the whole weight: one scalar
            suffix = self.blocks[0][0]
            return w * (getattr(self.holder, f"sigma_gamma{suffix}") / self.sigma(suffix, wt))
        s = torch.ones(wt.shape[0], dtype=wt.dtype, device=wt.device)
        for suffix, rows in self.blocks:
            idx = rows.to(wt.device)
            gamma = getattr(self.holder, f"sigma_gamma{suffix}")
            factor = gamma / self.sigma(suffix, wt.index_select(0, idx))
            s = s.index_put((idx,), factor.to(s.dtype).expand(idx.numel()))
        return w * (s[None, :] if self.transposed else s.view(-1, *(1,) * (self._ndim() - 1)))

    def drop(self) -> None:
        for suffix, _ in self.blocks:
            self.holder._parameters.pop(f"sigma_gamma{suffix}", None)
            self.holder._buffers.pop(f"sigma_v{suffix}", None)


class SigmaLinear(nn.Linear):
    """An nn.Linear whose forward uses Ŵ (its `_condattn_sigma`); parameters unchanged. Not a torch.nn leaf, so
    torch.fx traces Ŵ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._condattn_sigma.weight(self.weight), self.bias)


class SigmaConv2d(nn.Conv2d):
    """An nn.Conv2d whose forward uses Ŵ on its weight's (out, in·k·k) view (the reference's SNConv2d)."""

    _condattn_shifted_conv = True  # sites.is_pointwise_conv: still a pointwise projection once reparametrised

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self._condattn_sigma.weight(self.weight), self.bias)


SWAPPED = {nn.Linear: SigmaLinear, nn.Conv2d: SigmaConv2d}
PLAIN = {v: k for k, v in SWAPPED.items()}


class FoldReparam:
    """Hooks on an owner module: during its forward each holder's weight attribute is Ŵ (in the holder's instance
    __dict__, found before nn.Module's parameters), removed when the forward ends, also on an exception."""

    def __init__(self, reparams: list[SigmaReparam]):
        self.reparams = reparams

    def fold(self, module: nn.Module, args: tuple) -> None:
        for r in self.reparams:
            r.holder.__dict__[r.param] = r.weight(getattr(r.holder, r.param))

    def unfold(self, module: nn.Module, args: tuple, output) -> None:
        for r in self.reparams:
            r.holder.__dict__.pop(r.param, None)

    def attach(self, owner: nn.Module) -> list:
        return [owner.register_forward_pre_hook(self.fold), owner.register_forward_hook(self.unfold, always_call=True)]


class InitWithSigma:
    """A transformers model's `_init_weights`, then γ and v of the module it just initialised recomputed from its new
    weight: transformers' init (`init_weights`, `from_pretrained` of missing keys) reaches what σReparam adds."""

    def __init__(self, original):
        self.original = original

    def __call__(self, module: nn.Module) -> None:
        self.original(module)
        for r in module.__dict__.get("_condattn_sigmas", ()):
            r.reset()


def _wrap_init(model: nn.Module) -> list:
    """Wrap `_init_weights` of every transformers PreTrainedModel inside `model` (InitWithSigma)."""
    undo = []
    for m in model.modules():
        if callable(getattr(type(m), "_init_weights", None)) and hasattr(m, "config") and \
                "_init_weights" not in m.__dict__:
            m._init_weights = InitWithSigma(m._init_weights)
            undo.append(Undo(m.__dict__.pop, "_init_weights", None))
    return undo


def _unswap(r: SigmaReparam) -> None:
    if type(r.holder) in PLAIN:
        r.holder.__class__ = PLAIN[type(r.holder)]
    r.holder.__dict__.pop("_condattn_sigma", None)
    r.holder.__dict__.pop("_condattn_sigmas", None)


def _drop_all(reparams: list[SigmaReparam]) -> None:
    for r in reparams:
        r.drop()


def _attach(reparams: list[SigmaReparam]) -> list:
    """Swap plain Linears / Conv2ds that call their own weight; fold the rest into their reading module."""
    handles: list = []
    by_owner: dict[int, tuple[nn.Module, list[SigmaReparam]]] = {}
    for r in reparams:
        r.holder.__dict__.setdefault("_condattn_sigmas", []).append(r)  # (InitWithSigma finds them there)
        handles.append(Undo(_unswap, r))
        if r.owner is r.holder and r.param == "weight" and type(r.holder) in SWAPPED:
            r.holder._condattn_sigma = r
            r.holder.__class__ = SWAPPED[type(r.holder)]
        else:
            by_owner.setdefault(id(r.owner), (r.owner, []))[1].append(r)
    for owner, rs in by_owner.values():
        handles += FoldReparam(rs).attach(owner)
    return handles


def _attention_reparams(sites, partition: str, report: PatchReport) -> dict[tuple[int, str], SigmaReparam]:
    reparams: dict[tuple[int, str], SigmaReparam] = {}
    for site in sites:
        for role, p in site.proj.items():
            key = (id(p.linear), p.param)
            fused = partition == "fused"
            if key not in reparams:
                reparams[key] = SigmaReparam(p.linear, p.param, p.transposed, p.linear if p.called else site.module)
                if fused:  # one σ over the whole stored weight, whichever roles it holds
                    reparams[key].add_block("" if p.param == "weight" else f"_{p.param}")
            if not fused:
                reparams[key].add_block(f"_{role}" if p.param == "weight" else f"_{p.param}_{role}", p.rows)
        lacks = f"; {site.lacks(*ROLES)}" if site.missing else ""  # (GCViT's global attention: W_K, W_V only)
        n = len({(id(p.linear), p.param) for p in site.proj.values()}) if partition == "fused" else len(site.proj)
        report.entries.append(PatchEntry(site.name, f"sigma_reparam:{site.layout}",
                                         f"{'/'.join(site.proj)} heads={site.num_heads}x{site.head_dim}; "
                                         f"{n} σ ({partition}){lacks}"))
    return reparams


def _other_weights(model: nn.Module, reparams: dict, report: PatchReport) -> None:
    """scope=all_linear: every other Linear, Conv1D and Conv2d (groups 1) gets one σ over its whole weight."""
    mha_out = {id(m.out_proj): m for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    grouped = []
    for name, m in model.named_modules():
        if (id(m), "weight") in reparams:
            continue
        conv = isinstance(m, nn.Conv2d)
        if conv and m.groups != 1:
            grouped.append(name)
            continue
        if not (isinstance(m, nn.Linear) or _is_conv1d(m) or conv):
            continue
        r = SigmaReparam(m, "weight", _is_conv1d(m), mha_out.get(id(m), m))  # MHA reads out_proj.weight itself
        r.add_block("")
        reparams[(id(m), "weight")] = r
        report.entries.append(PatchEntry(name, "sigma_reparam:linear", f"{type(m).__name__} {tuple(m.weight.shape)}"))
    if grouped:
        report.notes.append(f"sigma_reparam scope=all_linear left {len(grouped)} grouped convolutions as built (e.g. "
                            f"{grouped[0]}): the reference's SNConv2d reads one (out, in·k·k) matrix per weight")


def apply_sigma_reparam(model: nn.Module, report: PatchReport, scope: str = "attention", partition: str = "fused",
                        partial: bool = False) -> list:
    """σReparam on the attention projections (scope=attention) or every Linear and Conv2d (all_linear); returns the
    handles that undo it."""
    if scope not in SCOPES:
        raise ValueError(f"sigma_reparam: scope={scope!r} is invalid; choose one of {list(SCOPES)}")
    if partition not in PARTITIONS:
        raise ValueError(f"sigma_reparam: partition={partition!r} is invalid; choose one of {list(PARTITIONS)}")
    sites, warnings = require_attention(model, "sigma_reparam", partial, heads=False)  # (one σ per weight matrix)
    report.warnings += warnings
    reparams = _attention_reparams(sites, partition, report)
    if scope == "all_linear":
        _other_weights(model, reparams, report)
    handles = _attach(list(reparams.values())) + _wrap_init(model)
    handles.append(Undo(_drop_all, list(reparams.values())))
    blocks = sum(len(r.blocks) for r in reparams.values())
    report.notes.append(f"sigma_reparam adds {blocks} learnable γ (init σ_max(W)) and {blocks} power-iteration "
                        "buffers v: the state_dict gains their keys (sigma_gamma*, sigma_v*)")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_sigma_reparam(model, report, scope=spec["scope"], partition=spec["partition"], partial=partial)


register_method(MethodSpec("sigma_reparam", {"scope": "attention", "partition": "fused"},
                           label="sigma_reparam (σReparam)",
                           validators={"scope": choice(SCOPES), "partition": choice(PARTITIONS)}, apply=_apply,
                           per_layer=True, short="σReparam", rival=True, adds_keys=True,
                           cost="one power step (two mat-vecs) and a rescale of each converted weight per forward",
                           sources=("methods/sigma_reparam.py",),
                           # one σ per stored weight (the reference's fused qkv); one per W_Q, W_K, W_V
                           bench_arms={"σReparam": {}, "σReparam-role": {"partition": "per_role"}}))
