"""timm ViT / DeiT: `Attention` with one fused `qkv`; tokens at the input of `blocks[0]`."""

from __future__ import annotations

from torch import nn

from ..sites import ROLES, AttentionSite, Projection, TokenSite, attention_layout, join, of_library, token_layout


@attention_layout("timm_fused_qkv")
def timm_fused_qkv(name: str, m: nn.Module) -> AttentionSite | None:
    """timm `Attention` (ViT, DeiT): one `qkv` Linear whose output is block-stacked [Q; K; V]; token softmax."""
    if not (hasattr(m, "qkv") and of_library(m, "timm")):  # cheap tests first: no timm import for other models
        return None
    if type(m) is not _attention_class():
        return None
    a = m.num_heads * m.head_dim
    proj = {r: Projection(m.qkv, slice(i * a, (i + 1) * a)) for i, r in enumerate(ROLES)}
    return AttentionSite(name, m, "timm_fused_qkv", m.num_heads, m.head_dim, proj)


def _attention_class() -> type:
    """timm's ViT `Attention`: in timm.layers.attention since timm 1.0.16, in vision_transformer.py before."""
    try:
        from timm.layers.attention import Attention
    except ImportError:  # timm 1.0.15
        from timm.models.vision_transformer import Attention
    return Attention


@token_layout("timm_vit")
def timm_vit(name: str, m: nn.Module) -> TokenSite | None:
    """timm `VisionTransformer` (ViT, DeiT and its distilled subclass): X is the input of `blocks[0]`, i.e. after
    cls token, pos_embed and norm_pre."""
    if not (hasattr(m, "blocks") and of_library(m, "timm")):  # cheap tests first
        return None
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(m, VisionTransformer) or len(m.blocks) == 0:
        return None
    return blocks_token_site("timm_vit", name, m)


def blocks_token_site(layout: str, name: str, m: nn.Module) -> TokenSite:
    """The TokenSite of a timm model with `blocks`, `patch_embed` and `num_prefix_tokens` (ViT, Eva, BEiT): X is
    the input of `blocks[0]`; before_pos_embed hooks the patch embedding."""
    return TokenSite(
        layout=layout,
        first_block=m.blocks[0],
        first_block_name=join(name, "blocks.0"),
        embed=m.patch_embed,
        embed_name=join(name, "patch_embed"),
        num_prefix_tokens=int(m.num_prefix_tokens),
        blocks=[(join(name, f"blocks.{i}"), b) for i, b in enumerate(m.blocks)],
    )
