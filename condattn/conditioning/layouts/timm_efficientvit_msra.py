"""timm EfficientViT-MSRA `CascadedGroupAttention`: every head has its own q/k/v projection, a 1×1 ConvNorm
(`qkvs[h]`: conv then BatchNorm) over its own input, the h-th channel chunk of x plus head h−1's output (the cascade).
That is still one W per role per head, so each head is a site of its own, named `<layer>#h<h>` (one head wide; the
PatchReport counts the layer once, sites.layer_of): W_Q, W_K, W_V are the conv's output rows [key_dim; key_dim;
val_dim], and, as for LeViT (timm_bn.py), λI is added to that W before its BatchNorm (the entry says so). The query
then passes a depthwise ConvNorm (`dws[h]`), as the model does.
"""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, Projection, attention_layout, is_class, is_pointwise_conv
from .timm_bn import NOTE


@attention_layout("timm_efficientvit_msra", priority=10)
def timm_efficientvit_msra(name: str, m: nn.Module) -> list[AttentionSite] | None:
    if not is_class(m, "timm.models.efficientvit_msra", "CascadedGroupAttention"):
        return None
    kd, vd = m.key_dim, m.val_dim
    sites = []
    for h, qkv in enumerate(m.qkvs):
        conv = qkv.conv
        if not is_pointwise_conv(conv) or conv.out_channels != 2 * kd + vd:
            return None
        proj = {"q": Projection(conv, slice(0, kd)), "k": Projection(conv, slice(kd, 2 * kd)),
                "v": Projection(conv, slice(2 * kd, 2 * kd + vd))}
        sites.append(AttentionSite(f"{name}#h{h}", m, "timm_efficientvit_msra", 1, kd, proj,
                                   note=f"{NOTE}; head {h} of {m.num_heads}, its own W over its cascaded input"))
    return sites
