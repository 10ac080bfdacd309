"""timm attention whose W_Q/W_K/W_V are followed by BatchNorm: a Linear or 1×1 conv inside a LinearNorm / ConvNorm.

One stated reading: λI is added to the weight W of that Linear / conv (the model's own W_Q, W_K, W_V), before its
BatchNorm, which follows as in the model: in eval the map is diag(γ/σ)(W + λI) (+ the BN shift), in training BN
rescales each channel by batch statistics. Every method reads that W (diagnostics, svd, mode=init,
conditioned_init). Each site says so in its PatchReport entry (`AttentionSite.note`). Non-square role blocks get
the rectangular identity, as everywhere (spectral.SpectralShift); value heads may be wider (role_head_dim).

- timm_levit: LeViT `Attention` (`qkv` viewed per head [q_h; k_h; v_h] of widths key_dim, key_dim, val_dim) and
  `AttentionDownsample` (`q` after token subsampling; `kv` per head [k_h; v_h]); LinearNorm or ConvNorm (use_conv).
- timm_efficientformer_v2: EfficientFormer-V2 `Attention2d` (`q`, `k`, `v` ConvNorm, after an optional strided
  depthwise conv) and `Attention2dDownsample` (`q` a LocalGlobalQuery: its 1×1 ConvNorm after depthwise conv +
  pooling). Talking-head mixing of the logits follows q·kᵀ as in the model.

EfficientViT-MSRA: one site per head (layouts/timm_efficientvit_msra.py). Expected PatchReport counts: one site per
attention module of these classes (levit_128s: 11 timm_levit, efficientformerv2_s0: 5 timm_efficientformer_v2).
"""

from __future__ import annotations

import torch
from torch import nn

from ..sites import AttentionSite, Projection, attention_layout, interleaved, is_class, separate
from .timm_conv import _site

NOTE = "λI added to W before its BatchNorm"


def _w(norm: nn.Module) -> nn.Module | None:
    """The Linear / conv of a LinearNorm / ConvNorm (LeViT: `linear`, EfficientFormer-V2: `conv`)."""
    return norm.linear if hasattr(norm, "linear") else norm.conv


def _bn_site(name, m, layout, heads, head_dim, proj) -> AttentionSite | None:
    site = _site(name, m, layout, heads, head_dim, proj)
    if site is not None:
        site.note = NOTE
    return site


@attention_layout("timm_levit", priority=10)
def timm_levit(name: str, m: nn.Module) -> AttentionSite | None:
    h, kd, vd = getattr(m, "num_heads", 0), getattr(m, "key_dim", 0), getattr(m, "val_dim", 0)
    if is_class(m, "timm.models.levit", "Attention"):
        head_dim, proj = interleaved(_w(m.qkv), h, (kd, kd, vd))
        return _bn_site(name, m, "timm_levit", h, head_dim, proj)
    if not is_class(m, "timm.models.levit", "AttentionDownsample"):
        return None
    per = kd + vd  # kv viewed (…, heads, kd + vd): per head [k_h; v_h]
    k = torch.cat([torch.arange(i * per, i * per + kd, device="cpu") for i in range(h)])
    v = torch.cat([torch.arange(i * per + kd, (i + 1) * per, device="cpu") for i in range(h)])
    kv = _w(m.kv)
    proj = {"q": Projection(_w(m.q.ln), slice(0, h * kd)), "k": Projection(kv, k), "v": Projection(kv, v)}
    return _bn_site(name, m, "timm_levit", h, kd, proj)


@attention_layout("timm_efficientformer_v2", priority=10)
def timm_efficientformer_v2(name: str, m: nn.Module) -> AttentionSite | None:
    if is_class(m, "timm.models.efficientformer_v2", "Attention2d"):
        q = m.q
    elif is_class(m, "timm.models.efficientformer_v2", "Attention2dDownsample"):
        q = m.q.proj  # LocalGlobalQuery: depthwise conv + pooling shape the input of its ConvNorm
    else:
        return None
    proj = separate((_w(q), _w(m.k), _w(m.v)))
    return _bn_site(name, m, "timm_efficientformer_v2", m.num_heads, m.key_dim, proj)
