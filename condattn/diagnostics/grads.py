"""Frobenius norms of the W_Q, W_K, W_V gradients per attention layer (the SCA paper's vanishing-gradient
risk: log them at step 0)."""

from __future__ import annotations

from torch import nn

from ..conditioning.sites import ROLES, find_attention


def qkv_grad_norms(model: nn.Module) -> list[dict]:
    """One dict per attention site: {"layer": i, "name": str, "q": ‖∇W_Q‖_F, "k": ..., "v": ...}, each a
    float, or None when that weight has no .grad (before backward, or frozen) or the layer has no projection for
    the role (GCViT's global attention: no W_Q; the reason under "absent": {role: why})."""
    out = []
    for i, site in enumerate(find_attention(model)):
        entry: dict = {"layer": i, "name": site.name}
        absent = site.absent()
        if absent:
            entry["absent"] = absent
        for role in ROLES:
            g = None if role in absent else site.grad(role)
            entry[role] = None if g is None else float(g.detach().double().norm())
        out.append(entry)
    return out
