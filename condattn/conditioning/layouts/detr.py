"""transformers DETR (table 7): separate `q_proj` / `k_proj` / `v_proj` in encoder self-, decoder self- and
decoder cross-attention; tokens at the input of `encoder.layers.0`.

Expected PatchReport counts: a DETR with E encoder and D decoder layers has E + 2·D hf_detr attention sites (encoder
self-attention, decoder self-attention, decoder cross-attention: our default, all self- and cross-attention)
and one hf_detr token site (the encoder's input). `conditioning.detr_attention` selects the kinds SCA patches; the
others are listed as skipped in the PatchReport, and patched + skipped must equal the model config's attention_layers.
"""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, join, of_library, separate, token_layout

DETR_ATTENTION = ("encoder", "decoder_self", "decoder_cross")


@attention_layout("hf_detr")
def hf_detr(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers `DetrSelfAttention` / `DetrCrossAttention`: separate `q_proj`, `k_proj`, `v_proj` Linears (D × D,
    heads head-major), token softmax with scaling head_dim^-0.5. DETR adds its position embeddings to the inputs of
    q_proj and k_proj (not v_proj), so under SCA the λ·x that W + λI adds includes those positions, as W_Q acts on
    them. Kind (`group`) by place: self-attention under `encoder` or `decoder`, cross-attention (queries from the
    decoder, keys/values from the encoder memory) in the decoder. The encoder's padding mask applies to encoder
    queries and keys and to cross-attention keys; decoder queries (object queries) are never padded."""
    if not (hasattr(m, "q_proj") and of_library(m, "transformers")):  # no transformers import for others
        return None
    from transformers.models.detr import modeling_detr as md

    DetrCrossAttention = getattr(md, "DetrCrossAttention", None)
    DetrSelfAttention = getattr(md, "DetrSelfAttention", None)
    if DetrSelfAttention is None and type(m) is getattr(md, "DetrAttention", None):  # transformers 4.x: one class
        import transformers

        raise ValueError(f"condattn's DETR layout reads transformers 5's DetrSelfAttention / DetrCrossAttention; this "
                         f"is transformers {transformers.__version__}, whose DetrAttention it does not read: "
                         "pip install 'transformers>=5'")
    if type(m) is DetrCrossAttention:
        group, masked_q, masked_k = "decoder_cross", False, True
    elif type(m) is DetrSelfAttention:
        decoder = "decoder" in name.split(".")
        group, masked_q, masked_k = ("decoder_self", False, False) if decoder else ("encoder", True, True)
    else:
        return None
    heads = m.q_proj.out_features // m.head_dim
    return AttentionSite(name, m, "hf_detr", heads, m.head_dim, separate((m.q_proj, m.k_proj, m.v_proj)),
                         group=group, masked_queries=masked_q, masked_keys=masked_k)


@token_layout("hf_detr")
def hf_detr_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """transformers `DetrModel` (inside DetrForObjectDetection as `model`): X is the input of `encoder.layers.0`, the
    backbone's last feature map after the 1×1 `input_projection`, flattened to (H·W) × d_model (after the encoder's
    input dropout). DETR adds its sine positions to q and k inside every attention layer, never to the tokens, so
    before_pos_embed is the same X (`embed` None: both hook the first layer's input). No prefix tokens. The encoder's
    forward receives the flattened pixel mask as `attention_mask` (B, H·W), so CET excludes padded positions; only the
    encoder layers are listed as blocks (the decoder's inputs are object queries, not image tokens)."""
    if not (hasattr(m, "query_position_embeddings") and of_library(m, "transformers")):
        return None
    from transformers.models.detr.modeling_detr import DetrModel

    if not isinstance(m, DetrModel) or len(m.encoder.layers) == 0:
        return None
    first = join(name, "encoder.layers.0")
    return TokenSite(
        layout="hf_detr",
        first_block=m.encoder.layers[0],
        first_block_name=first,
        embed=None,
        embed_name=f"{first} input",
        num_prefix_tokens=0,
        blocks=[(join(name, f"encoder.layers.{i}"), b) for i, b in enumerate(m.encoder.layers)],
        mask_owner=m.encoder,
        mask_arg=("attention_mask", 1),
        no_pos_embed="DETR adds its sine positions to q and k inside every attention layer, never to the tokens",
    )
