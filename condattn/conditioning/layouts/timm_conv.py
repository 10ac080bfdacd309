"""timm attention whose W_Q/W_K/W_V are pointwise convolutions (kernel 1, groups 1) on (B, C, H, W) maps, where the
output channels are not a block-stacked [Q; K; V] that structure alone could read (layouts/structural.py covers the
stacked ones, e.g. Visformer, and MobileNetV5's query/key/value). SCA adds λI to the weight's (out, in) view, folded
at call time as for a Linear (spectral.ShiftedConv2d).

- timm_maxxvit_conv: MaxxViT / CoAtNet `Attention2d`, one `qkv` conv; head_first (the default) views it
  (B, heads, 3·d, N): per head [q_h; k_h; v_h] (interleaved), else (B, 3, heads, d, N): stacked.
- timm_halo: HaloNet `HaloAttn`, W_Q = `q` (stride = block stride), `kv` viewed (B·heads, d_qk + d_v, …): per head
  [k_h; v_h].
- timm_bottleneck: BoTNet `BottleneckAttn`, one `qkv` split [Q (heads·d_qk); K (heads·d_qk); V (heads·d_v)].
Where d_v ≠ d_qk (qk_ratio ≠ 1) the module is refused in one line: a site has one head width.
- timm_pwise_conv: LowFormer / CPUBone `ConvAttention`, W = `pwise` (after a strided depthwise conv + BN that forms
  its input tokens), viewed (B, heads, 3·d, N): per head [q_h; k_h; v_h].
- timm_csatv2_spatial: CSATv2's `SpatialTransformerBlock` inside `SpatialAttention`: one head of width 1 over the 7×7
  positions (`qkv` Linear(1, 3)): W + λI is w + λ for each of q, k, v.

Expected PatchReport counts: one site per attention module of these classes (coatnet_nano_cc_224: 7 timm_maxxvit_conv,
halonet_h1: 19 timm_halo, lowformer_b0: 7 timm_pwise_conv, cpubone_nano: 3, csatv2: 14 timm_csatv2_spatial).
"""

from __future__ import annotations

import torch
from torch import nn

from ..sites import (
    REFUSED,
    AttentionSite,
    Projection,
    attention_layout,
    interleaved,
    is_class,
    is_pointwise_conv,
    stacked,
)


def _site(name, m, layout, heads, head_dim, proj) -> AttentionSite | None:
    if not all(is_pointwise_conv(p.linear) or isinstance(p.linear, nn.Linear) for p in proj.values()):
        return None
    return AttentionSite(name, m, layout, heads, head_dim, proj)


def _widths(m: nn.Module) -> str:
    """HaloNet / BoTNet with qk_ratio ≠ 1: why they are refused ('' when d_v = d_qk)."""
    if m.dim_head_v == m.dim_head_qk:
        return ""
    return (f"its value heads are {m.dim_head_v} wide and its query/key heads {m.dim_head_qk}: roles of different "
            "widths in one projection are not split by this layout yet, so qk_ratio must be 1")


REFUSED.update({("timm.layers.halo_attn", "HaloAttn"): _widths,
                ("timm.layers.bottleneck_attn", "BottleneckAttn"): _widths})


@attention_layout("timm_maxxvit_conv", priority=10)
def timm_maxxvit_conv(name: str, m: nn.Module) -> AttentionSite | None:
    # timm.layers.attention2d.Attention2d has the same qkv layout and head_first switch
    if not (is_class(m, "timm.models.maxxvit", "Attention2d") or is_class(m, "timm.layers.attention2d",
                                                                          "Attention2d")):
        return None
    fn = interleaved if m.head_first else stacked
    head_dim, proj = fn(m.qkv, m.num_heads)
    return _site(name, m, "timm_maxxvit_conv", m.num_heads, head_dim, proj)


@attention_layout("timm_halo", priority=10)
def timm_halo(name: str, m: nn.Module) -> AttentionSite | None:
    if not is_class(m, "timm.layers.halo_attn", "HaloAttn") or _widths(m):
        return None
    h, dqk, dv = m.num_heads, m.dim_head_qk, m.dim_head_v
    per = dqk + dv
    k = torch.cat([torch.arange(i * per, i * per + dqk, device="cpu") for i in range(h)])
    v = torch.cat([torch.arange(i * per + dqk, (i + 1) * per, device="cpu") for i in range(h)])
    proj = {"q": Projection(m.q, slice(0, h * dqk)), "k": Projection(m.kv, k), "v": Projection(m.kv, v)}
    return _site(name, m, "timm_halo", h, dqk, proj)


@attention_layout("timm_bottleneck", priority=10)
def timm_bottleneck(name: str, m: nn.Module) -> AttentionSite | None:
    if not is_class(m, "timm.layers.bottleneck_attn", "BottleneckAttn") or _widths(m):
        return None
    qk, v = m.dim_out_qk, m.dim_out_v
    proj = {"q": Projection(m.qkv, slice(0, qk)), "k": Projection(m.qkv, slice(qk, 2 * qk)),
            "v": Projection(m.qkv, slice(2 * qk, 2 * qk + v))}
    return _site(name, m, "timm_bottleneck", m.num_heads, m.dim_head_qk, proj)


@attention_layout("timm_pwise_conv", priority=10)
def timm_pwise_conv(name: str, m: nn.Module) -> AttentionSite | None:
    if not (is_class(m, "timm.models.lowformer", "ConvAttention") or is_class(m, "timm.models.cpubone",
                                                                              "ConvAttention")):
        return None
    if m.num_keys != 3:
        return None
    head_dim, proj = interleaved(m.pwise, m.num_heads)
    return _site(name, m, "timm_pwise_conv", m.num_heads, head_dim, proj)


@attention_layout("timm_csatv2_spatial", priority=10)
def timm_csatv2_spatial(name: str, m: nn.Module) -> AttentionSite | None:
    if not is_class(m, "timm.models.csatv2", "SpatialTransformerBlock"):
        return None
    head_dim, proj = stacked(m.qkv, 1)
    return _site(name, m, "timm_csatv2_spatial", 1, head_dim, proj)
