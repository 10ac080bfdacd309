"""transformers encoders with separate `query` / `key` / `value` Linears (BERT, Nyströmformer); tokens at the
input of `encoder.layer[0]`.

Matched by the transformers classes listed in ENCODERS (module, model class, attention classes): adding an encoder
of the same structure (e.g. RoBERTa) is one line there, plus a case in tests/test_layouts.py.
"""

from __future__ import annotations

import importlib

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, join, of_library, separate, token_layout

ENCODERS = (
    ("transformers.models.bert.modeling_bert", "BertModel", ("BertSelfAttention", "BertCrossAttention")),
    ("transformers.models.nystromformer.modeling_nystromformer", "NystromformerModel", ("NystromformerSelfAttention",)),
)


def _classes(which: str) -> tuple[type, ...]:
    """The model or attention classes this transformers release has (4.x BERT has no BertCrossAttention: its
    BertSelfAttention is the cross-attention too)."""
    out: list[type] = []
    for module, model, attention in ENCODERS:
        mod = importlib.import_module(module)
        found = [getattr(mod, model, None)] if which == "model" else [getattr(mod, a, None) for a in attention]
        out += [c for c in found if c is not None]
    return tuple(out)


@attention_layout("hf_separate_qkv")
def hf_separate_qkv(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers self-attention with separate `query`/`key`/`value` Linears (BERT, Nyströmformer): token softmax
    (Nyströmformer approximates it with landmarks; the probe measures the exact softmax its q and k define)."""
    if not (hasattr(m, "attention_head_size") and of_library(m, "transformers")):  # cheap tests first
        return None
    if not isinstance(m, _classes("attention")):
        return None
    heads = getattr(m, "num_attention_heads", None) or m.config.num_attention_heads
    return AttentionSite(name, m, "hf_separate_qkv", heads, m.attention_head_size, separate((m.query, m.key, m.value)))


@token_layout("hf_encoder")
def hf_encoder(name: str, m: nn.Module) -> TokenSite | None:
    """transformers encoder models (BERT, Nyströmformer): X is the input of `encoder.layer[0]`,
    i.e. word + position (+ token type) embeddings after their LayerNorm and dropout."""
    if not (hasattr(m, "embeddings") and hasattr(m, "encoder") and of_library(m, "transformers")):
        return None
    if not isinstance(m, _classes("model")):
        return None
    emb, enc = m.embeddings, m.encoder
    return TokenSite(
        layout="hf_encoder",
        first_block=enc.layer[0],
        first_block_name=join(name, "encoder.layer.0"),
        embed=emb.word_embeddings,
        embed_name=join(name, "embeddings.word_embeddings"),
        num_prefix_tokens=0,
        blocks=[(join(name, f"encoder.layer.{i}"), b) for i, b in enumerate(enc.layer)],
        mask_owner=m,
        mask_arg=("attention_mask", 1),
    )
