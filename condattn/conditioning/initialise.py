"""Conditioned initialisation (the same authors' follow-up, "Conditioned Initialization for Attention"): at
initialisation only, each head's W_Q and W_K are semi-orthogonal matrices drawn independently (κ = 1 per head) and
W_V is the rectangular identity; training then proceeds as usual, nothing is attached to the model.

W_V's placement follows the `identity` option, as SCA's λI does (the follow-up does not say which, for a fused
projection of all heads): `full` makes the whole D × (H·d) block of W_V the identity, so head h's W_V is the
rectangular identity that selects its own channels x[h·d:(h+1)·d]; `per_head` gives every head the same
top-left I_{D×d}, so every head's values are x[0:d]. Biases are left as built (zero in timm and transformers).
"""

from __future__ import annotations

import torch
from torch import nn

from .sites import AttentionSite, Projection, as_matrix, stored_weight


def _head_rows(p: Projection, site: AttentionSite, role: str) -> list[torch.Tensor]:
    """Each head's output rows of this role, as an index (its own head count: fewer K/V heads under grouped-query
    attention; p.rows is head-major, also where the roles are interleaved per head, e.g. GPT-NeoX)."""
    d = site.role_head_dim(role)  # value heads may be wider than q/k heads
    return list(p.rows[: p.out_features // d * d].split(d))


def _write(p: Projection, rows: torch.Tensor, block: torch.Tensor) -> None:
    """Write a torch-layout (rows, in) block into the projection's weight (Conv1D stores it transposed)."""
    w = as_matrix(stored_weight(p))  # the parameter holding the weight (e.g. nn.MultiheadAttention's in_proj_weight)
    rows = rows.to(w.device)
    if p.transposed:
        w[:, rows] = block.T.to(w)
    else:
        w[rows] = block.to(w)


@torch.no_grad()
def conditioned_init(sites: list[AttentionSite], targets: tuple[str, ...], identity: str = "full",
                     generator: torch.Generator | None = None) -> dict[str, list[str]]:
    """Overwrite W_Q, W_K (semi-orthogonal per head, independent draws) and W_V (rectangular identity) of every
    site, for the roles in `targets`. Draws from `generator` (default: torch's global RNG, which the trainer seeds).
    Returns, per site name, the roles that were set."""
    done: dict[str, list[str]] = {}
    for site in sites:
        for role in targets:
            if role not in site.proj:  # a role the layer does not have (GCViT's global attention: no W_Q)
                continue
            p = site.proj[role]
            w = as_matrix(stored_weight(p))  # (a 1×1 convolution's (out, in) view)
            d_in = w.shape[0] if p.transposed else w.shape[1]
            if role in ("q", "k"):
                for rows in _head_rows(p, site, role):
                    # torch layout d × D with orthonormal rows = the paper's D × d W with orthonormal columns
                    block = torch.empty(site.head_dim, d_in, dtype=torch.float32)  # float32 under any default dtype
                    if generator is None:
                        nn.init.orthogonal_(block)
                    else:
                        q, r = torch.linalg.qr(torch.randn(max(site.head_dim, d_in), min(site.head_dim, d_in),
                                                           generator=generator, dtype=torch.float32))
                        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
                        block = q.T if site.head_dim <= d_in else q
                    _write(p, rows, block)
            else:
                blocks = [p.rows] if identity == "full" else _head_rows(p, site, role)
                for rows in blocks:
                    _write(p, rows, torch.eye(len(rows), d_in, dtype=torch.float32))
        done[site.name] = [r for r in targets if r in site.proj]  # (a site without W_Q: W_K, W_V only)
    return done
