"""torch.nn.MultiheadAttention (also inside nn.TransformerEncoderLayer / DecoderLayer): SCA only.

The module holds W_Q, W_K, W_V as parameters it passes to F.multi_head_attention_forward itself: one packed
`in_proj_weight` (3E × E, rows [Q; K; V]) when query, key and value share the embedding size, else separate
`q_proj_weight` (E × E), `k_proj_weight` (E × kdim) and `v_proj_weight` (E × vdim). Each is a `called=False`
projection (sites.Projection) of the module itself, so SCA folds W + λI into that attribute for the duration of
the module's forward; a rectangular W_K / W_V gets the rectangular identity. The hooks SCA registers also turn off
nn.TransformerEncoderLayer's fused inference path (which would read the weights without calling this module).

No token layout: nn.TransformerEncoder is sequence-first by default and takes a padding mask with True marking
padding, so where X is and which rows are real depends on the user's model; CET on such a model needs the user's
own token layout (docs/getting-started.md, "Register a layout for your own model").

Expected PatchReport counts: one torch_mha attention site per nn.MultiheadAttention.
"""

from __future__ import annotations

from torch import nn

from ..sites import ROLES, AttentionSite, OutputProjection, Projection, attention_layout


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
