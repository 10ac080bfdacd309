"""timm XCiT: cross-covariance attention (`XCA`) blocks, then class-attention (`ClassAttn`) blocks; tokens at the
input of `blocks[0]`."""

from __future__ import annotations

from torch import nn

from ..forms import CROSS_COVARIANCE
from ..sites import AttentionSite, TokenSite, attention_layout, join, of_library, separate, stacked, token_layout


@attention_layout("timm_xca")
def timm_xca(name: str, m: nn.Module) -> AttentionSite | None:
    """timm XCiT `XCA` (cross-covariance attention): fused `qkv`, block-stacked [Q; K; V]. Per head, q and k
    (N × d_h) are L2-normalised along the token axis and the attention is softmax(τ · q̂ᵀ k̂) over a d_h × d_h
    channel matrix, with τ a learned per-head temperature; the output is v · Aᵀ (channels mixed, tokens kept).
    Form: CROSS_COVARIANCE (the entropy probe and κ(J) use this formula, not the token softmax).

    What SCA means here: W_Q, W_K, W_V still become W + λI (so κ(W + λI) ≤ (λ + σ_max)/(λ − σ_max) as for token
    attention, and V's conditioning is unchanged in meaning). But the L2 normalisation removes the λ² growth of
    the logits that saturates token softmax: with large λ, q̂ and k̂ tend to the normalised input channels x̂_c,
    so q̂ᵀk̂ tends to the channel-correlation (cosine) matrix of X within each head, bounded by |τ|. The softmax
    cannot go one-hot through λ; SCA instead pulls XCA's attention towards the input's own channel correlations.
    """
    if not (hasattr(m, "temperature") and of_library(m, "timm")):  # cheap tests first: no timm import for others
        return None
    from timm.models.xcit import XCA

    if type(m) is not XCA:
        return None
    head_dim, proj = stacked(m.qkv, m.num_heads)
    return AttentionSite(name, m, "timm_xca", m.num_heads, head_dim, proj, attends_over="channels",
                         form=CROSS_COVARIANCE)


@attention_layout("timm_class_attn")
def timm_class_attn(name: str, m: nn.Module) -> AttentionSite | None:
    """timm CaiT/XCiT `ClassAttn` (XCiT's class-attention layers): separate `q`, `k`, `v` Linears; only the class
    token queries (q = W_Q applied to x[:, 0]), keys and values come from all tokens; ordinary token softmax.

    Decision: these layers COUNT as attention layers for SCA. They are softmax attention with their own
    W_Q, W_K, W_V, and the SCA paper adds λI to "every attention layer"; so XCiT-M has 24 XCA + 2 class-attention
    sites. The papers do not say whether their XCiT runs conditioned them; this decision is recorded in every
    PatchReport (kind `spectral:timm_class_attn`)."""
    if not (hasattr(m, "q") and of_library(m, "timm")):
        return None
    from timm.models.cait import ClassAttn

    if type(m) is not ClassAttn:
        return None
    heads = m.num_heads
    return AttentionSite(name, m, "timm_class_attn", heads, m.q.out_features // heads, separate((m.q, m.k, m.v)),
                         queries="first")


@token_layout("timm_xcit")
def timm_xcit(name: str, m: nn.Module) -> TokenSite | None:
    """timm XCiT: X is the input of `blocks[0]`: the convolutional patch embedding plus the Fourier positional
    encoding (after pos_drop). The class token is only prepended later, before the class-attention layers, so
    X has no prefix tokens (the model's own `num_prefix_tokens` = 1 describes the class-attention stage).
    `blocks` lists the XCA blocks and then the class-attention blocks (whose input includes the class token).
    position=before_pos_embed hooks the convolutional patch embedding's output, before the Fourier positional
    encoding (the patch embedding returns a tuple (tokens, (Hp, Wp)); CET corrects its tokens)."""
    if not (hasattr(m, "blocks") and of_library(m, "timm")):
        return None
    from timm.models.xcit import Xcit

    if type(m) is not Xcit:
        return None
    blocks = [(join(name, f"blocks.{i}"), b) for i, b in enumerate(m.blocks)]
    blocks += [(join(name, f"cls_attn_blocks.{i}"), b) for i, b in enumerate(m.cls_attn_blocks or [])]
    return TokenSite(
        layout="timm_xcit",
        first_block=m.blocks[0],
        first_block_name=blocks[0][0],
        embed=m.patch_embed,
        embed_name=join(name, "patch_embed"),
        num_prefix_tokens=0,
        blocks=blocks,
    )
