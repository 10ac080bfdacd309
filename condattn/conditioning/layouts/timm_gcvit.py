"""timm GCViT `WindowAttentionGlobal`: window attention whose `qkv` Linear holds all of W_Q, W_K, W_V in the local
blocks (use_global=False: block-stacked [Q; K; V], as Swin) and only W_K, W_V in the global ones (use_global=True:
`qkv` is Linear(dim, 2·dim), block-stacked [K; V]).

In a global block the queries are the stage's global query tokens (`q_global`: GlobalContext features of the whole
stage input, produced by `global_block` and shared by every window and block of the stage), not a projection of x:
the layer has no W_Q. One stated reading: SCA adds λI to each of W_Q, W_K, W_V that the layer has, so a global
site gets λI on W_K and W_V only. Its `proj` holds "k" and "v", `AttentionSite.missing` says why there is no "q",
and its PatchReport entry says so (`AttentionSite.note`). The other methods act on the roles it has
(conditioned_init, sigma_reparam) or on its output projection (ns_attention), or skip it in one line where they need
W_Q (qk_norm, mimetic_init); weight diagnostics of W_Q are absent with the reason; its attention entropy is the
module's own softmax(q_global·kᵀ + relative bias), read at `attn_drop`.

Expected PatchReport counts: one site per WindowAttentionGlobal, sum(depths) (gcvit_xxtiny: 12 timm_gcvit, the
odd-numbered block of each stage global: 6 with k/v only).
"""

from __future__ import annotations

from torch import nn

from ..sites import AttentionSite, Projection, attention_layout, is_class, stacked

NO_Q = ("its queries are the stage's global query tokens (q_global, GlobalContext features shared by every window), "
        "not a projection of x")
NOTE = "no W_Q (its queries are the stage's global query tokens, not a projection of x): W_K, W_V are all it has"


@attention_layout("timm_gcvit", priority=10)
def timm_gcvit(name: str, m: nn.Module) -> AttentionSite | None:
    if not is_class(m, "timm.models.gcvit", "WindowAttentionGlobal"):
        return None
    h, qkv = m.num_heads, m.qkv
    if not m.use_global:
        head_dim, proj = stacked(qkv, h)
        return AttentionSite(name, m, "timm_gcvit", h, head_dim, proj)
    dim = qkv.out_features // 2  # kv viewed (B, N, 2, heads, head_dim): [K; V]
    if dim * 2 != qkv.out_features or dim != h * m.head_dim:
        return None
    proj = {"k": Projection(qkv, slice(0, dim)), "v": Projection(qkv, slice(dim, 2 * dim))}
    return AttentionSite(name, m, "timm_gcvit", h, m.head_dim, proj, note=NOTE, missing={"q": NO_Q})
