"""timm Eva family (EVA-02, RoPE ViT, the SBB `vit_*_rope_*` models, Perception Encoder): `EvaAttention` or timm's
`AttentionRope`, tokens at the input of `blocks[0]` of the `Eva` model.

Both attention classes hold W_Q, W_K, W_V either in one fused `qkv` Linear (block-stacked [Q; K; V]) or in
separate `q_proj` / `k_proj` / `v_proj` (grouped-query attention in `AttentionRope`: k/v with num_kv_heads heads).
An `EvaAttention` with q/v biases (`q_bias`, `v_bias`, zero k bias) does not call its `qkv` but passes
`qkv.weight` to F.linear with the concatenated bias: those projections are `called=False` (sites.Projection), so
SCA folds W + λI into `qkv.weight` for the duration of the attention's forward.

Rotary embeddings rotate q and k after the projections (and EVA-02's optional q/k norms normalise them), so W + λI
is exact for the projections as the papers define SCA; the attention form recorded for the diagnostics is the
token softmax of the projected q, k (the probe applies the module's q/k norms, not the rotation).

Expected PatchReport counts: an Eva of `depth` blocks has `depth` timm_eva attention sites and one timm_eva token
site.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, of_library, separate, stacked, token_layout
from .timm_vit import blocks_token_site


def reads_qkv_weight(m: nn.Module) -> bool:
    """timm Eva / BEiT attention with q/v biases computes F.linear(x, qkv.weight, cat(q_bias, k_bias, v_bias)) unless
    `qkv_bias_separate` (then it calls `qkv` and adds the bias)."""
    return getattr(m, "q_bias", None) is not None and not getattr(m, "qkv_bias_separate", False)


def fused_or_separate(m: nn.Module) -> tuple[int, dict]:
    """(head_dim, projections) of a timm attention with either a fused `qkv` or q_proj/k_proj/v_proj."""
    if getattr(m, "qkv", None) is not None:
        head_dim, proj = stacked(m.qkv, m.num_heads)
        if reads_qkv_weight(m):
            proj = {r: replace(p, called=False) for r, p in proj.items()}
        return head_dim, proj
    return m.head_dim, separate((m.q_proj, m.k_proj, m.v_proj))


@attention_layout("timm_eva")
def timm_eva(name: str, m: nn.Module) -> AttentionSite | None:
    """timm `EvaAttention` (eva.py) and `AttentionRope` (layers/attention.py): fused or separate q/k/v, token softmax
    with the module's `scale`; RoPE on q, k after the projections."""
    # cheap tests first (both exist, one of them None; a timm class): no timm import for other models
    if not (hasattr(m, "q_proj") and hasattr(m, "qkv") and of_library(m, "timm")):
        return None
    from timm.models.eva import EvaAttention

    try:
        from timm.layers.attention import AttentionRope
    except ImportError:  # timm 1.0.15: no AttentionRope (nor the RoPE ViTs that use it)
        AttentionRope = EvaAttention
    if type(m) not in (EvaAttention, AttentionRope):
        return None
    head_dim, proj = fused_or_separate(m)
    return AttentionSite(name, m, "timm_eva", m.num_heads, head_dim, proj)


@token_layout("timm_eva")
def timm_eva_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """timm `Eva`: X is the input of `blocks[0]`, i.e. after class/register tokens, the absolute position embedding
    (where the model has one; RoPE models add positions inside each attention instead) and norm_pre;
    before_pos_embed hooks the patch embedding's output."""
    if not (hasattr(m, "blocks") and hasattr(m, "rope") and of_library(m, "timm")):  # cheap tests first
        return None
    from timm.models.eva import Eva

    if not isinstance(m, Eva) or len(m.blocks) == 0:
        return None
    return blocks_token_site("timm_eva", name, m)
