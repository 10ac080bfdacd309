"""timm DaViT: dual blocks of a spatial `WindowAttention` and a `ChannelAttention`; channels-first tokens at the
input of `stages[0].blocks[0]`."""

from __future__ import annotations

from torch import nn

from ..forms import CHANNEL_SOFTMAX
from ..sites import AttentionSite, TokenSite, attention_layout, feature_stages, join, of_library, stacked, token_layout


@attention_layout("timm_davit_window")
def timm_davit_window(name: str, m: nn.Module) -> AttentionSite | None:
    """timm DaViT spatial `WindowAttention`: fused `qkv`, block-stacked [Q; K; V], softmax over each window's
    tokens (no relative position bias; DaViT's positions come from the depthwise-conv ConvPosEnc)."""
    if not (hasattr(m, "qkv") and of_library(m, "timm")):  # cheap tests first: no timm import for other models
        return None
    from timm.models.davit import WindowAttention

    if type(m) is not WindowAttention:
        return None
    head_dim, proj = stacked(m.qkv, m.num_heads)
    return AttentionSite(name, m, "timm_davit_window", m.num_heads, head_dim, proj)


@attention_layout("timm_davit_channel")
def timm_davit_channel(name: str, m: nn.Module) -> AttentionSite | None:
    """timm DaViT `ChannelAttention` (and `ChannelAttentionV2`): fused `qkv`, block-stacked in three chunks, with
    per-head attention over the d_h × d_h channel matrix (no normalisation, fixed scale). Form: CHANNEL_SOFTMAX.

    Roles are assigned by what each chunk does in the attention formula, not by the variable names: timm's (and
    the official DaViT code's) `ChannelAttention` computes softmax((k·scale)ᵀ v) and aggregates q, so there
    chunk 1 ("k") plays the query, chunk 2 ("v") the key and chunk 0 ("q") the value. `ChannelAttentionV2`
    computes softmax(qᵀ k) and aggregates v (chunks in order). With the default targets [q, k, v] both readings
    patch the same three blocks; they differ only for a subset such as targets=[v]."""
    if not (hasattr(m, "qkv") and of_library(m, "timm")):
        return None
    from timm.models.davit import ChannelAttention, ChannelAttentionV2

    if type(m) is ChannelAttention:
        head_dim, proj = stacked(m.qkv, m.num_heads, order=(1, 2, 0))
        heads = m.num_heads
    elif type(m) is ChannelAttentionV2:
        head_dim, proj = stacked(m.qkv, m.groups)
        heads = m.groups
    else:
        return None
    return AttentionSite(name, m, "timm_davit_channel", heads, head_dim, proj, attends_over="channels",
                         form=CHANNEL_SOFTMAX)


@token_layout("timm_davit")
def timm_davit(name: str, m: nn.Module) -> TokenSite | None:
    """timm DaViT: X is the input of the first dual block, `stages[0].blocks[0]`: the conv stem's output after
    its LayerNorm2d, laid out (B, C, H, W) (channels first: CET and the κ(X) probe read it as the (H·W) × C
    matrix). DaViT has no position embedding before the blocks: each block starts with a depthwise-conv
    positional encoding (ConvPosEnc) inside it, so after_pos_embed and before_pos_embed (the stem output) are the
    same X. The FeatureListNet of `features_only=True` holds the same stem and stages (stages_0, stages_1, ...)."""
    if not ((hasattr(m, "stages") or "stages_0" in m._modules) and of_library(m, "timm")):
        return None
    from timm.models.davit import DaVit, DaVitStage

    if type(m) is DaVit:
        stages = [(f"stages.{i}", st) for i, st in enumerate(m.stages)]
    elif (stages := feature_stages(m, "stages", DaVitStage)) is None:
        return None
    blocks = [(join(name, f"{s}.blocks.{j}"), b) for s, st in stages for j, b in enumerate(st.blocks)]
    return TokenSite(
        layout="timm_davit",
        first_block=stages[0][1].blocks[0],
        first_block_name=blocks[0][0],
        embed=m.stem,
        embed_name=join(name, "stem"),
        num_prefix_tokens=0,
        blocks=blocks,
        channels_first=True,
        no_pos_embed="DaViT adds no positions before its blocks (a depthwise-conv ConvPosEnc inside each block)",
    )
