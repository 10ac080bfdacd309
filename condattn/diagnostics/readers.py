"""Readers of the attention probabilities a site's module really computes (the entropy probe's input).

A reader hooks one AttentionSite and calls `sink(p, allowed)` on each forward of its module, with p (B, H, queries,
keys) the module's own softmax probabilities (its masks, position terms such as RoPE, and biases included) and
`allowed` (bool, broadcastable to p) the keys each query may attend to (None: every key). It is chosen by how the
module computes attention, not by model family, in this order:

- a layer whose logits carry a method's rule (softcap, attention_sink, qk_clip: conditioning/methods/logits.py): the
  rule hands over the probabilities its own computation forms (cap included; a sink's column as the last key, so rows
  still sum to 1 over N + 1 keys). Switching such a layer to eager / unfused attention would bypass the rule.
- a landmark approximation (Nyströmformer with num_landmarks < seq_len) forms no probability matrix: absent. With
  num_landmarks == seq_len it runs exact softmax attention and returns it under output_attentions=True.
- nn.MultiheadAttention: called with need_weights=True, average_attn_weights=False (the caller still gets what it
  asked for); allowed from its key_padding_mask / attn_mask / is_causal.
- transformers attention (a `config` with `_attn_implementation`): runs with the eager implementation while the
  probe is active; eager attention modules return (output, probabilities). allowed: the additive mask they receive
  (causal and padding) is not -inf / the dtype's minimum.
- timm (a `fused_attn` flag, a `softmax` nn.Softmax or an `attn_drop` module): `fused_attn` is False while the probe
  is active, and the probabilities are the output of `softmax`, else the input of `attn_drop`, which timm's unfused
  path applies to `attn.softmax(-1)`.
- a form marked `complete` (forms.py: its formula is all of the module's attention, padding its only mask): recomputed
  from the q and k projection calls (DaViT's channel attention, which has neither hook point).
- anything else: F.scaled_dot_product_attention calls inside the module's forward are read (q, k, attn_mask,
  is_causal, scale, enable_gqa: the probabilities SDPA's definition gives; a user's own module, crammed BERT).
A site whose reader sees nothing is absent, with the reason (AttentionProbe.results()).
Switching the eager / unfused paths changes only how the same function is computed (fp32 rounding).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..conditioning.methods.logits import RULE
from ..conditioning.sites import AttentionSite

Sink = Callable[[torch.Tensor, "torch.Tensor | None"], None]
KeysKept = Callable[[int, int, torch.device], "torch.Tensor | None"]  # (batch, keys, device) -> (B, N) bool | None


class _SetAttr:
    """Sets obj.name = value now; `remove()` puts the old value back (a hook-handle lookalike)."""

    def __init__(self, obj, name: str, value):
        self.obj, self.name, self.old = obj, name, getattr(obj, name)
        setattr(obj, name, value)

    def remove(self) -> None:
        setattr(self.obj, self.name, self.old)


def _bind(module: nn.Module, args: tuple, kwargs: dict) -> inspect.BoundArguments:
    return inspect.signature(module.forward).bind_partial(*args, **kwargs)


def _arg(module: nn.Module, args: tuple, kwargs: dict, name: str, default=None):
    """The value of forward parameter `name` in this call (keyword or positional)."""
    if name in kwargs:
        return kwargs[name]
    try:
        return _bind(module, args, kwargs).arguments.get(name, default)
    except TypeError:
        return default


def keep_of(mask: torch.Tensor | None, true_blocks: bool) -> torch.Tensor | None:
    """A mask as bool, True = may attend. Float masks are additive (-inf or the dtype's minimum blocks); bool masks
    block where True when `true_blocks` (torch MHA's convention), else where False (SDPA, transformers)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return ~mask if true_blocks else mask
    return mask > torch.finfo(mask.dtype).min / 2


def _causal(nq: int, nk: int, device) -> torch.Tensor:
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril(nk - nq)


def sdpa_probs(q, k, v=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """(p, allowed) of F.scaled_dot_product_attention's definition, for its (B, H, Nq, d) / (B, H_kv, Nk, d) inputs."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    logits = (q.float() @ k.float().transpose(-2, -1)) * s
    allowed = _causal(q.shape[-2], k.shape[-2], q.device) if is_causal else None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = attn_mask if allowed is None else allowed & attn_mask
        else:
            logits = logits + attn_mask.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, dim=-1), allowed


class _SDPAMode(TorchFunctionMode):
    def __init__(self, sink: Sink):
        super().__init__()
        self.sink = sink

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            with torch.no_grad():
                self.sink(*sdpa_probs(*(a.detach() if torch.is_tensor(a) else a for a in args),
                                      **{n: (a.detach() if torch.is_tensor(a) else a) for n, a in kwargs.items()}))
        return func(*args, **kwargs)


def _logits_rule(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    return [_SetAttr(site.module.__dict__[RULE], "probe", sink)]


def _landmarks(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    m = site.module
    if m.num_landmarks != m.seq_len:
        return (f"Nyström approximation ({m.num_landmarks} landmarks for {m.seq_len} tokens) forms no softmax "
                "probability matrix")
    asked: dict = {}

    def pre(mod, args, kwargs):
        ba = _bind(mod, args, kwargs)
        asked["output_attentions"] = ba.arguments.get("output_attentions", False)
        ba.arguments["output_attentions"] = True
        return ba.args, ba.kwargs

    def post(mod, args, out):
        sink(out[1].detach(), None if (kk := keys_kept(out[1].shape[0], out[1].shape[-1], out[1].device)) is None
             else kk[:, None, None, :])
        return out if asked.get("output_attentions") else out[:1]

    return [m.register_forward_pre_hook(pre, with_kwargs=True), m.register_forward_hook(post)]


def _mha(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    call: dict = {}

    def pre(mod, args, kwargs):
        ba = _bind(mod, args, kwargs)
        a = ba.arguments
        call.update(want=a.get("need_weights", True), avg=a.get("average_attn_weights", True),
                    kpm=a.get("key_padding_mask"), am=a.get("attn_mask"), causal=a.get("is_causal", False))
        a["need_weights"], a["average_attn_weights"] = True, False
        return ba.args, ba.kwargs

    def post(mod, args, out):
        w = out[1]
        p = w.detach() if w.dim() == 4 else w.detach()[None]  # unbatched: (H, L, S)
        b, h, nq, nk = p.shape
        allowed = torch.ones(b, 1, nq, nk, dtype=torch.bool, device=p.device)
        if (kpm := keep_of(call["kpm"], true_blocks=True)) is not None:
            allowed = allowed & kpm.reshape(b, 1, 1, nk)
        if (am := keep_of(call["am"], true_blocks=True)) is not None:
            allowed = allowed & (am.reshape(b, h, nq, nk) if am.dim() == 3 else am)
        elif call["causal"]:
            allowed = allowed & _causal(nq, nk, p.device)
        sink(p, allowed)
        if not call["want"]:
            return out[0], None
        return (out[0], w.mean(dim=-3)) if call["avg"] else out

    return [site.module.register_forward_pre_hook(pre, with_kwargs=True), site.module.register_forward_hook(post)]


def _transformers(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    m, cfg = site.module, site.module.config
    name = "_attn_implementation_internal" if hasattr(cfg, "_attn_implementation_internal") else "_attn_implementation"
    call: dict = {}

    def pre(mod, args, kwargs):
        call["mask"] = _arg(mod, args, kwargs, "attention_mask")

    def post(mod, args, kwargs, out):
        # (output, probabilities), or (output, position_bias, probabilities) for T5: the last tensor after the output
        p = next((x for x in reversed(out[1:]) if torch.is_tensor(x)), None) if isinstance(out, tuple) else None
        if not torch.is_tensor(p):
            return
        mask = call.pop("mask", None)
        allowed = keep_of(mask, true_blocks=False) if torch.is_tensor(mask) else None
        if allowed is None and getattr(mod, "is_causal", False):
            allowed = _causal(p.shape[-2], p.shape[-1], p.device)
        sink(p.detach(), allowed)

    return [_SetAttr(cfg, name, "eager"), m.register_forward_pre_hook(pre, with_kwargs=True),
            m.register_forward_hook(post, with_kwargs=True)]


def _timm(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    m = site.module
    handles: list = [_SetAttr(m, "fused_attn", False)] if isinstance(getattr(m, "fused_attn", None), bool) else []
    call: dict = {}

    def pre(mod, args, kwargs):
        mask = _arg(mod, args, kwargs, "attn_mask")
        allowed = keep_of(mask, true_blocks=False) if torch.is_tensor(mask) and mask.dim() == 4 else None
        if _arg(mod, args, kwargs, "is_causal", False):
            allowed = True  # resolved against the matrix's shape below
        call["allowed"] = allowed

    def take(p: torch.Tensor) -> None:
        allowed = call.get("allowed")
        if allowed is True:
            allowed = _causal(p.shape[-2], p.shape[-1], p.device)
        sink(p.detach(), allowed)

    handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
    softmax = getattr(m, "softmax", None)
    if isinstance(softmax, nn.Softmax):
        handles.append(softmax.register_forward_hook(lambda mod, args, out: take(out)))
    else:
        handles.append(m.attn_drop.register_forward_pre_hook(lambda mod, args: take(args[0])))
    return handles


def _recompute(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    """q, k from the projection calls (hooked after any SCA hooks, so W + λI), then the form's scores."""
    buf: dict[str, torch.Tensor] = {}

    def capture(roles: tuple[str, ...], output: torch.Tensor) -> None:
        for role in roles:
            buf[role] = output.detach()[..., site.proj[role].cols]
        if "q" in buf and "k" in buf:
            q, k = _heads(buf.pop("q"), site).float(), _heads(buf.pop("k"), site).float()
            logits = site.form.scores(site, q, k)
            kk = None if site.form.over == "channels" else keys_kept(q.shape[0], logits.shape[-1], q.device)
            allowed = None if kk is None else kk[:, None, None, :]
            sink(torch.softmax(logits if allowed is None else logits.masked_fill(~allowed, float("-inf")), -1),
                 allowed)

    groups: dict[int, tuple[nn.Module, list[str]]] = {}
    for role in ("q", "k"):
        groups.setdefault(id(site.proj[role].linear), (site.proj[role].linear, []))[1].append(role)
    return [lin.register_forward_hook(lambda mod, args, out, r=tuple(roles): capture(r, out))
            for lin, roles in groups.values()]


def _sdpa(site: AttentionSite, sink: Sink, keys_kept: KeysKept):
    mode = _SDPAMode(sink)
    active: list = []

    def pre(mod, args):
        mode.__enter__()
        active.append(mode)

    def post(mod, args, out):
        if active:
            active.pop().__exit__(None, None, None)

    class _Leftover:  # a forward that raised between the two hooks leaves the mode entered
        def remove(self) -> None:
            while active:
                active.pop().__exit__(None, None, None)

    return [site.module.register_forward_pre_hook(pre), site.module.register_forward_hook(post), _Leftover()]


def _heads(t: torch.Tensor, site: AttentionSite) -> torch.Tensor:
    if t.dim() == 2:  # (B, C): class attention's single query (the class token)
        t = t.unsqueeze(1)
    b, n = t.shape[0], t.shape[-2]
    t = t.reshape(b, n, -1, site.head_dim).transpose(1, 2)  # (B, heads of this role, N, d)
    if t.shape[1] != site.num_heads:  # grouped-query attention: query head h reads k/v head h // (H / H_kv)
        t = t.repeat_interleave(site.num_heads // t.shape[1], dim=1)
    return t


def reader_for(site: AttentionSite) -> tuple[str, Callable]:
    """(the reader's name, attach(site, sink, keys_kept) -> hook handles, or a reason string: absent)."""
    m = site.module
    if RULE in m.__dict__:  # (+sink: the last key is the sink's, not a token: attention.py)
        return ("logits_rule+sink" if m.__dict__[RULE].sink else "logits_rule"), _logits_rule
    if hasattr(m, "num_landmarks") and hasattr(m, "seq_len"):
        return "landmarks", _landmarks
    if isinstance(m, nn.MultiheadAttention):
        return "need_weights", _mha
    if hasattr(getattr(m, "config", None), "_attn_implementation"):
        return "eager", _transformers
    if isinstance(getattr(m, "softmax", None), nn.Softmax) or isinstance(getattr(m, "attn_drop", None), nn.Module):
        return "unfused", _timm
    if site.form.complete and all(r in site.proj and site.proj[r].called for r in ("q", "k")):
        return "recomputed", _recompute
    return "sdpa", _sdpa


MISSING = {  # why a reader saw nothing
    "logits_rule": "its logits rule formed no attention (the module never called F.scaled_dot_product_attention)",
    "logits_rule+sink": "its logits rule formed no attention (the module never called F.scaled_dot_product_attention)",
    "landmarks": "the module returned no attention probabilities under output_attentions=True",
    "need_weights": "nn.MultiheadAttention returned no weights under need_weights=True",
    "eager": "the eager attention returned no probabilities (output[1])",
    "unfused": "the unfused path never reached softmax / attn_drop",
    "recomputed": "its q and k projections were not called",
    "sdpa": "it returns no probabilities, has no softmax / attn_drop module to hook, and called no "
            "F.scaled_dot_product_attention",
}
