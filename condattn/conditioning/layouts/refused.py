"""timm attention modules that no layout may patch with SCA, each with the one line `require_attention` prints
(sites.REFUSED; layouts/structural.py never matches them, so a coincidence of names cannot patch them wrongly).

They count as attention layers (their class name says attention), so a model holding them is refused unless
`partial=True`, which patches its other attention layers. No finder is registered here: nothing is matched.

LeViT and EfficientFormer-V2 (Linear/Conv + BatchNorm projections) are patched by layouts/timm_bn.py, λI added to W
before its BatchNorm; EfficientViT-MSRA's cascaded heads, each with its own W_Q/W_K/W_V, are one site per head
(layouts/timm_efficientvit_msra.py). CoaT's factorised attention is refused here. GCViT's global attention (queries
from the stage's global query tokens, no W_Q) is patched by layouts/timm_gcvit.py on its W_K and W_V.
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
    ("timm.models.coat", "FactorAttnConvRelPosEnc"):
        "CoaT's factorised attention: a softmax over the keys, then q·(softmax(K)ᵀV) and a convolutional position "
        f"term; {NO_QK}",
})
