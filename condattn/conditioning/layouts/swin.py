"""timm Swin (v1): `WindowAttention` with one fused `qkv`; tokens at the input of `layers[0].blocks[0]` (of the model,
or of the FeatureListNet that `features_only=True` builds from it)."""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, feature_stages, join, of_library, stacked, token_layout


@attention_layout("timm_swin_window")
def timm_swin_window(name: str, m: nn.Module) -> AttentionSite | None:
    """timm Swin `WindowAttention`: one fused `qkv` (block-stacked [Q; K; V]) applied to each window's tokens
    (B·nW, window_area, C); softmax over the window with a learned relative position bias (and the shift mask)
    added to the logits. SCA adds λI to W_Q/W_K/W_V exactly as for ViT; the bias is untouched."""
    if not (hasattr(m, "qkv") and of_library(m, "timm")):  # cheap tests first: no timm import for other models
        return None
    from timm.models.swin_transformer import WindowAttention

    if type(m) is not WindowAttention:
        return None
    head_dim, proj = stacked(m.qkv, m.num_heads)
    return AttentionSite(name, m, "timm_swin_window", m.num_heads, head_dim, proj)


@token_layout("timm_swin")
def timm_swin(name: str, m: nn.Module) -> TokenSite | None:
    """timm Swin: X is the input of `layers[0].blocks[0]`, the patch embedding after its LayerNorm, laid out
    B × H × W × C (CET flattens it to (H·W) × C). Swin v1 has no absolute position embedding (positions enter
    as a relative bias inside each window attention), so after_pos_embed and before_pos_embed see the same X."""
    if not ((hasattr(m, "layers") or "layers_0" in m._modules) and of_library(m, "timm")):
        return None
    from timm.models.swin_transformer import SwinTransformer, SwinTransformerStage

    if type(m) is SwinTransformer:
        stages = [(f"layers.{i}", st) for i, st in enumerate(m.layers)]
    elif (stages := feature_stages(m, "layers", SwinTransformerStage)) is None:
        return None
    blocks = [(join(name, f"{s}.blocks.{j}"), b) for s, st in stages for j, b in enumerate(st.blocks)]
    return TokenSite(
        layout="timm_swin",
        first_block=stages[0][1].blocks[0],
        first_block_name=blocks[0][0],
        embed=m.patch_embed,
        embed_name=join(name, "patch_embed"),
        num_prefix_tokens=0,
        blocks=blocks,
        no_pos_embed="Swin v1 adds no absolute positions (a relative bias inside each window attention)",
    )
