"""torch.nn.MultiheadAttention (also inside nn.TransformerEncoderLayer / DecoderLayer): SCA only.

The module holds W_Q, W_K, W_V as parameters it passes to F.multi_head_attention_forward itself: one packed
`in_proj_weight` (3E × E, rows [Q; K; V]) when query, key and value share the embedding size, else separate
`q_proj_weight` (E × E), `k_proj_weight` (E × kdim) and `v_proj_weight` (E × vdim). Each is a `called=False`
projection (sites.Projection) of the module itself, so SCA folds W + λI into that attribute for the duration of
the module's forward; a rectangular W_K / W_V gets the rectangular identity. The hooks SCA registers also turn off
nn.TransformerEncoderLayer's fused inference path (which would read the weights without calling this module).

Token layout `torch_encoder`: in an nn.TransformerEncoder X is the input of `layers[0]`, read per sample: (B, N, D)
with batch_first=True, (N, B, D) without (TokenSite.sequence_first). Its `src_key_padding_mask` (True at padding,
third positional) gives the padded rows, which CET leaves out. Positions, if any, are added by the caller before the
encoder, so position=before_pos_embed cannot be read here, and there are no prefix tokens it could know of
(tokens=patches_only is refused too). A causal mask passed at the call (`mask=`, `is_causal=True`) cannot be seen
when CET is applied: CET on such an encoder is the causal leak of a decoder.

Expected PatchReport counts: one torch_mha attention site per nn.MultiheadAttention.
"""

from __future__ import annotations

from torch import nn

from ..sites import ROLES, AttentionSite, OutputProjection, Projection, TokenSite, attention_layout, join, token_layout


@attention_layout("torch_mha")
def torch_mha(name: str, m: nn.Module) -> AttentionSite | None:
    """torch `nn.MultiheadAttention`: token softmax scaled by 1/sqrt(head_dim) (head_dim = embed_dim // num_heads)."""
    if not isinstance(m, nn.MultiheadAttention):
        return None
    e = m.embed_dim
    if m._qkv_same_embed_dim:
        proj = {r: Projection(m, slice(i * e, (i + 1) * e), param="in_proj_weight", called=False)
                for i, r in enumerate(ROLES)}
    else:
        proj = {r: Projection(m, slice(0, e), param=f"{r}_proj_weight", called=False) for r in ROLES}
    out = OutputProjection(m.out_proj, f"{name}.out_proj" if name else "out_proj", called=False,
                           how="read inside F.multi_head_attention_forward, never as a module call")
    return AttentionSite(name, m, "torch_mha", m.num_heads, m.head_dim, proj, out=out)


@token_layout("torch_encoder")
def torch_encoder(name: str, m: nn.Module) -> TokenSite | None:
    """torch `nn.TransformerEncoder`: X is the input of `layers.0` (module docstring)."""
    if not isinstance(m, nn.TransformerEncoder) or len(m.layers) == 0:
        return None
    first = m.layers[0]
    seq_first = not getattr(getattr(first, "self_attn", None), "batch_first", True)
    outside = "the caller adds positions (if any) before the encoder"
    return TokenSite("torch_encoder", first, join(name, "layers.0"), None, "", 0,
                     [(join(name, f"layers.{i}"), b) for i, b in enumerate(m.layers)], mask_owner=m,
                     mask_arg=("src_key_padding_mask", 2), mask_marks_padding=True, sequence_first=seq_first,
                     unknown={"position": f"{outside}, so the tokens before positions are not the encoder's to read",
                              "tokens": "nn.TransformerEncoder knows of no prefix (class) tokens"})
