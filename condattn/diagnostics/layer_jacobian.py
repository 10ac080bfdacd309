"""κ(J) of one head of a model's first attention layer, with that layer's own attention formula.

The head function is the site's (`site.form.head`, conditioning/forms.py): the token softmax with the module's
scale, XCiT's cross-covariance attention with its learned temperature, ... ; nothing here depends on the family.
The model is run through a `forward(model, batch)` callable, as for cheap_diagnostics.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..conditioning.sites import ROLES, AttentionSite, find_attention
from ..conditioning.tokens import as_tokens, block_input
from ._util import rows_kept
from .jacobian import jacobian_condition_number, jacobian_condition_number_matfree

# κ(J) of one head: J is (N·d) × (3·D·d). Exact (jacrev + float64 SVD) while J has at most this many entries
# (~32 MB; a few seconds on 2 CPU cores), on the first tokens of the sample when all of them would exceed it.
EXACT_MAX_ENTRIES = 4_000_000
MIN_EXACT_TOKENS = 8  # when fewer tokens fit the exact budget, use the matrix-free (Lanczos) κ(J) instead


def first_sample(batch):
    """Sample 0 of a batch: a tensor, or a dict / tuple / list of tensors, each cut to its first row."""
    if isinstance(batch, dict):
        return {k: v[:1] for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(v[:1] for v in batch)
    return batch[:1]


def head_inputs(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor], AttentionSite]:
    """(X, [W_Q, W_K, W_V] of head 0 in the paper's (D, d) layout, attention site) for the first attention
    layer: X = its input tokens of sample 0 (rows padded in `mask` (B, N) dropped), captured by a forward pre-hook
    during `forward(model, sample 0 of batch)`."""
    sites = find_attention(model)
    if not sites:
        raise ValueError(f"no attention layer of {type(model).__name__} matches a registered layout")
    site, seen = sites[0], []
    if site.lacks(*ROLES):  # J is taken w.r.t. all three weights (GCViT's global attention has no W_Q)
        raise ValueError(f"κ(J) at {site.name}: it has {site.lacks(*ROLES)}; J w.r.t. (W_Q, W_K, W_V) is not "
                         "defined there (skip --jacobian here)")
    # a 1×1-conv projection reads a channels-first map, maybe a part of the module's input (EfficientViT-MSRA's head
    # h: its channel chunk plus the cascade): X is what that conv reads, its (B, C, H, W) map as (B, H·W, C) tokens
    conv = site.proj["q"].linear if hasattr(site.proj["q"].linear, "kernel_size") else None
    handle = (conv or site.module).register_forward_pre_hook(
        lambda m, a, kw: seen.append(block_input(a, kw).detach()), with_kwargs=True
    )
    try:
        with torch.no_grad():
            forward(model, first_sample(batch))
    finally:
        handle.remove()
    x = as_tokens(seen[0]) if conv is None else seen[0].flatten(2).transpose(1, 2)  # (B, C, H, W) or (B, C, N)
    keep = rows_kept(None if mask is None else mask[:1], 1, x.shape[1], x.device)
    X = x[0] if keep is None else x[0][keep[0]]
    return X, [site.head_weight(r, 0, effective=True).T for r in ROLES], site


def _tokens_and_solver(n_all: int, D: int, d: int, max_tokens: int | None, budget: int) -> tuple[int, str | None, bool]:
    """(tokens used, why they were cut or None, exact solver?) for a J of (n·d) × (3·D·d)."""
    per_token = d * 3 * D * d  # entries of J per token
    n = min(n_all, max_tokens or n_all)
    why = "--jacobian-tokens" if n < n_all else None
    exact = n * per_token <= budget or budget // per_token >= MIN_EXACT_TOKENS
    if exact and n * per_token > budget:
        n, why = budget // per_token, f"to keep J ≤ {budget:.0e} entries for the exact SVD"
    elif not exact and n > D:  # J Jᵀ (N·d square) is generically nonsingular only while N ≤ D
        n, why = D, f"N ≤ D = {D} keeps J Jᵀ nonsingular for the matrix-free solver"
    return n, why, exact


def jacobian_kappa(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None,
                   max_tokens: int | None = None, iters: int = 300,
                   exact_max_entries: int = EXACT_MAX_ENTRIES) -> dict:
    """κ(J) of head 0 of the first attention layer with respect to (W_Q, W_K, W_V), with the layer's own attention
    formula (its form's head function; recorded as "formula" with the parameters bound into it). max_tokens: use
    at most the first tokens of sample 0; iters: Lanczos steps when J is too large for the exact SVD;
    exact_max_entries: the exact solver's budget (entries of J; see EXACT_MAX_ENTRIES)."""
    X, W, site = head_inputs(model, forward, batch, mask)
    if site.role_head_dim("v") != site.head_dim:
        raise ValueError(f"κ(J) at {site.name}: its value heads are {site.role_head_dim('v')} wide and its q/k heads "
                         f"{site.head_dim}; the Jacobian solvers take one head width (skip --jacobian here)")
    head, params = site.form.head(site, 0)
    params = dict(params)
    n_all, D, d = X.shape[0], X.shape[1], W[0].shape[1]
    n, why, exact = _tokens_and_solver(n_all, D, d, max_tokens, int(exact_max_entries))
    t0 = time.perf_counter()
    res: dict[str, Any] = {"layer": site.name, "head": 0, "tokens": n, "tokens_total": n_all, "subsampled": why,
                           "J_shape": [n * d, 3 * D * d], "formula": site.form.name, "layout": site.layout,
                           "scale": params.pop("scale", None), **params}
    if exact:
        res.update(solver="exact", kappa=jacobian_condition_number(X[:n], *W, head=head))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reported through `info` below
            kappa, info = jacobian_condition_number_matfree(X[:n], *W, iters=iters, return_info=True, head=head)
        res.update(solver="matrix-free", kappa=kappa, info=info)
    res["seconds"] = round(time.perf_counter() - t0, 2)
    return res


def jacobian_diagnostics(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None,
                         max_tokens: int | None = None, iters: int = 300,
                         exact_max_entries: int = EXACT_MAX_ENTRIES) -> dict[str, float]:
    """`jacobian_kappa` as flat scalars for a training loop's diagnostics rows, without side effects on training:
    it runs in eval mode and restores every module's train/eval mode afterwards (as cheap_diagnostics), and under
    torch.random.fork_rng, so the global CPU/CUDA RNG streams are untouched (Lanczos uses its own generator).
    Keys: kappa_jacobian/l0 (κ(J) of layer 0, head 0), kappa_jacobian_tokens/l0 (tokens of sample 0 used, of
    kappa_jacobian_tokens_total/l0), kappa_jacobian_exact/l0 (1: jacrev + SVD, 0: Lanczos),
    kappa_jacobian_converged/l0 (0: Lanczos hit its step limit, κ is a lower estimate), kappa_jacobian_xca/l0
    (1: XCiT's cross-covariance formula, 0: another one)."""
    modes = [(m, m.training) for m in model.modules()]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices):
            j = jacobian_kappa(model, forward, batch, mask, max_tokens, iters=iters,
                               exact_max_entries=exact_max_entries)
    finally:
        for m, training in modes:
            m.training = training
    info = j.get("info") or {}
    return {
        "kappa_jacobian/l0": float(j["kappa"]),
        "kappa_jacobian_tokens/l0": float(j["tokens"]),
        "kappa_jacobian_tokens_total/l0": float(j["tokens_total"]),
        "kappa_jacobian_exact/l0": float(j["solver"] == "exact"),
        "kappa_jacobian_converged/l0": float(bool(info.get("converged", True))),
        "kappa_jacobian_xca/l0": float(j["formula"] == "xca"),
    }
