"""transformers decoders with Llama-style attention: separate `q_proj` / `k_proj` / `v_proj` (k and v with
num_key_value_heads heads under grouped-query attention) and rotary position embeddings applied to q and k inside
the attention; tokens at the input of `layers.0`.

Matched by the transformers classes in DECODERS (module, model class, attention class): a decoder of the same
structure is one line there plus a case in tests/test_layouts.py.

SCA under grouped-query attention: W_K and W_V map D to num_key_value_heads × head_dim, and each gets its own
rectangular λI (full: the first min(D, width) diagonal; per_head: λI_{D×d} in each of its heads).

Expected PatchReport counts: a model of num_hidden_layers layers has num_hidden_layers hf_llama attention sites and
one hf_llama token site.
"""

from __future__ import annotations

import importlib

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, join, of_library, separate, token_layout

DECODERS = (
    ("transformers.models.llama.modeling_llama", "LlamaModel", "LlamaAttention"),
    ("transformers.models.mistral.modeling_mistral", "MistralModel", "MistralAttention"),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2Model", "Qwen2Attention"),
)


def _classes(which: int) -> tuple[type, ...]:
    return tuple(getattr(importlib.import_module(row[0]), row[which]) for row in DECODERS)


@attention_layout("hf_llama")
def hf_llama(name: str, m: nn.Module) -> AttentionSite | None:
    """Llama-style attention: q_proj (num_attention_heads × head_dim outputs), k_proj / v_proj (num_key_value_heads
    × head_dim); causal token softmax scaled by the module's `scaling`; RoPE on q, k after the projections."""
    if not (hasattr(m, "q_proj") and hasattr(m, "num_key_value_groups") and of_library(m, "transformers")):
        return None
    if type(m) not in _classes(2):
        return None
    heads = m.config.num_attention_heads
    return AttentionSite(name, m, "hf_llama", heads, m.head_dim, separate((m.q_proj, m.k_proj, m.v_proj)))


@token_layout("hf_llama")
def hf_llama_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """LlamaModel and its kin (inside *ForCausalLM as `model`): X is the input of `layers.0`, the token embeddings
    as `embed_tokens` returns them (positions enter as RoPE inside each attention, so before_pos_embed and
    after_pos_embed see the same X). No prefix tokens. The model's forward receives `attention_mask` (keyword, or
    second positional), so CET excludes padded rows."""
    if not (hasattr(m, "embed_tokens") and hasattr(m, "rotary_emb") and of_library(m, "transformers")):
        return None
    if not isinstance(m, _classes(1)) or len(m.layers) == 0:
        return None
    return TokenSite(
        layout="hf_llama",
        first_block=m.layers[0],
        first_block_name=join(name, "layers.0"),
        embed=m.embed_tokens,
        embed_name=join(name, "embed_tokens"),
        num_prefix_tokens=0,
        blocks=[(join(name, f"layers.{i}"), b) for i, b in enumerate(m.layers)],
        mask_owner=m,
        mask_arg=("attention_mask", 1),
    )
