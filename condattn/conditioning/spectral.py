"""SCA (Saratchandran & Lucey, NeurIPS 2025): W_Q, W_K, W_V of every attention layer become W + λI.

Implemented as a forward hook on the projection Linear, using x @ (W + λI)^T = x @ W^T + λ·x @ I^T:
the hook adds λ times (a slice of) the input to the selected output columns. The weights are untouched,
so `state_dict` keys and values are those of the unpatched model, weight decay never sees λI, and fused
attention / SDPA / torch.compile see an ordinary Linear followed by an add.
"""

from __future__ import annotations

import torch
from torch import nn

from .targets import AttentionSite

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
        self._runs = None

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


def patch_spectral(
    sites: list[AttentionSite], lam: float, targets: tuple[str, ...], identity: str
) -> tuple[list[torch.utils.hooks.RemovableHandle], dict[str, list[str]]]:
    """Register one SpectralShift per projection Linear. Returns the hook handles and, per site name,
    the roles that were shifted."""
    shifts: dict[int, tuple[nn.Linear, SpectralShift]] = {}
    patched: dict[str, list[str]] = {}
    for site in sites:
        for role in targets:
            p = site.proj[role]
            if id(p.linear) not in shifts:
                shifts[id(p.linear)] = (p.linear, SpectralShift(p.linear, lam))
            shifts[id(p.linear)][1].add_block(p.cols, site.num_heads, site.head_dim, identity)
        patched[site.name] = list(targets)
    handles = []
    for linear, shift in shifts.values():
        linear._condattn_shift = shift
        handles.append(linear.register_forward_hook(shift))
    return handles, patched


def unpatch_spectral(model: nn.Module) -> None:
    for m in model.modules():
        if hasattr(m, "_condattn_shift"):
            del m._condattn_shift
