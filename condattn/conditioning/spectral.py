"""SCA (Saratchandran & Lucey, NeurIPS 2025): W_Q, W_K, W_V of every attention layer become W + C.

C is the paper's method by default, a fixed λI (`correction="identity"`), or its Theorem 3.5's exact correction
(`correction="svd"`): C = σ_max(W)·UVᵀ from the SVD W = UΣVᵀ of each block, so κ(W + C) ≤ 2, recomputed from the
current weights every `refresh_every` weight updates and held fixed (detached) in between.

`mode="fixed"` (the paper: C never trained) folds C into the projection at call time: a patched `nn.Linear` becomes
a `ShiftedLinear` (same parameters, same `state_dict`) whose forward is `F.linear(x, W + C, b)`, with W + C built
out of place from the parameter (one weight-sized add per call, differentiable in W; cached while gradients are
off, e.g. in eval). Adding C·x to the output instead costs an extra pass over B·N·3D activations in forward and
backward: 6% of a ViT-S CPU step, against ~0% for the fold (`make bench`). Linear subclasses with their own forward
keep that forward and get the output-add as a forward hook. The parameter never holds C, so weight decay never
sees it, and fused attention / SDPA / torch.compile see an ordinary linear op.

`mode="init"` (a reading the papers leave open) adds C to the parameter once, when the method is applied; from
then on the module is a plain `nn.Linear` whose weight is trained and decayed like any other.

`lam_unit` says what λ is measured in (identity correction only): `abs` (λ as given), `init_std` (λ times the std
of the block's weights when the method is applied) or `sigma_max` (λ times the block's σ_max then).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .sites import AttentionSite, Projection, as_matrix, is_pointwise_conv, stored_weight

IDENTITY_PLACEMENTS = ("full", "per_head")
CORRECTIONS = ("identity", "svd")
MODES = ("fixed", "init")
LAM_UNITS = ("abs", "init_std", "sigma_max")
SVD_NOT_TRACED = ("spectral correction=svd recomputes C from the weights between steps, which torch.compile and "
                  "torch.export cannot trace; use correction=identity there, or run the model eagerly")
SVD_KAPPA_BOUND = 2.05  # Theorem 3.5 gives κ(W + C) ≤ 2 exactly; the margin covers fp32 rounding


def torch_weight(linear: nn.Module, transposed: bool = False) -> torch.Tensor:
    """The (out_features, in_features) weight of a projection (Conv1D's (in, out) transposed back), detached."""
    w = as_matrix(linear.weight.detach())
    return w.T if transposed else w


def projection_weight(p: Projection) -> torch.Tensor:
    """torch_weight of the parameter that holds a projection's weight (p.param: `weight`, or e.g. the
    `in_proj_weight` of nn.MultiheadAttention), detached."""
    w = as_matrix(stored_weight(p).detach())
    return w.T if p.transposed else w


def svd_correction(w: torch.Tensor) -> torch.Tensor:
    """Theorem 3.5's C for a batch of blocks w (..., m, n): σ_max(w)·P with P = UVᵀ the polar factor of w, in fp32.
    The transpose of a block has the transposed polar factor, so the torch layout (out, in) and the paper's
    W = weightᵀ give the same C up to that transpose. w + C has singular values σ_i + σ_max: κ(w + C) ≤ 2."""
    wf = w.detach().float()
    u, s, vh = torch.linalg.svd(wf, full_matrices=False)
    return s[..., :1, None] * (u @ vh)


def block_kappa(w: torch.Tensor) -> torch.Tensor:
    """κ over the nonzero singular values of each block (..., m, n): σ_max / σ_min of the min(m, n) values."""
    s = torch.linalg.svdvals(w.detach().float())
    return s[..., 0] / s[..., -1].clamp_min(torch.finfo(s.dtype).tiny)


class SpectralShift:
    """The correction C of one projection Linear, in torch layout (out_features, in_features): weight + C.

    Blocks are ranges of output rows (one per role with `identity=full`, one per head with `per_head`), each over all
    input channels. `identity`: C holds scale·I on each block's leading diagonal (a rectangular identity: output row
    b0 + j receives input channel j); `svd`: C holds σ_max·UVᵀ of each block, recomputed when the weight has been
    updated `refresh_every` times since the last computation (a weight update is seen as a new `_version` of the
    parameter, so gradient accumulation and evaluation do not count). One shift per Linear, shared by its roles.
    """

    def __init__(self, linear: nn.Module, lam: float, correction: str = "identity", lam_unit: str = "abs",
                 refresh_every: int = 1, transposed: bool = False):
        if correction not in CORRECTIONS:
            raise ValueError(f"correction={correction!r} is not one of {CORRECTIONS}")
        if lam_unit not in LAM_UNITS:
            raise ValueError(f"lam_unit={lam_unit!r} is not one of {LAM_UNITS}")
        self.lam = float(lam)
        self.correction, self.lam_unit, self.refresh_every = correction, lam_unit, max(1, int(refresh_every))
        self.transposed = transposed
        self.in_features, self.out_features = int(linear.in_features), int(linear.out_features)
        self.blocks: list[torch.Tensor] = []  # the output rows of each block (row j of a block takes input j)
        self.scales: list[float] = []  # identity: the absolute λ of each block
        self._delta: torch.Tensor | None = None  # svd: C as last computed (out, in), fp32
        self._seen: tuple | None = None  # (data_ptr, _version, device) of the weight C was last checked against
        self.updates = 0  # weight updates seen since C was computed
        self.refreshes = 0  # how many times C has been computed
        self.kappa_max = float("nan")  # svd: the largest κ(W + C) over the blocks at the last refresh
        self._index: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._cache: tuple[tuple, torch.Tensor] | None = None
        self._runs: list[tuple[int, int, int, float]] | None = None

    # ---- building the blocks ------------------------------------------------------------------------------------
    def add_block(self, rows: slice | torch.Tensor, num_heads: int, head_dim: int, identity: str,
                  weight: torch.Tensor | None = None) -> None:
        """Place the correction in one role's output rows (all heads of q, k or v; a slice, or the row index of an
        interleaved layout, head-major). `weight` (torch layout) gives the λ units init_std / sigma_max."""
        if isinstance(rows, slice):
            rows = torch.arange(rows.start or 0, rows.stop, device="cpu")  # also under a meta device context
        rows = rows.cpu().long()
        if identity == "full":  # λ I_{D×(H·d)}: head h receives λ·x[h·d:(h+1)·d]
            blocks = [rows]
        elif identity == "per_head":  # λ I_{D×d} in every head: each head receives λ·x[0:d]
            blocks = list(rows[: num_heads * head_dim].split(head_dim))
        else:
            raise ValueError(f"identity={identity!r} is not one of {IDENTITY_PLACEMENTS}")
        for blk_rows in blocks:
            scale = self.lam
            if self.correction == "identity" and self.lam_unit != "abs":
                if weight is None:
                    raise ValueError(f"lam_unit={self.lam_unit} needs the weight the correction is added to")
                blk = weight[blk_rows].detach().float()
                unit = blk.std() if self.lam_unit == "init_std" else torch.linalg.matrix_norm(blk, ord=2)
                scale = self.lam * float(unit)
            self.blocks.append(blk_rows)
            self.scales.append(scale)
        self._index, self._cache, self._delta, self._seen = {}, None, None, None
        self._runs = self._compute_runs()

    # ---- the correction -----------------------------------------------------------------------------------------
    def _identity_index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if device in self._index:
            return self._index[device]
        rows, cols, vals = [], [], []
        for blk, s in zip(self.blocks, self.scales):
            k = min(len(blk), self.in_features)  # rectangular identity: only the first min(D_in, rows) diagonal
            rows.append(blk[:k])
            cols.append(torch.arange(k, device="cpu"))
            vals.append(torch.full((k,), s, device="cpu"))
        index = tuple(torch.cat(t).to(device) for t in (rows, cols, vals))
        if not torch.compiler.is_compiling():  # never cache what export / compile traced (fake tensors)
            self._index[device] = index
        return index

    def _refresh(self, w: torch.Tensor) -> None:
        """svd: recompute C from the current weight w (torch layout) when due; assert κ(W + C) ≤ 2.05."""
        key = (w.data_ptr(), w._version, w.device)
        if self._delta is not None and key == self._seen:
            return
        if self._delta is not None and self._seen is not None and key[0] == self._seen[0] and \
                key[2] == self._seen[2]:
            self.updates += 1  # the same storage, a new version: an optimizer step
            if self.updates % self.refresh_every:
                self._seen = key
                return
        wd = w.detach()
        delta = torch.zeros(self.out_features, self.in_features, device=w.device, dtype=torch.float32)
        shapes: dict[int, list[torch.Tensor]] = {}
        for rows in self.blocks:
            shapes.setdefault(len(rows), []).append(rows.to(w.device))
        worst = 0.0
        for blocks in shapes.values():  # one batched SVD per block size
            blk = torch.stack([wd[rows] for rows in blocks])
            c = svd_correction(blk)
            kappa = block_kappa(blk.float() + c)
            worst = max(worst, float(kappa.max()))
            for rows, cb in zip(blocks, c):
                delta[rows] = cb
        if not worst <= SVD_KAPPA_BOUND:
            raise RuntimeError(f"spectral correction=svd: κ(W + C) = {worst:.4g} > {SVD_KAPPA_BOUND} for a "
                               f"{self.out_features}×{self.in_features} projection (non-finite weights?)")
        self._delta, self._seen, self.updates, self.kappa_max = delta, key, 0, worst
        self.refreshes += 1
        self._cache = None

    def delta_weight(self, w: torch.Tensor | None = None) -> torch.Tensor:
        """The explicit correction C in torch layout (out_features, in_features): weight + C = (W + C_paper)ᵀ.
        svd: computed from `w` (the torch-layout weight) when given and due, else C as last computed."""
        if self.correction == "svd":
            if w is not None:
                self._refresh(w)
            if self._delta is None:
                raise RuntimeError("spectral correction=svd: C has not been computed yet (pass the weight)")
            return self._delta
        rows, cols, vals = self._identity_index(torch.device("cpu"))
        delta = torch.zeros(self.out_features, self.in_features, device="cpu")
        delta[rows, cols] = vals
        return delta

    def weight(self, w: torch.Tensor, stored: torch.Tensor | None = None) -> torch.Tensor:
        """W + C in torch layout, out of place (gradients flow to `w` unchanged; C is a constant). Under torch.fx
        symbolic tracing `w` is the parameter's Proxy and `stored` the parameter: C (from the weight at trace time)
        enters the graph as a constant, with the same ops as eager, so the traced graph gives the same numbers."""
        if isinstance(w, torch.fx.Proxy):
            return self._traced(w, stored)
        if self.correction == "svd":
            if torch.compiler.is_compiling():
                raise NotImplementedError(SVD_NOT_TRACED)
            self._refresh(w)
        if (torch.is_grad_enabled() and w.requires_grad) or torch.compiler.is_compiling():
            return self._shifted(w)  # compiled graphs fuse the add themselves
        key = (w.data_ptr(), w._version, w.dtype, w.device, self.refreshes)
        if self._cache is None or self._cache[0] != key:  # eval / no_grad: rebuilt only when w or C changes
            self._cache = (key, self._shifted(w.detach()))
        return self._cache[1]

    def _traced(self, w: torch.fx.Proxy, stored: torch.Tensor) -> torch.fx.Proxy:
        if self.correction == "svd":  # C as of now (refresh_every does not act inside an fx graph)
            self._refresh(stored.detach())
            return w + self._delta.to(device=stored.device, dtype=stored.dtype)
        rows, cols, vals = self._identity_index(stored.device)
        return w.index_put((rows, cols), vals.to(stored.dtype), accumulate=True)

    def _shifted(self, w: torch.Tensor) -> torch.Tensor:
        if self.correction == "svd":
            return w + self._delta.to(device=w.device, dtype=w.dtype)
        rows, cols, vals = self._identity_index(w.device)
        return w.index_put((rows, cols), vals.to(w.dtype), accumulate=True)

    def runs(self) -> list[tuple[int, int, int, float]]:
        """identity: C as contiguous (out_start, in_start, length, scale) runs: 3 runs for a fused qkv with `full`.
        Plain Python ints, computed once when the blocks are placed (never from tensor values inside a forward, so
        torch.export traces the hook path: GPT-2's Conv1D)."""
        if self._runs is None:
            self._runs = self._compute_runs()
        return self._runs

    def _compute_runs(self) -> list[tuple[int, int, int, float]]:
        out = []
        for blk, s in zip(self.blocks, self.scales):
            rows = blk[: min(len(blk), self.in_features)].tolist()
            start = 0
            for j in range(1, len(rows) + 1):  # split into runs of consecutive rows (interleaved: one per head)
                if j == len(rows) or rows[j] != rows[j - 1] + 1:
                    out.append((rows[start], start, j - start, s))
                    start = j
        return out

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        # Hook path (Linear subclasses and GPT-2's Conv1D): output += x Cᵀ, in place on the module's fresh output
        # (autograd does not save it); identity: one slice add per run, no weight copy and no full-size temporary.
        x = args[0].to(output.dtype)
        if self.correction == "svd":
            delta = self.delta_weight(torch_weight(module, self.transposed))
            return output + F.linear(x, delta.to(device=x.device, dtype=x.dtype))
        for o, i, n, s in self.runs():
            output[..., o : o + n].add_(x[..., i : i + n], alpha=s)
        return output


class NotScriptable:
    """`__prepare_scriptable__` of a conditioned model (and of ShiftedLinear): torch.jit.script calls it first on
    every module, so scripting stops with one line naming the way out, not a TorchScript error on a hook."""

    def __init__(self, method: str):
        self.method = method

    def __call__(self):
        raise RuntimeError(f"torch.jit.script: this model is conditioned by condattn ({self.method}) through Python "
                           "hooks and shifted projections, which TorchScript cannot compile; use torch.export.export "
                           "or torch.compile, or call condattn.remove_conditioning(model) before scripting")


class ShiftedLinear(nn.Linear):
    """An `nn.Linear` whose forward uses W + C (its `_condattn_shift`); parameters and state_dict unchanged.
    Patched modules switch class in place, so deepcopy and pickling keep the shift. TorchScript: refused."""

    def __prepare_scriptable__(self):
        NotScriptable("spectral")()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # self.weight: the parameter (its Proxy under torch.fx)
        return F.linear(x, self._condattn_shift.weight(self.weight, self._parameters["weight"]), self.bias)


class _ShiftedConv:
    """A pointwise (kernel 1, groups 1) convolution whose forward uses W + C on its weight's (out, in) view, reshaped
    back: the same fold as ShiftedLinear (parameters and state_dict unchanged). TorchScript: refused."""

    _condattn_shifted_conv = True  # sites.is_pointwise_conv: still a pointwise projection once patched

    def __prepare_scriptable__(self):
        NotScriptable("spectral")()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stored = self._parameters["weight"]
        w = self._condattn_shift.weight(self.weight.flatten(1), stored.flatten(1))
        return self._conv_forward(x, w.view(stored.shape), self.bias)


class ShiftedConv1d(_ShiftedConv, nn.Conv1d):
    pass


class ShiftedConv2d(_ShiftedConv, nn.Conv2d):
    pass


SHIFTED = {nn.Linear: ShiftedLinear, nn.Conv1d: ShiftedConv1d, nn.Conv2d: ShiftedConv2d}
UNSHIFTED = {v: k for k, v in SHIFTED.items()}


def _shifts(sites: list[AttentionSite], targets: tuple[str, ...], identity: str, **shift_opts
            ) -> tuple[dict[tuple[int, str], tuple[Projection, SpectralShift]], dict[int, tuple[nn.Module, dict]],
                       dict[str, list[str]]]:
    """One SpectralShift per projection weight (keyed by module and parameter name), the modules that read weights
    themselves (Projection.called False) with theirs, and per site name the roles shifted. A role's correction spans
    its own heads (fewer than the site's for the K/V of grouped-query attention: out_features // head_dim). A target
    role a site has no projection for is left out of its list (api._with_roles skips a site that has none of them)."""
    shifts: dict[tuple[int, str], tuple[Projection, SpectralShift]] = {}
    folds: dict[int, tuple[nn.Module, dict]] = {}  # owner -> the weights it reads itself
    patched: dict[str, list[str]] = {}
    for site in sites:
        for role in targets:
            if role not in site.proj:  # a role the layer does not have (AttentionSite.missing: GCViT's global W_Q)
                continue
            p = site.proj[role]
            key = (id(p.linear), p.param)
            if key not in shifts:
                shifts[key] = (p, SpectralShift(_sizes(p), transposed=p.transposed, **shift_opts))
            width = site.role_head_dim(role)  # value heads may be wider than q/k heads
            shifts[key][1].add_block(p.rows, p.out_features // width, width, identity, projection_weight(p))
            if not p.called:
                folds.setdefault(id(site.module), (site.module, {}))[1][key] = shifts[key]
        patched[site.name] = [r for r in targets if r in site.proj]
    return shifts, folds, patched


def patch_spectral(
    sites: list[AttentionSite], lam: float, targets: tuple[str, ...], identity: str, correction: str = "identity",
    mode: str = "fixed", lam_unit: str = "abs", refresh_every: int = 1,
) -> tuple[list[torch.utils.hooks.RemovableHandle], dict[str, list[str]]]:
    """One SpectralShift per projection Linear. mode=fixed: attached (ShiftedLinear, or a forward hook for a
    Linear subclass); mode=init: C added to the parameter once, nothing attached. Returns the hook handles and, per
    site name, the roles that were shifted."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {MODES}")
    shifts, folds, patched = _shifts(sites, targets, identity, lam=lam, correction=correction, lam_unit=lam_unit,
                                     refresh_every=refresh_every)
    for p, _ in shifts.values():  # before any change: the output hook adds along the last axis, not channels
        if isinstance(p.linear, nn.modules.conv._ConvNd) and not is_pointwise_conv(p.linear):
            raise ValueError(f"spectral: a {type(p.linear).__name__} projection is not a plain pointwise nn.Conv1d / "
                             "nn.Conv2d (kernel 1, groups 1); register a layout whose projection is one")
    handles = []
    if mode == "init":  # every C first (svd may refuse a block), then the weights: none or all are changed
        deltas = [(p, shift.delta_weight(projection_weight(p))) for p, shift in shifts.values()]
        with torch.no_grad():
            for p, delta in deltas:
                param = stored_weight(p)
                param.add_((delta.T if p.transposed else delta).reshape(param.shape).to(param))
        return handles, patched
    for p, shift in shifts.values():
        linear = p.linear
        if p.param != "weight":
            linear.__dict__.setdefault("_condattn_shifts", {})[p.param] = shift
            continue
        linear._condattn_shift = shift
        if not p.called:
            continue
        if type(linear) in SHIFTED:  # nn.Linear, or a pointwise nn.Conv1d / nn.Conv2d (sites.is_pointwise_conv)
            linear.__class__ = SHIFTED[type(linear)]
        else:  # a subclass with its own forward (quantised, LoRA, Conv1D, ...): keep it, add C·x to its output
            handles.append(linear.register_forward_hook(shift))
    for owner, entries in (folds.values() if mode == "fixed" else ()):
        handles += FoldWhileCalled([(p.linear, p.param, shift) for p, shift in entries.values()]).attach(owner)
    return handles, patched


def _sizes(p: Projection) -> nn.Module:
    """What SpectralShift reads of a projection: in_features / out_features of the whole weight."""
    if p.param == "weight" and hasattr(p.linear, "in_features"):
        return p.linear
    out_f, in_f = as_matrix(stored_weight(p)).shape[:: -1 if p.transposed else 1]
    return SimpleNamespace(in_features=int(in_f), out_features=int(out_f))


class FoldWhileCalled:
    """For a module that reads projection weights itself (F.linear(x, self.qkv.weight, ...), nn.MultiheadAttention):
    during each of its forwards the attribute it reads is W + λI (built out of place from the parameter, so
    gradients reach W), put in the holder's instance __dict__, where attribute lookup finds it before
    nn.Module's parameters; removed when the forward ends, also on an exception. parameters() and state_dict()
    read the registered parameters and never see it. A class with bound-method hooks (not closures), so deepcopy
    and pickling of a patched model carry hooks that act on the copy's own modules."""

    def __init__(self, entries: list[tuple[nn.Module, str, SpectralShift]]):
        self.entries = entries

    def fold(self, module: nn.Module, args: tuple) -> None:
        for holder, param, shift in self.entries:
            holder.__dict__.pop(param, None)
            stored = holder._parameters[param]
            # getattr: the parameter itself, or its Proxy under torch.fx symbolic tracing (W + C is then traced)
            holder.__dict__[param] = shift.weight(getattr(holder, param), stored)

    def unfold(self, module: nn.Module, args: tuple, output) -> None:
        for holder, param, _ in self.entries:
            holder.__dict__.pop(param, None)

    def attach(self, owner: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        return [owner.register_forward_pre_hook(self.fold), owner.register_forward_hook(self.unfold, always_call=True)]


def unpatch_spectral(model: nn.Module) -> None:
    for m in model.modules():
        if type(m) in UNSHIFTED:
            m.__class__ = UNSHIFTED[type(m)]
        for attr in ("_condattn_shift", "_condattn_shifts"):
            if attr in m.__dict__:
                del m.__dict__[attr]
