"""What the field's methods share: the output projection W_O of an attention site (sites name only W_Q/W_K/W_V),
each role's head slices, and handles that undo what a method attached."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..paper import Undo  # noqa: F401  (re-exported: the methods' handles for what is not a hook)
from ..sites import AttentionSite, Projection

# W_O as a child of the attention module (timm `proj`, DETR/ViT/Llama `o_proj`, DETR/MHA `out_proj`, GPT-2 `c_proj`,
# crammed BERT `dense`, DistilBERT `out_lin`, ModernBERT `Wo`, T5 `o`), else as `output.dense` of the parent
# (transformers BERT-style encoders, Nyströmformer)
OUTPUT_CHILDREN = ("proj", "o_proj", "out_proj", "c_proj", "dense", "out_lin", "Wo", "o")


@dataclass
class OutputProjection:
    module: nn.Module  # the Linear (or Conv1D) computing W_O
    name: str
    transposed: bool  # Conv1D: weight stored (in, out)
    called: bool  # False: the attention module reads its weight itself (nn.MultiheadAttention's out_proj)

    def weight(self) -> torch.Tensor:
        """The stored parameter (torch layout (out, in) unless transposed)."""
        return self.module.weight


def _is_conv1d(m: nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers")


def output_projection(model: nn.Module, site: AttentionSite) -> OutputProjection | None:
    """The site's W_O, found structurally: a Linear/Conv1D child named as in OUTPUT_CHILDREN whose input width is
    the heads' merged width, else the parent's `output.dense`. None when neither exists."""
    width = site.num_heads * site.head_dim
    for child in OUTPUT_CHILDREN:
        m = getattr(site.module, child, None)
        if isinstance(m, nn.Linear) and m.in_features == width:
            called = not isinstance(site.module, nn.MultiheadAttention)
            return OutputProjection(m, f"{site.name}.{child}", False, called)
        if m is not None and _is_conv1d(m) and m.weight.shape[0] == width:
            return OutputProjection(m, f"{site.name}.{child}", True, True)
    parent_name = site.name.rpartition(".")[0]
    parent = model.get_submodule(parent_name) if site.name else None
    dense = getattr(getattr(parent, "output", None), "dense", None)
    if isinstance(dense, nn.Linear) and dense.in_features == width:
        return OutputProjection(dense, f"{parent_name}.output.dense", False, True)
    return None


def head_rows(p: Projection, head_dim: int) -> list[torch.Tensor]:
    """Each head's output rows of one role, as indices (a role's rows may be interleaved with the others' per head:
    Projection.rows); its own head count: fewer k/v heads under grouped-query attention."""
    rows = p.rows
    return [rows[h * head_dim:(h + 1) * head_dim] for h in range(p.out_features // head_dim)]


def is_causal(site: AttentionSite) -> bool:
    """A decoder's causal self-attention (transformers' `is_causal`, GPT-2 and Llama-style decoders)."""
    return bool(getattr(site.module, "is_causal", False))


def not_token_softmax(site: AttentionSite) -> str:
    """Why a site's logits are not q·kᵀ over the tokens ('' when they are)."""
    if site.form.over == "tokens":
        return ""
    return f"{site.form.name} attention: the softmax runs over the d_h channels, not the tokens"
