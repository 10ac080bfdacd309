"""SCA (Saratchandran & Lucey, NeurIPS 2025): W_Q, W_K, W_V of every attention layer become W + λI.

Implemented by folding λI into the projection at call time: a patched `nn.Linear` becomes a
`ShiftedLinear` (same parameters, same `state_dict`) whose forward is `F.linear(x, W + λI, b)`, with W + λI
built out of place from the parameter (one weight-sized add per call, differentiable in W; cached while
gradients are off, e.g. in eval). Adding λ·x to the output instead costs an extra pass over B·N·3D
activations in forward and backward: 6% of a ViT-S CPU step, against ~0% for the fold (`make bench`).
Linear subclasses with their own forward keep that forward and get the output-add as a forward hook.
The parameter itself never holds λI, so weight decay never sees it, and fused attention / SDPA /
torch.compile see an ordinary linear op.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .sites import AttentionSite, Projection, stored_weight

IDENTITY_PLACEMENTS = ("full", "per_head")


class SpectralShift:
    """Forward hook: output[..., j] += lam * x[..., src[j]] for every column j with src[j] >= 0.

    `src` encodes the (rectangular) identity placed in the paper's W = weight^T: column j of the output
    receives input channel src[j]. One shift per Linear, shared by the q/k/v roles it holds.
    """

    def __init__(self, linear: nn.Linear, lam: float):
        self.lam = float(lam)
        self.in_features = linear.in_features
        self.src = torch.full((linear.out_features,), -1, dtype=torch.long)
        self._runs: list[tuple[int, int, int]] | None = None
        self._index: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def add_block(self, cols: slice, num_heads: int, head_dim: int, identity: str) -> None:
        """Place the identity in one role's output columns (all heads of q, k or v)."""
        start = cols.start or 0
        width = num_heads * head_dim
        if identity == "full":  # λ I_{D×(H·d)}: head h receives λ·x[h·d:(h+1)·d]
            blocks = [(start, width)]
        elif identity == "per_head":  # λ I_{D×d} in every head: each head receives λ·x[0:d]
            blocks = [(start + h * head_dim, head_dim) for h in range(num_heads)]
        else:
            raise ValueError(f"identity={identity!r} is not one of {IDENTITY_PLACEMENTS}")
        for b0, w in blocks:
            n = min(w, self.in_features)  # rectangular identity: only the first min(D_in, width) diagonal
            self.src[b0 : b0 + n] = torch.arange(n)
        self._runs, self._index, self._cache = None, {}, None

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        """W + λI in torch layout, out of place (gradients flow to `w` unchanged)."""
        if (torch.is_grad_enabled() and w.requires_grad) or torch.compiler.is_compiling():
            return self._shifted(w)  # compiled graphs fuse the add themselves
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if self._cache is None or self._cache[0] != key:  # eval / no_grad: rebuilt only when w changes
            self._cache = (key, self._shifted(w.detach()))
        return self._cache[1]

    def _shifted(self, w: torch.Tensor) -> torch.Tensor:
        if w.device not in self._index:
            rows = torch.nonzero(self.src >= 0).squeeze(1)
            self._index[w.device] = (rows.to(w.device), self.src[rows].to(w.device))
        rows, cols = self._index[w.device]
        return w.index_put((rows, cols), torch.full_like(rows, self.lam, dtype=w.dtype), accumulate=True)

    def runs(self) -> list[tuple[int, int, int]]:
        """`src` as contiguous (out_start, in_start, length) runs: 3 runs for a fused qkv with `full`."""
        if self._runs is None:
            runs: list[list[int]] = []
            for j, i in enumerate(self.src.tolist()):
                if i < 0:
                    continue
                if runs and runs[-1][0] + runs[-1][2] == j and runs[-1][1] + runs[-1][2] == i:
                    runs[-1][2] += 1
                else:
                    runs.append([j, i, 1])
            self._runs = [tuple(r) for r in runs]
        return self._runs

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        # Hook path (Linear subclasses only).
        # In place on the Linear's fresh output (autograd does not save it), one slice add per run: no
        # weight copy and no full-size temporary.
        x = args[0].to(output.dtype)
        for o, i, n in self.runs():
            output[..., o : o + n].add_(x[..., i : i + n], alpha=self.lam)
        return output

    def delta_weight(self) -> torch.Tensor:
        """The explicit correction in torch layout (out_features, in_features): weight + delta = (W + λI)^T."""
        delta = torch.zeros(self.src.numel(), self.in_features)
        rows = torch.nonzero(self.src >= 0).squeeze(1)
        delta[rows, self.src[rows]] = self.lam
        return delta


class ShiftedLinear(nn.Linear):
    """An `nn.Linear` whose forward uses W + λI (its `_condattn_shift`); parameters and state_dict unchanged.
    Patched modules switch class in place, so deepcopy and pickling keep the shift."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._condattn_shift.weight(self.weight), self.bias)


def patch_spectral(
    sites: list[AttentionSite], lam: float, targets: tuple[str, ...], identity: str
) -> tuple[list[torch.utils.hooks.RemovableHandle], dict[str, list[str]]]:
    """Register one SpectralShift per projection weight. Returns the hook handles and, per site name,
    the roles that were shifted. A role's identity spans its own heads (fewer than the site's for the K/V of
    grouped-query attention: out_features // head_dim)."""
    shifts: dict[tuple[int, str], tuple[Projection, SpectralShift]] = {}
    folds: dict[int, tuple[nn.Module, dict]] = {}  # owner -> the weights it reads itself (Projection.called False)
    patched: dict[str, list[str]] = {}
    for site in sites:
        for role in targets:
            p = site.proj[role]
            key = (id(p.linear), p.param)
            if key not in shifts:
                shifts[key] = (p, SpectralShift(_sizes(p), lam))
            shifts[key][1].add_block(p.cols, p.out_features // site.head_dim, site.head_dim, identity)
            if not p.called:
                folds.setdefault(id(site.module), (site.module, {}))[1][key] = shifts[key]
        patched[site.name] = list(targets)
    handles = []
    for p, shift in shifts.values():
        linear = p.linear
        if p.param != "weight":
            linear.__dict__.setdefault("_condattn_shifts", {})[p.param] = shift
            continue
        linear._condattn_shift = shift
        if not p.called:
            continue
        if type(linear) is nn.Linear:
            linear.__class__ = ShiftedLinear
        else:  # a subclass with its own forward (quantised, LoRA, ...): keep it, add λ·x to its output
            handles.append(linear.register_forward_hook(shift))
    for owner, entries in folds.values():
        handles += FoldWhileCalled([(p.linear, p.param, shift) for p, shift in entries.values()]).attach(owner)
    return handles, patched


def _sizes(p: Projection) -> nn.Module:
    """What SpectralShift reads of a projection: in_features / out_features of the whole weight."""
    if p.param == "weight" and hasattr(p.linear, "in_features"):
        return p.linear
    out_f, in_f = stored_weight(p).shape[:: -1 if p.transposed else 1]
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
            holder.__dict__[param] = shift.weight(holder._parameters[param])

    def unfold(self, module: nn.Module, args: tuple, output) -> None:
        for holder, param, _ in self.entries:
            holder.__dict__.pop(param, None)

    def attach(self, owner: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        return [owner.register_forward_pre_hook(self.fold), owner.register_forward_hook(self.unfold, always_call=True)]


def unpatch_spectral(model: nn.Module) -> None:
    for m in model.modules():
        if type(m) is ShiftedLinear:
            m.__class__ = nn.Linear
        for attr in ("_condattn_shift", "_condattn_shifts"):
            if attr in m.__dict__:
                del m.__dict__[attr]
