"""The project's crammed BERT (table 9 pretraining, GLUE fine-tuning; condattn/models/crammed_bert.py): one
bias-free fused `qkv` per `CrammedSelfAttention`; tokens at the input of the `CrammedBertEncoder`'s `layers.0`.

The classes are matched by their qualified name (`sites.is_class`), not by isinstance: the method library sits
below the harness and must not import its model zoo (tests/test_architecture.py), and an exact name match is as
explicit as `type(m) is CrammedSelfAttention` without the import. tests/test_layouts.py builds the real model, so a
rename of either class fails there.

Expected PatchReport counts: a crammed BERT of `num_layers` blocks has num_layers crammed_bert attention sites (one
fused `qkv` each) and one crammed_bert token site (its CrammedBertEncoder).
"""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, is_class, join, stacked, token_layout

MODULE = "condattn.models.crammed_bert"


@attention_layout("crammed_bert")
def crammed_bert_attention(name: str, m: nn.Module) -> AttentionSite | None:
    """`CrammedSelfAttention`: one bias-free `qkv` Linear, block-stacked [Q; K; V] (each D = heads × head_dim,
    head-major), softmax over the tokens. SCA adds λI to each D × D block exactly as for timm's ViT. (cramming's own
    module interleaves the three per head; ours is the block-stacked reparametrisation, see the model's docstring.)"""
    if not is_class(m, MODULE, "CrammedSelfAttention"):
        return None
    head_dim, proj = stacked(m.qkv, m.num_heads)
    return AttentionSite(name, m, "crammed_bert", m.num_heads, head_dim, proj)


@token_layout("crammed_bert")
def crammed_bert_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """`CrammedBertEncoder` (inside CrammedBertForMLM as `encoder`): X is the input of `layers.0`, i.e. word +
    scaled-sinusoidal position embeddings after the embedding LayerNorm (and its dropout); before_pos_embed hooks the
    word embedding's output. No prefix tokens (packed MLM blocks carry no per-sample [CLS]). The encoder's forward
    receives `attention_mask` (keyword, or second positional), so CET excludes padded rows."""
    if not is_class(m, MODULE, "CrammedBertEncoder") or len(m.layers) == 0:
        return None
    return TokenSite(
        layout="crammed_bert",
        first_block=m.layers[0],
        first_block_name=join(name, "layers.0"),
        embed=m.embedding.word_embedding,
        embed_name=join(name, "embedding.word_embedding"),
        num_prefix_tokens=0,
        blocks=[(join(name, f"layers.{i}"), b) for i, b in enumerate(m.layers)],
        mask_owner=m,
        mask_arg=("attention_mask", 1),
    )
