"""timm attention modules that no layout may patch with SCA, each with the one line `require_attention` prints
(sites.REFUSED; layouts/structural.py never matches them, so a coincidence of names cannot patch them wrongly).

They count as attention layers (their class name says attention), so a model holding them is refused unless
`partial=True`, which patches its other attention layers. No finder is registered here: nothing is matched.

Linear/Conv + BatchNorm projections (LeViT, EfficientViT-MSRA here; EfficientFormer-V2 by layouts/structural.py) are
refused rather than given λ·x after the norm (BN∘W + λI): in training BN∘W is a different map for every batch, and
the diagnostics, svd correction, mode=init and the other methods all read one stored W.
"""

from __future__ import annotations

from ..sites import REFUSED

NO_QK = "no q·kᵀ logits, so W_Q/W_K + λI has nothing to condition"
REFUSED.update({
    ("timm.models.swiftformer", "EfficientAdditiveAttention"):
        "SwiftFormer's additive attention: a learned vector w_g pools the queries into one global query that scales "
        f"the keys elementwise; {NO_QK}",
    ("timm.models.volo", "OutlookAttention"):
        "VOLO's outlook attention: the k×k local weights are a Linear of each token (`attn`), not queries against "
        f"keys; {NO_QK}",
    ("timm.models.nextvit", "ConvAttention"):
        f"NextViT's multi-head convolutional attention is a grouped 3×3 conv + BN + ReLU + 1×1 conv; {NO_QK}",
    ("timm.models.gcvit", "WindowAttentionGlobal"): lambda m: (
        "GCViT's global attention takes its queries from the stage's global query tokens (GlobalContext features "
        "shared by all windows), not from a projection of x: `qkv` holds only W_K, W_V and there is no W_Q"
        if m.use_global else ""),
    ("timm.models.efficientvit_msra", "CascadedGroupAttention"):
        "EfficientViT-MSRA's cascaded group attention: each head's q/k/v is a ConvNorm (1×1 conv + BatchNorm, whose "
        "BN∘W depends on batch statistics in training: no fixed W to add λI to) and q passes a depthwise conv after it",
    ("timm.models.levit", "Attention"):
        "LeViT's `qkv` is a LinearNorm (Linear + BatchNorm): BN∘W depends on batch statistics in training, so there "
        "is no fixed W to add λI to (and λI inside W is rescaled by the norm)",
    ("timm.models.levit", "AttentionDownsample"):
        "LeViT's `q` / `kv` are LinearNorm (Linear + BatchNorm): BN∘W depends on batch statistics in training, so "
        "there is no fixed W to add λI to (and λI inside W is rescaled by the norm)",
})
