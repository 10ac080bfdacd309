"""Attention recognised by structure, not by class: the fallback layout (priority -100, after every named one).

A module is an attention site when it holds its W_Q, W_K, W_V as Linear children under common names and says how
many heads it has:
- separate q / k / v: (q, k, v), (query, key, value), (q_proj, k_proj, v_proj), (to_q, to_k, to_v), (wq, wk, wv),
  (q_lin, k_lin, v_lin), (query_proj, key_proj, value_proj), (linear_q, linear_k, linear_v);
- q and a fused [K; V]: (q, kv), (to_q, to_kv), (q_proj, kv_proj); a fused [Q; K] and v: (qk, v);
- one fused Linear (qkv, c_attn, Wqkv, qkv_proj, to_qkv, W_pack): block-stacked [Q; K; V] (K, V with fewer heads
  under grouped-query attention), or interleaved per head [q_h; k_h; v_h] for `query_key_value` (GPT-NeoX, BLOOM)
  and for modules with `key_dim` / `val_dim` (timm TinyViT, EfficientFormer: per-head split [key, key, val]);
  Falcon's `query_key_value` follows its config (multi-query: [Q; k; v]; new architecture: per k/v group);
- the head count from the module (num_heads, num_attention_heads, n_head, n_heads, heads, ...) or its `config`; where
  neither names one, by recomputation (traced.find_heads: the divisor of W_Q's width whose attention reproduces the
  module's). Where none or several do, the site is kept with `heads_unknown` saying why: SCA (λI over whole weights)
  and softcap patch it, the methods that need heads refuse it in one line.

Structure cannot tell a fused [Q; K; V] from a per-head interleave of equal widths: the names above decide, and a
module whose forward differs needs a named layout (`attention_layout`). A projection may be a pointwise
convolution (nn.Conv1d / nn.Conv2d, kernel 1, groups 1: W is its weight's (out, in) view, folded as for a Linear),
the last module of an nn.Sequential (pooling / depthwise conv / norm before it shape its input, as a pre-norm does),
or a Linear in a clamping wrapper (`linear`). Other convolutions and Linear/Conv + BatchNorm are refused in one line
(BN∘W depends on batch statistics in training: no fixed W to add λI to; layouts/timm_bn.py states a reading, λI
on W before its BatchNorm, for LeViT and EfficientFormer-V2 by name); the reason is what `require_attention` prints.
Classes in sites.REFUSED (layouts/refused.py: no q·kᵀ, cascaded heads) are never matched here. Modules with q/v
biases read their fused weight themselves (timm Swin-V2): `called=False`, folded.

Expected PatchReport counts: every attention layer the named layouts leave, as `spectral:structural`.
"""

from __future__ import annotations

from torch import nn

from ..forms import CROSS_COVARIANCE
from ..sites import (
    HEADS,
    ROLES,
    UNSUPPORTED_WHY,
    AttentionSite,
    Projection,
    attention_layout,
    interleaved,
    is_pointwise_conv,
    out_features,
    refusal,
    separate,
)
from .gpt2 import _conv1d_as_linear

SEPARATE = (("q", "k", "v"), ("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("to_q", "to_k", "to_v"),
            ("wq", "wk", "wv"), ("q_lin", "k_lin", "v_lin"), ("query_proj", "key_proj", "value_proj"),
            ("linear_q", "linear_k", "linear_v"))
Q_KV = (("q", "kv"), ("to_q", "to_kv"), ("q_proj", "kv_proj"))
QK_V = (("qk", "v"),)
FUSED = ("qkv", "c_attn", "Wqkv", "qkv_proj", "to_qkv", "W_pack")
INTERLEAVED = ("query_key_value",)
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_kv")
HEAD_DIM = ("head_dim", "attention_head_size", "head_size", "d_head", "key_value_proj_dim", "dim_head")


def _int(obj, names) -> int | None:
    for a in names:
        v = getattr(obj, a, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _heads(m: nn.Module) -> tuple[int | None, int | None]:
    cfg = getattr(m, "config", None)
    heads = _int(m, HEADS) or (cfg is not None and _int(cfg, ("num_attention_heads", "n_head", "num_heads"))) or None
    kv = _int(m, KV_HEADS) or (cfg is not None and _int(cfg, ("num_key_value_heads",))) or None
    groups = _int(m, ("num_key_value_groups",))
    if kv is None and heads and groups:
        kv = heads // groups
    return heads, kv


def _projection(m: nn.Module, name: str) -> tuple[nn.Module | None, str]:
    """(the child as a Linear-like projection, or None with the reason it cannot be one)."""
    c = getattr(m, name, None)
    if isinstance(c, nn.Linear) or is_pointwise_conv(c):  # a 1×1 convolution: W is its weight's (out, in) view
        return c, ""
    if type(c).__name__ == "Conv1D" and hasattr(c, "nf"):  # transformers' Conv1D, weight (in, out)
        return _conv1d_as_linear(c), ""
    if isinstance(c, nn.modules.conv._ConvNd):
        return None, (f"its projection `{name}` is a {type(c).__name__} with kernel {tuple(c.kernel_size)}, groups "
                      f"{c.groups}: only pointwise convolutions (kernel 1, groups 1) act as W on each token")
    if isinstance(c, nn.Sequential) and len(c) and (isinstance(c[-1], nn.Linear) or is_pointwise_conv(c[-1])):
        return c[-1], ""  # pooling / depthwise conv / norm before the projection shape its input, as a pre-norm does
    if isinstance(c, nn.Module) and set(c._modules) == {"linear"} and isinstance(c.linear, nn.Linear) and \
            not c._parameters:  # a Linear wrapped with input/output clamps (timm Gemma4ClippableLinear)
        return c.linear, ""
    if isinstance(c, nn.Module) and any(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in c.modules()):
        return None, (f"its projection `{name}` is a {type(c).__name__} (Linear/Conv followed by BatchNorm): q/k/v "
                      "are BN(W x), and BatchNorm in training scales each channel by batch statistics, so BN∘W is no "
                      "fixed matrix to add λI to (and λI inside W is rescaled by the norm)")
    return None, ""


def _rows(lin: nn.Module, widths: tuple[int, int, int]) -> dict[str, Projection]:
    starts = [0, widths[0], widths[0] + widths[1]]
    return {r: Projection(lin, slice(s, s + w)) for r, s, w in zip(ROLES, starts, widths)}


def _fused(m: nn.Module, name: str, lin: nn.Module, heads: int, kv: int | None) -> tuple[int, dict] | str:
    out = out_features(lin)
    key_dim, val_dim = _int(m, ("key_dim",)), _int(m, ("val_dim", "d"))
    cfg = getattr(m, "config", None)
    if name == "query_key_value" and cfg is not None and hasattr(cfg, "new_decoder_architecture"):  # Falcon
        d = out // (heads + 2 * (kv or 1)) if cfg.new_decoder_architecture or cfg.multi_query else out // (3 * heads)
        if cfg.new_decoder_architecture:
            return "Falcon's new decoder architecture interleaves q per k/v group: not supported"
        if cfg.multi_query:
            return d, _rows(lin, (heads * d, d, d))
        return interleaved(lin, heads)
    if name in INTERLEAVED or (key_dim and val_dim and out == heads * (2 * key_dim + val_dim)):
        widths = (key_dim, key_dim, val_dim) if key_dim and val_dim else None
        if out % heads or (widths is None and (out // heads) % 3):
            return f"its fused `{name}` ({out} outputs) does not interleave {heads} heads"
        return interleaved(lin, heads, widths)
    hd = _int(m, HEAD_DIM)
    if kv and kv != heads:  # grouped-query: [Q (heads·d); K (kv·d); V (kv·d)]
        d = hd or out // (heads + 2 * kv)
        if d * (heads + 2 * kv) == out:
            return d, _rows(lin, (heads * d, kv * d, kv * d))
    if out % 3 or (out // 3) % heads:
        return f"its fused `{name}` ({out} outputs) does not split into 3 × {heads} heads"
    a = out // 3
    return a // heads, _rows(lin, (a, a, a))


def _match(m: nn.Module) -> tuple[int, int, dict] | str | None:
    """(heads, head_dim, projections), a reason it cannot be patched, or None when it does not look like attention."""
    names = set(dict(m.named_children()))
    heads, kv = _heads(m)
    layouts = [("sep", g) for g in SEPARATE if set(g) <= names] + [("q_kv", g) for g in Q_KV if set(g) <= names] + \
        [("qk_v", g) for g in QK_V if set(g) <= names] + [("fused", (n,)) for n in FUSED + INTERLEAVED if n in names]
    if not layouts:
        return None
    kind, group = layouts[0]
    lins = []
    for n in group:
        lin, why = _projection(m, n)
        if lin is None:
            return why or None
        lins.append(lin)
    if not heads:
        return _unnamed_heads(m, kind, lins)
    if kind == "fused":
        res = _fused(m, group[0], lins[0], heads, kv)
        if isinstance(res, str):
            return res
        head_dim, proj = res
    elif kind == "sep":
        proj = separate(tuple(lins))
        head_dim = _int(m, HEAD_DIM) or out_features(lins[0]) // heads
    else:
        proj = _paired(kind, lins)
        head_dim = _int(m, HEAD_DIM) or proj["q"].out_features // heads
    if proj["q"].out_features != heads * head_dim or any(p.out_features % head_dim for p in proj.values()):
        return f"its W_Q has {proj['q'].out_features} outputs, not {heads} heads × {head_dim}"
    return heads, head_dim, proj


def _paired(kind: str, lins: list) -> dict[str, Projection]:
    """The roles of a q + fused kv pair ("q_kv") or a fused qk + v pair: the fused Linear's two halves, the other
    Linear whole."""
    two, one = (lins[1], lins[0]) if kind == "q_kv" else (lins[0], lins[1])
    half = out_features(two) // 2
    pair = {"k": Projection(two, slice(0, half)), "v": Projection(two, slice(half, 2 * half))} if kind == "q_kv" \
        else {"q": Projection(two, slice(0, half)), "k": Projection(two, slice(half, 2 * half))}
    proj = {**pair, ("q" if kind == "q_kv" else "v"): Projection(one, slice(0, out_features(one)))}
    return {r: proj[r] for r in ROLES}


def _unnamed_heads(m: nn.Module, kind: str, lins: list) -> tuple[int, int, dict, str] | str:
    """A module that names no head count: its split read with one head (a fused projection only as block-stacked
    [Q; K; V], where the split does not depend on the head count), then the head count found by recomputation
    (traced.find_heads). (heads, head_dim, projections, how) — heads 1 and the reason in `how` when none is found."""
    if kind == "fused":
        out = out_features(lins[0])
        if out % 3:
            return f"no head count on the module ({', '.join(HEADS)}) or its config, and its fused projection does " \
                   f"not split into three equal [Q; K; V] blocks ({out} outputs)"
        proj = _rows(lins[0], (out // 3,) * 3)
    elif kind == "sep":
        proj = separate(tuple(lins))
    else:
        proj = _paired(kind, lins)
    width = proj["q"].out_features
    probe = AttentionSite("", m, "structural", 1, width, proj)
    heads, how = _find_heads(probe)
    if heads is None:
        return 1, width, proj, how
    return heads, width // heads, proj, how


_HEADS_CACHE: dict[tuple, tuple[int | None, str]] = {}


def _find_heads(site: AttentionSite) -> tuple[int | None, str]:
    """traced.find_heads, once per class and parameter shapes (the answer is a fact of the structure)."""
    from ..traced import find_heads  # (imports verify.py, which imports the sites this module registers into)

    ints = tuple(sorted((k, v) for k, v in vars(site.module).items() if type(v) is int))  # (a head count in `h`)
    key = (type(site.module), tuple((n, tuple(p.shape)) for n, p in site.module.named_parameters()), ints)
    if key not in _HEADS_CACHE:
        _HEADS_CACHE[key] = find_heads(site)
    return _HEADS_CACHE[key]


@attention_layout("structural", priority=-100)
def structural(name: str, m: nn.Module) -> AttentionSite | None:
    """Any module whose children hold W_Q, W_K, W_V under common names, with a head count (module docstring)."""
    if isinstance(m, (nn.Linear, nn.MultiheadAttention)) or not any(True for _ in m.children()) or refusal(m):
        return None
    res = _match(m)
    if res is None:
        return None
    if isinstance(res, str):
        UNSUPPORTED_WHY[type(m)] = res
        return None
    heads, head_dim, proj, how = res if len(res) == 4 else (*res, "")
    reads = getattr(m, "q_bias", None) is not None or getattr(m, "v_bias", None) is not None  # F.linear(x, qkv.weight)
    proj = {r: Projection(p.linear, p.cols, transposed=type(p.linear).__name__ == "Conv1D", called=not reads)
            for r, p in proj.items()}
    if hasattr(m, "temperature") and hasattr(m, "qkv"):  # cross-covariance attention (XCiT-like, EdgeNeXt)
        return AttentionSite(name, m, "structural", heads, head_dim, proj, attends_over="channels",
                             form=CROSS_COVARIANCE)
    found = how if how and "found by recomputation" in how else ""
    unknown = how if how and not found else ""
    return AttentionSite(name, m, "structural", heads, head_dim, proj, note=found, heads_found=found,
                         heads_unknown=unknown)
