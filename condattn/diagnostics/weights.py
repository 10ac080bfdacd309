"""κ and σ of W_Q, W_K, W_V per attention layer: the full block (all heads) and each head.

The paper's W (D × H·d) is torch's weight.T; both have the same singular values.
"""

from __future__ import annotations

from torch import nn

from ..conditioning.sites import ROLES, find_attention
from .linalg import batch_condition_numbers, singular_values


def weight_conditioning(model: nn.Module, effective: bool = True) -> list[dict]:
    """One dict per attention site of `model` (find_attention order):

        {"layer": i, "name": str, "num_heads": H, "head_dim": d,
         "q": {"kappa", "sigma_min", "sigma_max", "kappa_heads": [κ of head 0, ...]}, "k": {...}, "v": {...}}

    effective=True measures W + λI when SCA is applied (what the forward uses); False the stored weight. A role the
    layer has no projection for (GCViT's global attention: no W_Q) is None, with the reason under
    "absent": {role: why}.
    """
    out = []
    for i, site in enumerate(find_attention(model)):
        entry = {"layer": i, "name": site.name, "num_heads": site.num_heads, "head_dim": site.head_dim}
        absent = site.absent()
        if absent:
            entry["absent"] = absent
        for role in ROLES:
            if role in absent:
                entry[role] = None
                continue
            w = site.weight(role, effective)
            s = singular_values(w)
            heads = w.reshape(-1, site.role_head_dim(role), w.shape[-1])  # (GQA k/v: fewer heads; wider v heads)
            entry[role] = {
                "kappa": float(s[0] / s[-1]) if s.numel() else float("nan"),
                "sigma_min": float(s[-1]) if s.numel() else 0.0,
                "sigma_max": float(s[0]) if s.numel() else 0.0,
                "kappa_heads": batch_condition_numbers(heads).tolist(),
            }
        out.append(entry)
    return out
