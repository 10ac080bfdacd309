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

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

ROLES = ("q", "k", "v")


@dataclass
class Projection:
    linear: nn.Linear  # or any module computing x @ W + b whose output columns hold the role (Conv1D: see transposed)
    cols: slice  # output columns of `linear` that hold this role, all heads, head-major
    # True when `linear.weight` is stored (in, out), i.e. already the paper's W, instead of torch Linear's (out, in):
    # transformers' `Conv1D` (GPT-2). AttentionSite.weight/.grad transpose it back to the torch layout they return.
    transposed: bool = False


@dataclass
class AttentionSite:
    name: str
    module: nn.Module
    layout: str
    num_heads: int
    head_dim: int
    proj: dict[str, Projection]
    # vision zoo additions (defaults = every earlier layout): what the site's attention matrix is
    attends_over: str = "tokens"  # "tokens" (N×N softmax) | "channels" (d_h×d_h per head: XCiT XCA, DaViT channel)
    queries: str = "all"  # "all" tokens query | "first": only token 0 (class attention)
    # detection additions (defaults = every earlier layout)
    group: str | None = None  # attention kind, for options selecting kinds (DETR: encoder|decoder_self|decoder_cross)
    masked_queries: bool = True  # the model's padding mask (B, N) applies to this site's queries / outputs
    masked_keys: bool = True  # ... and to its keys (DETR: decoder queries are never padded, cross-attention keys are)

    def weight(self, role: str, effective: bool = True) -> torch.Tensor:
        """torch-layout weight (heads*head_dim, D_in) of one role; `effective` includes an SCA shift (W + λI)."""
        p = self.proj[role]
        w = p.linear.weight.detach()
        if p.transposed:  # Conv1D stores (in, out): back to torch layout, where delta_weight() lives
            w = w.T
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
        if g is not None and p.transposed:
            g = g.T
        return None if g is None else g[p.cols]


@dataclass
class TokenSite:
    layout: str
    first_block: nn.Module
    first_block_name: str
    embed: nn.Module | None  # its output = token embeddings before positions are added; None: the model adds no
    #                          positions to its tokens (DETR), so before_pos_embed hooks the first block's input too
    embed_name: str
    num_prefix_tokens: int  # CLS / register tokens at the front of the first block's input
    blocks: list[tuple[str, nn.Module]]  # all transformer blocks in order (diagnostics: κ of each input)
    mask_owner: nn.Module | None = None  # forward receives the padding mask
    mask_arg: tuple[str, int] | None = None  # (kwarg name, positional index) of that mask
    channels_first: bool = False  # blocks receive (B, C, H, W) maps (DaViT): X = x.flatten(2).transpose(1, 2)


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


# ---------------------------------------------------------------- vision zoo: Swin, XCiT, DaViT (timm, pinned)
#
# Expected PatchReport counts follow from each architecture's definition (asserted in tests/test_vision_zoo.py):
#   ViT / DeiT: `depth` timm_fused_qkv            Swin: sum(depths) timm_swin_window
#   XCiT: `depth` timm_xca + `cls_attn_layers` timm_class_attn
#   DaViT: sum(depths) timm_davit_window + sum(depths) timm_davit_channel (one spatial and one channel
#          attention per dual block)
#
# AttentionSite.attends_over / .queries (fields above) tell consumers such as the entropy probe what a site's
# attention matrix is; the SCA patch itself is the same for every site (x(W + λI)ᵀ on the projection's columns).


def _site(name: str, m: nn.Module, layout: str, heads: int, head_dim: int, proj: dict[str, Projection],
          attends_over: str = "tokens", queries: str = "all") -> AttentionSite:
    return AttentionSite(name, m, layout, heads, head_dim, proj, attends_over, queries)


def _stacked(lin: nn.Linear, heads: int, order: tuple[int, int, int] = (0, 1, 2)) -> tuple[int, dict[str, Projection]]:
    """Roles of a fused Linear whose output is block-stacked in three equal chunks; `order[i]` is the chunk that
    plays role ROLES[i]. Returns (head_dim, projections)."""
    a = lin.out_features // 3
    if a * 3 != lin.out_features or a % heads:
        raise ValueError(f"fused qkv with {lin.out_features} outputs does not split into 3 × {heads} heads")
    return a // heads, {r: Projection(lin, slice(order[i] * a, (order[i] + 1) * a)) for i, r in enumerate(ROLES)}


@attention_layout("timm_swin_window")
def _timm_swin_window(name: str, m: nn.Module) -> AttentionSite | None:
    """timm Swin `WindowAttention`: one fused `qkv` (block-stacked [Q; K; V]) applied to each window's tokens
    (B·nW, window_area, C); softmax over the window with a learned relative position bias (and the shift mask)
    added to the logits. SCA adds λI to W_Q/W_K/W_V exactly as for ViT; the bias is untouched."""
    from timm.models.swin_transformer import WindowAttention

    if type(m) is not WindowAttention:
        return None
    head_dim, proj = _stacked(m.qkv, m.num_heads)
    return _site(name, m, "timm_swin_window", m.num_heads, head_dim, proj)


@attention_layout("timm_xca")
def _timm_xca(name: str, m: nn.Module) -> AttentionSite | None:
    """timm XCiT `XCA` (cross-covariance attention): fused `qkv`, block-stacked [Q; K; V]. Per head, q and k
    (N × d_h) are L2-normalised along the token axis and the attention is softmax(τ · q̂ᵀ k̂) over a d_h × d_h
    channel matrix, with τ a learned per-head temperature; the output is v · Aᵀ (channels mixed, tokens kept).

    What SCA means here: W_Q, W_K, W_V still become W + λI (so κ(W + λI) ≤ (λ + σ_max)/(λ − σ_max) as for token
    attention, and V's conditioning is unchanged in meaning). But the L2 normalisation removes the λ² growth of
    the logits that saturates token softmax: with large λ, q̂ and k̂ tend to the normalised input channels x̂_c,
    so q̂ᵀk̂ tends to the channel-correlation (cosine) matrix of X within each head, bounded by |τ|. The softmax
    cannot go one-hot through λ; SCA instead pulls XCA's attention towards the input's own channel correlations.
    """
    from timm.models.xcit import XCA

    if type(m) is not XCA:
        return None
    head_dim, proj = _stacked(m.qkv, m.num_heads)
    return _site(name, m, "timm_xca", m.num_heads, head_dim, proj, attends_over="channels")


@attention_layout("timm_class_attn")
def _timm_class_attn(name: str, m: nn.Module) -> AttentionSite | None:
    """timm CaiT/XCiT `ClassAttn` (XCiT's class-attention layers): separate `q`, `k`, `v` Linears; only the class
    token queries (q = W_Q applied to x[:, 0]), keys and values come from all tokens; ordinary token softmax.

    Decision: these layers COUNT as attention layers for SCA. They are softmax attention with their own
    W_Q, W_K, W_V, and the SCA paper adds λI to "every attention layer"; so XCiT-M has 24 XCA + 2 class-attention
    sites. The papers do not say whether their XCiT runs conditioned them; `conditioning.targets` and this
    decision are recorded in every PatchReport (kind `spectral:timm_class_attn`)."""
    from timm.models.cait import ClassAttn

    if type(m) is not ClassAttn:
        return None
    heads = m.num_heads
    proj = {r: Projection(lin, slice(0, lin.out_features)) for r, lin in zip(ROLES, (m.q, m.k, m.v))}
    return _site(name, m, "timm_class_attn", heads, m.q.out_features // heads, proj, queries="first")


@attention_layout("timm_davit_window")
def _timm_davit_window(name: str, m: nn.Module) -> AttentionSite | None:
    """timm DaViT spatial `WindowAttention`: fused `qkv`, block-stacked [Q; K; V], softmax over each window's
    tokens (no relative position bias; DaViT's positions come from the depthwise-conv ConvPosEnc)."""
    from timm.models.davit import WindowAttention

    if type(m) is not WindowAttention:
        return None
    head_dim, proj = _stacked(m.qkv, m.num_heads)
    return _site(name, m, "timm_davit_window", m.num_heads, head_dim, proj)


@attention_layout("timm_davit_channel")
def _timm_davit_channel(name: str, m: nn.Module) -> AttentionSite | None:
    """timm DaViT `ChannelAttention` (and `ChannelAttentionV2`): fused `qkv`, block-stacked in three chunks, with
    per-head attention over the d_h × d_h channel matrix (no normalisation, fixed scale).

    Roles are assigned by what each chunk does in the attention formula, not by the variable names: timm's (and
    the official DaViT code's) `ChannelAttention` computes softmax((k·scale)ᵀ v) and aggregates q, so there
    chunk 1 ("k") plays the query, chunk 2 ("v") the key and chunk 0 ("q") the value. `ChannelAttentionV2`
    computes softmax(qᵀ k) and aggregates v (chunks in order). With the default targets [q, k, v] both readings
    patch the same three blocks; they differ only for a subset such as targets=[v]."""
    from timm.models.davit import ChannelAttention, ChannelAttentionV2

    if type(m) is ChannelAttention:
        head_dim, proj = _stacked(m.qkv, m.num_heads, order=(1, 2, 0))
        return _site(name, m, "timm_davit_channel", m.num_heads, head_dim, proj, attends_over="channels")
    if type(m) is ChannelAttentionV2:
        head_dim, proj = _stacked(m.qkv, m.groups)
        return _site(name, m, "timm_davit_channel", m.groups, head_dim, proj, attends_over="channels")
    return None


# ---------------------------------------------------------------- vision zoo: token layouts
#
# TokenSite.channels_first (field above): True when the blocks receive (B, C, H, W) feature maps (DaViT), so X
# is the (H·W) × C matrix x.flatten(2).transpose(1, 2), not x.reshape(B, -1, W).


def _token_layout_first(name: str):
    """Like `token_layout`, but the finder is tried before the generic ones already registered (a specific
    architecture must win over `timm_vit`, which also matches XCiT's attribute names)."""

    def deco(fn: TokenFinder) -> TokenFinder:
        rest = dict(TOKEN_LAYOUTS)
        TOKEN_LAYOUTS.clear()
        TOKEN_LAYOUTS[name] = fn
        TOKEN_LAYOUTS.update({k: v for k, v in rest.items() if k != name})
        return fn

    return deco


@token_layout("timm_swin")
def _timm_swin(name: str, m: nn.Module) -> TokenSite | None:
    """timm Swin: X is the input of `layers[0].blocks[0]`, the patch embedding after its LayerNorm, laid out
    B × H × W × C (CET flattens it to (H·W) × C). Swin v1 has no absolute position embedding (positions enter
    as a relative bias inside each window attention), so after_pos_embed and before_pos_embed see the same X."""
    from timm.models.swin_transformer import SwinTransformer

    if type(m) is not SwinTransformer:
        return None
    blocks = [(_join(name, f"layers.{i}.blocks.{j}"), b) for i, st in enumerate(m.layers)
              for j, b in enumerate(st.blocks)]
    return TokenSite(
        layout="timm_swin",
        first_block=m.layers[0].blocks[0],
        first_block_name=blocks[0][0],
        embed=m.patch_embed,
        embed_name=_join(name, "patch_embed"),
        num_prefix_tokens=0,
        blocks=blocks,
    )


@_token_layout_first("timm_xcit")
def _timm_xcit(name: str, m: nn.Module) -> TokenSite | None:
    """timm XCiT: X is the input of `blocks[0]`: the convolutional patch embedding plus the Fourier positional
    encoding (after pos_drop). The class token is only prepended later, before the class-attention layers, so
    X has no prefix tokens (the model's own `num_prefix_tokens` = 1 describes the class-attention stage).
    `blocks` lists the XCA blocks and then the class-attention blocks (whose input includes the class token).
    Only position=after_pos_embed applies: XCiT's patch embedding returns a tuple (tokens, (Hp, Wp))."""
    from timm.models.xcit import Xcit

    if type(m) is not Xcit:
        return None
    blocks = [(_join(name, f"blocks.{i}"), b) for i, b in enumerate(m.blocks)]
    blocks += [(_join(name, f"cls_attn_blocks.{i}"), b) for i, b in enumerate(m.cls_attn_blocks or [])]
    return TokenSite(
        layout="timm_xcit",
        first_block=m.blocks[0],
        first_block_name=blocks[0][0],
        embed=m.patch_embed,
        embed_name=_join(name, "patch_embed"),
        num_prefix_tokens=0,
        blocks=blocks,
    )


@functools.cache
def channels_first_supported() -> bool:
    """Whether the consumers of a TokenSite read `TokenSite.channels_first`: CET's hook (checked by running it on a
    (1, C, H, W) tensor against the correction of its (H·W) × C matrix) and the κ(X) probe of diagnostics
    (`as_tokens(x, channels_first=...)`). Until both do, a (B, C, H, W) block input would be read as the
    (C·H) × W matrix, so the DaViT token finder returns None (CET refuses DaViT, diagnostics skip κ(X)) instead
    of computing something silently wrong."""
    import inspect

    from ..diagnostics import _util
    from .embedded import EmbeddedTokens, polar_correction

    if "channels_first" not in inspect.signature(_util.as_tokens).parameters:
        return False
    x = torch.randn(1, 6, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    site = TokenSite("probe", nn.Identity(), "probe", nn.Identity(), "probe", 0, [], channels_first=True)
    try:
        got = EmbeddedTokens(site, "after_pos_embed", "all").correct(x)
    except Exception:
        return False
    want = polar_correction(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(x.shape)
    return bool(torch.allclose(got, want))


@token_layout("timm_davit")
def _timm_davit(name: str, m: nn.Module) -> TokenSite | None:
    """timm DaViT: X is the input of the first dual block, `stages[0].blocks[0]`: the conv stem's output after
    its LayerNorm2d, laid out (B, C, H, W) (channels first). DaViT has no position embedding before the blocks:
    each block starts with a depthwise-conv positional encoding (ConvPosEnc) inside it, so after_pos_embed and
    before_pos_embed (the stem output) are the same X. Returns None while `channels_first_supported()` is False.
    """
    from timm.models.davit import DaVit

    if type(m) is not DaVit or not channels_first_supported():
        return None
    blocks = [(_join(name, f"stages.{i}.blocks.{j}"), b) for i, st in enumerate(m.stages)
              for j, b in enumerate(st.blocks)]
    site = TokenSite(
        layout="timm_davit",
        first_block=m.stages[0].blocks[0],
        first_block_name=blocks[0][0],
        embed=m.stem,
        embed_name=_join(name, "stem"),
        num_prefix_tokens=0,
        blocks=blocks,
    )
    site.channels_first = True
    return site


# ---------------------------------------------------------------- GPT-2 (transformers), table 5
#
# Expected PatchReport counts: GPT-2 with n_layer blocks has n_layer hf_gpt2 attention sites (one fused `c_attn` each;
# 2 × n_layer with add_cross_attention) and one hf_gpt2 token site (the GPT2Model inside GPT2LMHeadModel).


def _conv1d_as_linear(conv: nn.Module) -> nn.Module:
    """transformers' `Conv1D` computes x @ weight + bias with weight (in, out) and calls its sizes nx / nf. SCA's
    SpectralShift (spectral.py) reads nn.Linear's `in_features` / `out_features`, and a non-Linear module gets its
    λ·x output-add as a forward hook, which is exact for Conv1D's output columns. So the two sizes are given as plain
    int attributes: no parameter, buffer or state_dict change, forward untouched."""
    if not hasattr(conv, "in_features"):
        conv.in_features, conv.out_features = (int(n) for n in conv.weight.shape)
    return conv


@attention_layout("hf_gpt2")
def _hf_gpt2(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers `GPT2Attention`: one `c_attn` Conv1D (weight (D, 3D), the paper's W stored as is) whose output
    columns are [Q | K | V], each D = heads × head_dim wide, head-major; causal softmax over the tokens. SCA adds
    λI to each D × D block (x(W + λI) = xW + λx on those columns). Cross-attention (add_cross_attention=True) has
    its own `q_attn` Conv1D for W_Q and `c_attn` holding [K | V] (applied to the encoder states); it counts as an
    attention layer as well (METHODS.md: all self- and cross-attention by default)."""
    if not hasattr(m, "c_attn"):  # cheap test first: no transformers import for other models
        return None
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    if not isinstance(m, GPT2Attention):
        return None
    d = m.embed_dim
    c_attn = _conv1d_as_linear(m.c_attn)
    if m.is_cross_attention:
        proj = {"q": Projection(_conv1d_as_linear(m.q_attn), slice(0, d), transposed=True),
                "k": Projection(c_attn, slice(0, d), transposed=True),
                "v": Projection(c_attn, slice(d, 2 * d), transposed=True)}
    else:
        proj = {r: Projection(c_attn, slice(i * d, (i + 1) * d), transposed=True) for i, r in enumerate(ROLES)}
    return _site(name, m, "hf_gpt2", m.num_heads, m.head_dim, proj)


@token_layout("hf_gpt2")
def _hf_gpt2_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """transformers `GPT2Model` (inside GPT2LMHeadModel as `transformer`, the outermost match): X is the input of
    `h.0`, i.e. wte(ids) + wpe(positions) after the embedding dropout; before_pos_embed hooks `wte`'s output (every
    call of wte: also token_type_ids embeddings, which our tasks never pass). No prefix tokens. The GPT2Model's
    forward receives `attention_mask` (keyword from GPT2LMHeadModel, third positional otherwise), so CET excludes
    padded rows. Attention is causal; CET (as specified) excludes nothing else: every non-padded row of a sample
    enters one SVD, so the corrected row i depends on the later tokens of that sample (see tests/test_lm.py)."""
    if not (hasattr(m, "wte") and hasattr(m, "wpe") and hasattr(m, "h")):
        return None
    from transformers.models.gpt2.modeling_gpt2 import GPT2Model

    if not isinstance(m, GPT2Model) or len(m.h) == 0:
        return None
    return TokenSite(
        layout="hf_gpt2",
        first_block=m.h[0],
        first_block_name=_join(name, "h.0"),
        embed=m.wte,
        embed_name=_join(name, "wte"),
        num_prefix_tokens=0,
        blocks=[(_join(name, f"h.{i}"), b) for i, b in enumerate(m.h)],
        mask_owner=m,
        mask_arg=("attention_mask", 2),
    )


# ---------------------------------------------------------------- crammed BERT (ours, condattn/models/crammed_bert.py)
#
# Expected PatchReport counts: a crammed BERT of `num_layers` blocks has num_layers crammed_bert attention sites (one
# fused `qkv` each) and one crammed_bert token site (its CrammedBertEncoder).


@attention_layout("crammed_bert")
def _crammed_bert_attention(name: str, m: nn.Module) -> AttentionSite | None:
    """Our `CrammedSelfAttention`: one bias-free `qkv` Linear, block-stacked [Q; K; V] (each D = heads × head_dim,
    head-major), softmax over the tokens. SCA adds λI to each D × D block exactly as for timm's ViT. (cramming's own
    module interleaves the three per head; ours is the block-stacked reparametrisation, see the model's docstring.)"""
    if not hasattr(m, "qkv"):  # cheap test first
        return None
    from ..models.crammed_bert import CrammedSelfAttention

    if type(m) is not CrammedSelfAttention:
        return None
    head_dim, proj = _stacked(m.qkv, m.num_heads)
    return _site(name, m, "crammed_bert", m.num_heads, head_dim, proj)


@token_layout("crammed_bert")
def _crammed_bert_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """Our `CrammedBertEncoder` (inside CrammedBertForMLM as `encoder`): X is the input of `layers.0`, i.e. word +
    scaled-sinusoidal position embeddings after the embedding LayerNorm (and its dropout); before_pos_embed hooks the
    word embedding's output. No prefix tokens (packed MLM blocks carry no per-sample [CLS]). The encoder's forward
    receives `attention_mask` (keyword, or second positional), so CET excludes padded rows."""
    if not (hasattr(m, "layers") and hasattr(m, "embedding")):
        return None
    from ..models.crammed_bert import CrammedBertEncoder

    if type(m) is not CrammedBertEncoder or len(m.layers) == 0:
        return None
    return TokenSite(
        layout="crammed_bert",
        first_block=m.layers[0],
        first_block_name=_join(name, "layers.0"),
        embed=m.embedding.word_embedding,
        embed_name=_join(name, "embedding.word_embedding"),
        num_prefix_tokens=0,
        blocks=[(_join(name, f"layers.{i}"), b) for i, b in enumerate(m.layers)],
        mask_owner=m,
        mask_arg=("attention_mask", 1),
    )


# ---------------------------------------------------------------- DETR (transformers), table 7
#
# Expected PatchReport counts: a DETR with E encoder and D decoder layers has E + 2·D hf_detr attention sites (encoder
# self-attention, decoder self-attention, decoder cross-attention: METHODS.md's default "all self- and cross-attention")
# and one hf_detr token site (the encoder's input). `conditioning.detr_attention` selects the kinds SCA patches; the
# others are listed as skipped in the PatchReport, and patched + skipped must equal the model config's attention_layers.

DETR_ATTENTION = ("encoder", "decoder_self", "decoder_cross")


@attention_layout("hf_detr")
def _hf_detr(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers `DetrSelfAttention` / `DetrCrossAttention`: separate `q_proj`, `k_proj`, `v_proj` Linears (D × D,
    heads head-major), token softmax with scaling head_dim^-0.5. DETR adds its position embeddings to the inputs of
    q_proj and k_proj (not v_proj), so under SCA the λ·x that W + λI adds includes those positions, as W_Q acts on
    them. Kind (`group`) by place: self-attention under `encoder` or `decoder`, cross-attention (queries from the
    decoder, keys/values from the encoder memory) in the decoder. The encoder's padding mask applies to encoder
    queries and keys and to cross-attention keys; decoder queries (object queries) are never padded."""
    if not hasattr(m, "q_proj"):  # cheap test first: no transformers import for other models
        return None
    from transformers.models.detr.modeling_detr import DetrCrossAttention, DetrSelfAttention

    if type(m) is DetrCrossAttention:
        group, masked_q, masked_k = "decoder_cross", False, True
    elif type(m) is DetrSelfAttention:
        decoder = "decoder" in name.split(".")
        group, masked_q, masked_k = ("decoder_self", False, False) if decoder else ("encoder", True, True)
    else:
        return None
    heads = m.q_proj.out_features // m.head_dim
    proj = {r: Projection(lin, slice(0, lin.out_features)) for r, lin in zip(ROLES, (m.q_proj, m.k_proj, m.v_proj))}
    site = _site(name, m, "hf_detr", heads, m.head_dim, proj)
    site.group, site.masked_queries, site.masked_keys = group, masked_q, masked_k
    return site


@token_layout("hf_detr")
def _hf_detr_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """transformers `DetrModel` (inside DetrForObjectDetection as `model`): X is the input of `encoder.layers.0`, the
    backbone's last feature map after the 1×1 `input_projection`, flattened to (H·W) × d_model (after the encoder's
    input dropout). DETR adds its sine positions to q and k inside every attention layer, never to the tokens, so
    before_pos_embed is the same X (`embed` None: both hook the first layer's input). No prefix tokens. The encoder's
    forward receives the flattened pixel mask as `attention_mask` (B, H·W), so CET excludes padded positions; only the
    encoder layers are listed as blocks (the decoder's inputs are object queries, not image tokens)."""
    if not (hasattr(m, "encoder") and hasattr(m, "input_projection") and hasattr(m, "query_position_embeddings")):
        return None
    from transformers.models.detr.modeling_detr import DetrModel

    if not isinstance(m, DetrModel) or len(m.encoder.layers) == 0:
        return None
    first = _join(name, "encoder.layers.0")
    return TokenSite(
        layout="hf_detr",
        first_block=m.encoder.layers[0],
        first_block_name=first,
        embed=None,
        embed_name=f"{first} input",
        num_prefix_tokens=0,
        blocks=[(_join(name, f"encoder.layers.{i}"), b) for i, b in enumerate(m.encoder.layers)],
        mask_owner=m.encoder,
        mask_arg=("attention_mask", 1),
    )
