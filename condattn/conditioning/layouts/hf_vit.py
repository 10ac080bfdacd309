"""transformers ViT (`ViTModel`, inside ViTForImageClassification as `vit`): `ViTAttention` with separate `q_proj` /
`k_proj` / `v_proj`; tokens at the input of `layers.0`.

Expected PatchReport counts: a ViTModel of num_hidden_layers layers has num_hidden_layers hf_vit attention sites
and one hf_vit token site.
"""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, join, of_library, separate, token_layout


@attention_layout("hf_vit")
def hf_vit(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers `ViTAttention` (4.x: `ViTSelfAttention`, query/key/value): separate q/k/v Linears
    (num_attention_heads × head_dim outputs each), token softmax scaled by the module's `scaling` (1/sqrt(head_dim))."""
    if not of_library(m, "transformers"):  # cheap test first: no transformers import for other models
        return None
    if hasattr(m, "query") and hasattr(m, "attention_head_size"):  # transformers 4.x: ViTSelfAttention
        from transformers.models.vit import modeling_vit

        if type(m) is not getattr(modeling_vit, "ViTSelfAttention", None):
            return None
        return AttentionSite(name, m, "hf_vit", m.num_attention_heads, m.attention_head_size,
                             separate((m.query, m.key, m.value)))
    if not (hasattr(m, "q_proj") and hasattr(m, "num_attention_heads")):  # cheap test first
        return None
    from transformers.models.vit.modeling_vit import ViTAttention

    if type(m) is not ViTAttention:
        return None
    return AttentionSite(name, m, "hf_vit", m.num_attention_heads, m.head_dim, separate((m.q_proj, m.k_proj, m.v_proj)))


@token_layout("hf_vit")
def hf_vit_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """transformers `ViTModel`: X is the input of `layers.0`, i.e. [CLS] + patch embeddings + position embeddings
    after the embedding dropout (one prefix token); before_pos_embed hooks `embeddings.patch_embeddings` (patch
    tokens only). The model's forward receives an optional `attention_mask` (keyword, or fourth positional)."""
    if not (hasattr(m, "embeddings") and of_library(m, "transformers")):  # cheap tests first
        return None
    from transformers.models.vit.modeling_vit import ViTModel

    if not isinstance(m, ViTModel):
        return None
    # transformers 5: `layers`, forward(..., attention_mask) 4th; 4.x: `encoder.layer`, no attention mask
    layers, at = (m.layers, "layers") if hasattr(m, "layers") else (getattr(m.encoder, "layer", []), "encoder.layer")
    if len(layers) == 0:
        return None
    return TokenSite(
        layout="hf_vit",
        first_block=layers[0],
        first_block_name=join(name, f"{at}.0"),
        embed=m.embeddings.patch_embeddings,
        embed_name=join(name, "embeddings.patch_embeddings"),
        num_prefix_tokens=1,
        blocks=[(join(name, f"{at}.{i}"), b) for i, b in enumerate(layers)],
        mask_owner=m if at == "layers" else None,
        mask_arg=("attention_mask", 3) if at == "layers" else None,
    )
