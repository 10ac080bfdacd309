"""timm BEiT (v1 / v2): `beit.Attention` with one fused `qkv` and a relative position bias; tokens at the input of
`blocks[0]` of the `Beit` model.

With q/v biases (timm's default for BEiT) the attention passes `qkv.weight` to F.linear with the concatenated
bias instead of calling `qkv`: those projections are `called=False` (sites.Projection) and SCA folds W + λI into
`qkv.weight` for the duration of the attention's forward. The relative position bias is added to the logits and
left untouched.

Expected PatchReport counts: a BEiT of `depth` blocks has `depth` timm_beit attention sites and one timm_beit
token site.
"""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, TokenSite, attention_layout, of_library, token_layout
from .timm_eva import fused_or_separate
from .timm_vit import blocks_token_site


@attention_layout("timm_beit")
def timm_beit(name: str, m: nn.Module) -> AttentionSite | None:
    """timm `beit.Attention`: fused `qkv`, block-stacked [Q; K; V]; token softmax with the module's `scale` plus
    the relative position bias."""
    if not (hasattr(m, "qkv") and hasattr(m, "relative_position_bias_table") and of_library(m, "timm")):
        return None
    from timm.models.beit import Attention

    if type(m) is not Attention:
        return None
    head_dim, proj = fused_or_separate(m)
    return AttentionSite(name, m, "timm_beit", m.num_heads, head_dim, proj)


@token_layout("timm_beit")
def timm_beit_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """timm `Beit`: X is the input of `blocks[0]`, i.e. the class token and patch tokens after the absolute
    position embedding (when the model uses one) and pos_drop; before_pos_embed hooks the patch embedding."""
    if not (hasattr(m, "blocks") and hasattr(m, "rel_pos_bias") and of_library(m, "timm")):  # cheap tests first
        return None
    from timm.models.beit import Beit

    if not isinstance(m, Beit) or len(m.blocks) == 0:
        return None
    return blocks_token_site("timm_beit", name, m)
