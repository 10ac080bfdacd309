"""Where the conditioning goes, per architecture layout.

Two small registries:
- ATTENTION_LAYOUTS: finders that recognise one attention module and say which Linear (and which slice
  of its output columns) holds W_Q, W_K and W_V. SCA patches these; diagnostics read them.
- TOKEN_LAYOUTS: finders that locate, in a whole model, the first transformer block (CET's input X),
  the token-embedding module (for position=before_pos_embed), the number of prefix tokens, and the module
  whose forward receives the padding mask.

A new architecture adds one finder to each registry with `@attention_layout("name")` /
`@token_layout("name")`; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

ROLES = ("q", "k", "v")


@dataclass
class Projection:
    linear: nn.Linear
    cols: slice  # output columns of `linear` that hold this role, all heads, head-major


@dataclass
class AttentionSite:
    name: str
    module: nn.Module
    layout: str
    num_heads: int
    head_dim: int
    proj: dict[str, Projection]

    def weight(self, role: str, effective: bool = True) -> torch.Tensor:
        """torch-layout weight (heads*head_dim, D_in) of one role; `effective` includes an SCA shift (W + λI)."""
        p = self.proj[role]
        w = p.linear.weight.detach()
        shift = getattr(p.linear, "_condattn_shift", None)
        if effective and shift is not None:
            w = w + shift.delta_weight().to(w)
        return w[p.cols]

    def head_weight(self, role: str, head: int, effective: bool = True) -> torch.Tensor:
        d = self.head_dim
        return self.weight(role, effective)[head * d : (head + 1) * d]

    def grad(self, role: str) -> torch.Tensor | None:
        p = self.proj[role]
        g = p.linear.weight.grad
        return None if g is None else g[p.cols]


@dataclass
class TokenSite:
    layout: str
    first_block: nn.Module
    first_block_name: str
    embed: nn.Module  # its output = token embeddings before positions are added
    embed_name: str
    num_prefix_tokens: int  # CLS / register tokens at the front of the first block's input
    blocks: list[tuple[str, nn.Module]]  # all transformer blocks in order (diagnostics: κ of each input)
    mask_owner: nn.Module | None = None  # forward receives the padding mask
    mask_arg: tuple[str, int] | None = None  # (kwarg name, positional index) of that mask


AttentionFinder = Callable[[str, nn.Module], "AttentionSite | None"]
TokenFinder = Callable[[str, nn.Module], "TokenSite | None"]
ATTENTION_LAYOUTS: dict[str, AttentionFinder] = {}
TOKEN_LAYOUTS: dict[str, TokenFinder] = {}


def attention_layout(name: str):
    def deco(fn: AttentionFinder) -> AttentionFinder:
        ATTENTION_LAYOUTS[name] = fn
        return fn

    return deco


def token_layout(name: str):
    def deco(fn: TokenFinder) -> TokenFinder:
        TOKEN_LAYOUTS[name] = fn
        return fn

    return deco


def find_attention(model: nn.Module) -> list[AttentionSite]:
    """Every attention module of `model` that some registered layout recognises, in module order."""
    sites = []
    for name, module in model.named_modules():
        for finder in ATTENTION_LAYOUTS.values():
            site = finder(name, module)
            if site is not None:
                sites.append(site)
                break
    return sites


def find_tokens(model: nn.Module) -> TokenSite | None:
    """The outermost sub-model whose first-block input a registered layout recognises."""
    for name, module in model.named_modules():
        for finder in TOKEN_LAYOUTS.values():
            site = finder(name, module)
            if site is not None:
                return site
    return None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------- attention layouts


@attention_layout("timm_fused_qkv")
def _timm_fused_qkv(name: str, m: nn.Module) -> AttentionSite | None:
    """timm `Attention` (ViT, DeiT): one `qkv` Linear whose output is block-stacked [Q; K; V]."""
    from timm.layers.attention import Attention

    if type(m) is not Attention:
        return None
    a = m.num_heads * m.head_dim
    proj = {r: Projection(m.qkv, slice(i * a, (i + 1) * a)) for i, r in enumerate(ROLES)}
    return AttentionSite(name, m, "timm_fused_qkv", m.num_heads, m.head_dim, proj)


@attention_layout("hf_separate_qkv")
def _hf_separate_qkv(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers self-attention with separate `query`/`key`/`value` Linears (BERT, Nyströmformer)."""
    lins = [getattr(m, r, None) for r in ("query", "key", "value")]
    if not all(isinstance(x, nn.Linear) for x in lins) or not hasattr(m, "attention_head_size"):
        return None
    heads = getattr(m, "num_attention_heads", None) or m.config.num_attention_heads
    proj = {r: Projection(lin, slice(0, lin.out_features)) for r, lin in zip(ROLES, lins)}
    return AttentionSite(name, m, "hf_separate_qkv", heads, m.attention_head_size, proj)


# ---------------------------------------------------------------- token layouts


@token_layout("timm_vit")
def _timm_vit(name: str, m: nn.Module) -> TokenSite | None:
    """timm ViT/DeiT: X is the input of `blocks[0]`, i.e. after cls token, pos_embed and norm_pre."""
    if not (hasattr(m, "blocks") and hasattr(m, "patch_embed") and hasattr(m, "num_prefix_tokens")):
        return None
    if len(m.blocks) == 0:
        return None
    return TokenSite(
        layout="timm_vit",
        first_block=m.blocks[0],
        first_block_name=_join(name, "blocks.0"),
        embed=m.patch_embed,
        embed_name=_join(name, "patch_embed"),
        num_prefix_tokens=int(m.num_prefix_tokens),
        blocks=[(_join(name, f"blocks.{i}"), b) for i, b in enumerate(m.blocks)],
    )


@token_layout("hf_encoder")
def _hf_encoder(name: str, m: nn.Module) -> TokenSite | None:
    """transformers encoder models (BERT, Nyströmformer): X is the input of `encoder.layer[0]`,
    i.e. word + position (+ token type) embeddings after their LayerNorm and dropout."""
    emb, enc = getattr(m, "embeddings", None), getattr(m, "encoder", None)
    if emb is None or enc is None or not hasattr(emb, "word_embeddings") or not hasattr(enc, "layer"):
        return None
    return TokenSite(
        layout="hf_encoder",
        first_block=enc.layer[0],
        first_block_name=_join(name, "encoder.layer.0"),
        embed=emb.word_embeddings,
        embed_name=_join(name, "embeddings.word_embeddings"),
        num_prefix_tokens=0,
        blocks=[(_join(name, f"encoder.layer.{i}"), b) for i, b in enumerate(enc.layer)],
        mask_owner=m,
        mask_arg=("attention_mask", 1),
    )
