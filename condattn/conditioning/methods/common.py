"""What the field's methods share: the output projection W_O of an attention site (the layout's, or found by a traced
call: traced.py), each role's head slices, and handles that undo what a method attached."""

from __future__ import annotations

import torch
from torch import nn

from ..paper import Undo  # noqa: F401  (re-exported: the methods' handles for what is not a hook)
from ..sites import AttentionSite, OutputProjection, Projection
from ..sites import is_conv1d as _is_conv1d  # noqa: F401  (re-exported)
from ..traced import find_output, traced_causal


def output_projection(model: nn.Module, site: AttentionSite) -> OutputProjection | None:
    """The site's W_O (traced.find_output: the layout's, else the last Linear its forward applies to the attention's
    output), kept on the site; None when there is none (`output_and_why` says why)."""
    return output_and_why(model, site)[0]


def output_and_why(model: nn.Module, site: AttentionSite) -> tuple[OutputProjection | None, str]:
    """(the site's W_O, '') or (None, why none was found)."""
    if (site.out is None and not site.out_why) or (site.out is not None and not site.out.name):
        site.out, site.out_why = find_output(model, site)
    return site.out, site.out_why


def head_rows(p: Projection, head_dim: int) -> list[torch.Tensor]:
    """Each head's output rows of one role, as indices (a role's rows may be interleaved with the others' per head:
    Projection.rows); its own head count: fewer k/v heads under grouped-query attention."""
    rows = p.rows
    return [rows[h * head_dim:(h + 1) * head_dim] for h in range(p.out_features // head_dim)]


def is_causal(site: AttentionSite) -> bool:
    """A decoder's causal self-attention: transformers' `is_causal` (GPT-2 and Llama-style decoders), or a forward that
    masks later keys itself (traced.traced_causal: Meta-style `is_causal=True` in its SDPA call)."""
    return bool(getattr(site.module, "is_causal", False)) or traced_causal(site)


def not_token_softmax(site: AttentionSite) -> str:
    """Why a site's logits are not q·kᵀ over the tokens ('' when they are)."""
    if site.form.over == "tokens":
        return ""
    return f"{site.form.name} attention: the softmax runs over the d_h channels, not the tokens"
