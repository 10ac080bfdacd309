"""transformers GPT-2 (table 5): `GPT2Attention` with one fused `c_attn` Conv1D; tokens at the input of `h.0`.

Expected PatchReport counts: GPT-2 with n_layer blocks has n_layer hf_gpt2 attention sites (one fused `c_attn` each;
2 × n_layer with add_cross_attention) and one hf_gpt2 token site (the GPT2Model inside GPT2LMHeadModel).
"""

from __future__ import annotations

from torch import nn

from ..sites import ROLES, AttentionSite, Projection, TokenSite, attention_layout, join, of_library, token_layout


def _conv1d_as_linear(conv: nn.Module) -> nn.Module:
    """transformers' `Conv1D` computes x @ weight + bias with weight (in, out) and calls its sizes nx / nf. SCA's
    SpectralShift (spectral.py) reads nn.Linear's `in_features` / `out_features`, and a non-Linear module gets its
    λ·x output-add as a forward hook, which is exact for Conv1D's output columns. So the two sizes are given as plain
    int attributes: no parameter, buffer or state_dict change, forward untouched."""
    if not hasattr(conv, "in_features"):
        conv.in_features, conv.out_features = (int(n) for n in conv.weight.shape)
    return conv


@attention_layout("hf_gpt2")
def hf_gpt2(name: str, m: nn.Module) -> AttentionSite | None:
    """transformers `GPT2Attention`: one `c_attn` Conv1D (weight (D, 3D), the paper's W stored as is) whose output
    columns are [Q | K | V], each D = heads × head_dim wide, head-major; causal softmax over the tokens. SCA adds
    λI to each D × D block (x(W + λI) = xW + λx on those columns). Cross-attention (add_cross_attention=True) has
    its own `q_attn` Conv1D for W_Q and `c_attn` holding [K | V] (applied to the encoder states); it counts as an
    attention layer as well (our default: all self- and cross-attention)."""
    if not (hasattr(m, "c_attn") and of_library(m, "transformers")):  # no transformers import for others
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
    return AttentionSite(name, m, "hf_gpt2", m.num_heads, m.head_dim, proj)


@token_layout("hf_gpt2")
def hf_gpt2_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """transformers `GPT2Model` (inside GPT2LMHeadModel as `transformer`, the outermost match): X is the input of
    `h.0`, i.e. wte(ids) + wpe(positions) after the embedding dropout; before_pos_embed hooks `wte`'s output (every
    call of wte: also token_type_ids embeddings, which our tasks never pass). No prefix tokens. The GPT2Model's
    forward receives `attention_mask` (keyword from GPT2LMHeadModel, third positional otherwise), so CET excludes
    padded rows. Attention is causal; CET (as specified) excludes nothing else: every non-padded row of a sample
    enters one SVD, so the corrected row i depends on the later tokens of that sample (see tests/test_lm.py)."""
    if not (hasattr(m, "wte") and hasattr(m, "wpe") and hasattr(m, "h") and of_library(m, "transformers")):
        return None
    from transformers.models.gpt2.modeling_gpt2 import GPT2Model

    if not isinstance(m, GPT2Model) or len(m.h) == 0:
        return None
    return TokenSite(
        layout="hf_gpt2",
        first_block=m.h[0],
        first_block_name=join(name, "h.0"),
        embed=m.wte,
        embed_name=join(name, "wte"),
        num_prefix_tokens=0,
        blocks=[(join(name, f"h.{i}"), b) for i, b in enumerate(m.h)],
        mask_owner=m,
        mask_arg=("attention_mask", 2),
    )
