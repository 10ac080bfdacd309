"""What the methods that act on the attention logits share (softcap, attention_sink) and the one that reads them
(qk_clip): a per-layer `LogitsRule`, and the two ways it reaches a layer's logits.

A fused kernel (F.scaled_dot_product_attention) never materialises q·kᵀ, so soft-capping and a sink column cannot be
added inside it: at a patched layer the fused call is replaced by the explicit computation

    softmax([cap·tanh(q kᵀ·scale / cap) + mask, sink]) V      (cap and sink where the rule sets them)

with the kernel's own arguments (mask, is_causal, scale, enable_gqa, dropout_p), and every PatchReport entry says so.
A query whose mask hides every key (a padded row) gets probabilities 0 and output 0, as the kernel's own safe softmax
gives it; a finite mask (transformers' eager masks hold the dtype's minimum) is added as it is, as the kernel does.
qk_clip only reads the largest logit of each head (an extra q kᵀ under no_grad) and keeps the fused kernel.

Two ways in, chosen per layer:
- `interface`: a transformers attention module that dispatches through `config._attn_implementation` (Llama, Qwen,
  Gemma, BERT, ViT, GPT-2, ...). The module's `config` becomes a `ConfigView` of the model's: the same config in
  every attribute, except that the module reads `condattn_logits`, a function registered in transformers'
  AttentionInterface, which applies the module's rule. The model's config keeps the implementation it was given,
  and `set_attn_implementation` still switches it, the rule staying in place: under `sdpa` the rule's result, as
  above; under `eager` the same computation made explicitly, returning its probabilities as eager attention does
  (`output_attentions`: capped, the sink's column dropped). Other implementations (flash, flex) are refused at the
  call: their masks are not tensors the rule can add. The module's own config comes back on removal.
- `wrap`: a module whose forward calls F.scaled_dot_product_attention itself (timm's Attention, Eva, Swin, BEiT, a
  home-made model). Its forward runs inside a TorchFunctionMode that hands that call to the rule (torch.fx and
  torch.export trace it); timm's `fused_attn=False` is switched to True so that the call is made.
Any other attention (a softmax formed in Python, nn.MultiheadAttention's F.multi_head_attention_forward) is refused
with its reason. A transformers module that already passes its own logit terms (Gemma 2's `attn_logit_softcapping`,
GPT-OSS's `sinks`) is refused too: replacing its attention function would drop them.
"""

from __future__ import annotations

import inspect
import math
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..report import PatchEntry
from ..sites import AttentionSite, require_attention
from .common import Undo, not_token_softmax

RULE = "_condattn_logits"  # where a module keeps its LogitsRule (instance __dict__: not a submodule, no state_dict key)
INTERFACE = "condattn_logits"  # the name registered in transformers' AttentionInterface


def _bias(mask: torch.Tensor | None, is_causal: bool, q_len: int, k_len: int,
          like: torch.Tensor) -> torch.Tensor | None:
    """The additive term of F.scaled_dot_product_attention's mask arguments (its documented reference): a boolean mask
    keeps True, a float mask is added, is_causal keeps the lower triangle (top-left aligned)."""
    bias = None
    if is_causal:
        keep = torch.ones(q_len, k_len, dtype=torch.bool, device=like.device).tril()
        bias = torch.zeros(q_len, k_len, dtype=like.dtype, device=like.device).masked_fill(~keep, -math.inf)
    if mask is not None:
        m = torch.zeros_like(mask, dtype=like.dtype).masked_fill(~mask, -math.inf) if mask.dtype == torch.bool \
            else mask.to(like.dtype)
        bias = m if bias is None else bias + m
    return bias


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: each k/v head serves q.shape[-3] // k.shape[-3] query heads (SDPA's enable_gqa)."""
    if k.shape[-3] == q.shape[-3]:
        return k, v
    groups = q.shape[-3] // k.shape[-3]
    return k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)


def head_max(logits: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Each head's largest logit (q kᵀ·scale) over the batch and the (query, key) pairs the mask keeps: (H,)."""
    x = logits.detach().float()
    if bias is not None:
        x = x.masked_fill(torch.isneginf(bias) | (bias <= torch.finfo(bias.dtype).min / 2), -math.inf)
    x = x.amax(dim=(-2, -1))
    return x.reshape(-1, x.shape[-1]).amax(0) if x.dim() > 1 else x.reshape(1)


def _logits(query, key, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """(q kᵀ·scale, the mask's additive term) of F.scaled_dot_product_attention's arguments."""
    k = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3) if enable_gqa else key
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return (query @ k.transpose(-2, -1)) * scale, _bias(attn_mask, is_causal, query.shape[-2], k.shape[-2], query)


def explicit_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, cap: float | None = None, sinks: torch.Tensor | None = None, seen=None,
                       probe=None, weights: bool = False):
    """F.scaled_dot_product_attention computed explicitly, with soft-capping (Gemma 2's order: logits / cap, tanh,
    × cap, before the mask) and a sink logit per head (GPT-OSS's: one more column, max subtracted, dropped after the
    softmax). `seen(per-head max)` receives each head's largest logit (qk_clip); `probe(p, allowed)` the softmax as
    formed (`LogitsRule.probe`). `weights`: (output, the probabilities it used: capped, the sink's column dropped,
    after dropout), as transformers' eager attention functions return them."""
    logits, bias = _logits(query, key, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    v = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3) if enable_gqa else value
    if seen is not None:
        seen(head_max(logits, bias))
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    if bias is not None:
        logits = logits + bias
    if sinks is not None:
        col = sinks.to(logits.dtype).view(-1, 1, 1).expand_as(logits[..., :1])
        logits = torch.cat([logits, col], dim=-1)
        logits = logits - logits.amax(dim=-1, keepdim=True).detach()
    # a query that may see no key (a left-padded row under a causal mask): probabilities 0, as the fused kernel's safe
    # softmax gives them (never the NaN of a softmax over -inf alone, which spreads through later layers and backward)
    dead = torch.isneginf(logits).all(-1, keepdim=True)
    probs = torch.softmax(logits.float().masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0).to(v.dtype)
    if probe is not None:
        _probe(probe, probs, bias, sinks is not None)
    if sinks is not None:
        probs = probs[..., :-1]
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    return (probs @ v, probs) if weights else probs @ v


def _probe(probe, probs: torch.Tensor, bias: torch.Tensor | None, sink: bool) -> None:
    """Hand the softmax probabilities to a diagnostics reader with the keys each query may attend to (None: all);
    with a sink, its column is the last key (always allowed), so each row still sums to 1."""
    allowed = None if bias is None else bias > torch.finfo(bias.dtype).min / 2
    if allowed is not None and sink:
        allowed = torch.cat([allowed.expand(probs.shape[:-1] + (probs.shape[-1] - 1,)),
                             torch.ones_like(probs[..., :1], dtype=torch.bool)], dim=-1)
    probe(probs.detach(), allowed)


class LogitsRule:
    """What one attention layer's logits get: `cap` (soft-capping), a sink logit per head (the owner's
    `condattn_sinks` parameter), and `track` (qk_clip: each head's largest logit in training forwards, kept in
    `max_logits` until read). `probe(p, allowed)`, while set (condattn.diagnostics' reader), receives the softmax
    probabilities each call forms, cap and sink column included: the eager / unfused paths a reader would otherwise
    switch on bypass the rule."""

    def __init__(self, owner: nn.Module):
        self.owner = owner
        self.cap: float | None = None
        self.sink = False
        self.track = False
        self.max_logits: torch.Tensor | None = None
        self.calls = 0
        self.probe = None
        self.on_seen = None  # called after each recorded training forward (qk_clip's check that it is applied)

    @property
    def changes(self) -> bool:
        return self.cap is not None or self.sink

    def sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
             weights: bool = False):
        """F.scaled_dot_product_attention's signature and result, with this rule applied to the logits. Under
        torch.fx the explicit computation is one graph node (its branches read the arguments' values). `weights`
        (a transformers model asking for eager attention): (output, probabilities), always computed explicitly."""
        self.calls += 1
        kw = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        traced = isinstance(query, torch.fx.Proxy)
        seen = self._seen if self.track and self.owner.training and not traced else None
        if not self.changes and not weights:  # read only: the fused kernel computes the output
            if seen is not None or (self.probe is not None and not traced):
                with torch.no_grad():
                    logits, bias = _logits(query, key, **kw)
                    if seen is not None:
                        seen(head_max(logits, bias))
                    if self.probe is not None:
                        _probe(self.probe, torch.softmax((logits if bias is None else logits + bias).float(), -1),
                               bias, False)
            return F.scaled_dot_product_attention(query, key, value, **kw)
        extra = dict(cap=self.cap, sinks=self.owner.condattn_sinks if self.sink else None, weights=weights)
        if traced:
            return query.tracer.create_proxy("call_function", explicit_attention, (query, key, value), {**kw, **extra})
        return explicit_attention(query, key, value, **kw, **extra, seen=seen, probe=self.probe)

    @torch.no_grad()
    def _seen(self, heads: torch.Tensor) -> None:
        self.max_logits = heads if self.max_logits is None else torch.maximum(self.max_logits, heads)
        if self.on_seen is not None:
            self.on_seen()


class SdpaMode(TorchFunctionMode):
    """While active, F.scaled_dot_product_attention is the rule's explicit computation; every other call as it was."""

    def __init__(self, rule: LogitsRule):
        super().__init__()
        self.rule = rule

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return self.rule.sdpa(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class LogitsForward:
    """A module's forward (its class's, or the one it had) run inside SdpaMode: set as the instance's `forward`.
    A forward that ends without a scaled_dot_product_attention call is an error, not a silent no-op."""

    def __init__(self, module: nn.Module, rule: LogitsRule, previous=None):
        self.module, self.rule, self.previous = module, rule, previous

    def __call__(self, *args, **kwargs):
        before = self.rule.calls
        with SdpaMode(self.rule):
            fn = self.previous or type(self.module).forward.__get__(self.module)
            out = fn(*args, **kwargs)
        if self.rule.calls == before:
            raise RuntimeError(f"condattn: {type(self.module).__name__} ran its forward without calling "
                               "F.scaled_dot_product_attention, so its logits rule did not act; remove the "
                               "conditioning")
        return out


@cache
def _forward_source(cls: type) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def _is_interface(m: nn.Module) -> bool:
    return hasattr(getattr(m, "config", None), "_attn_implementation") and \
        "_attn_implementation" in _forward_source(type(m))


def route(site: AttentionSite, method: str) -> tuple[str, str]:
    """(how the rule reaches the site's logits: 'interface' | 'wrap', in words) or ('', why it cannot)."""
    m = site.module
    why = not_token_softmax(site)
    if why:
        return "", why
    if _is_interface(m):
        own = [w for w, v in (("attn_logit_softcapping", getattr(m.config, "attn_logit_softcapping", None)),
                              ("sinks", getattr(m, "sinks", None))) if v is not None]
        if own:
            return "", (f"{type(m).__name__} adds its own {own[0]} in its attention function, which {method} "
                        "would replace")
        return "interface", f"transformers {m.config._attn_implementation} attention → {INTERFACE}"
    if isinstance(m, nn.MultiheadAttention):
        return "", (f"nn.MultiheadAttention computes its attention inside F.multi_head_attention_forward, so {method} "
                    "cannot reach its logits")
    if "scaled_dot_product_attention" in _forward_source(type(m)):
        flag = " (fused_attn=False → True)" if getattr(m, "fused_attn", None) is False else ""
        return "wrap", f"F.scaled_dot_product_attention call{flag}"
    return "", (f"{type(m).__name__} forms its attention without F.scaled_dot_product_attention or transformers' "
                f"attention interface, so {method} cannot reach its logits")


class ConfigView:
    """A transformers attention module's view of its model's config (`real`): every attribute read and written is
    the model config's, except `_attn_implementation`, which the module reads as `condattn_logits`."""

    def __init__(self, real):
        object.__setattr__(self, "real", real)

    @property
    def _attn_implementation(self) -> str:
        return INTERFACE

    def __getattr__(self, name: str):
        if name == "real":  # (unpickling, before __init__'s attribute exists)
            raise AttributeError(name)
        return getattr(self.real, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.real, name, value)


def requested(module: nn.Module) -> str:
    """The attention implementation the model was given (`eager`, `sdpa`, ...) behind a module's ConfigView."""
    cfg = getattr(module, "config", None)
    return (getattr(cfg.real, "_attn_implementation", None) or "sdpa") if isinstance(cfg, ConfigView) else INTERFACE


def _hf_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                  position_bias=None, **kwargs):
    """transformers' attention-function signature: q, k, v (B, H, N, d), an sdpa- or eager-format mask;
    (output, None) under sdpa, (output, probabilities) under eager."""
    extra = [k for k in ("softcap", "s_aux") if kwargs.get(k) is not None]
    if extra:
        raise ValueError(f"condattn_logits attention: {type(module).__name__} passes {extra[0]}, which it does not "
                         "apply; this module cannot take a logits rule")
    impl = requested(module)
    if impl not in ("eager", "sdpa", INTERFACE):
        raise ValueError(f"condattn_logits attention: {type(module).__name__} runs under "
                         f"attn_implementation={impl!r}, whose masks its logits rule cannot read; set "
                         "attn_implementation='sdpa' or 'eager' (model.set_attn_implementation)")
    key, value = _repeat_kv(query, key, value)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    if position_bias is not None:  # T5's relative bias: added to the logits with the mask, as transformers' sdpa does
        from transformers.integrations.sdpa_attention import create_position_bias_mask

        attention_mask = create_position_bias_mask(position_bias, attention_mask, causal, query, key)
        causal = False
    if causal and key.shape[2] > query.shape[2]:  # (a prefill into an empty static cache, as transformers' sdpa)
        key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
    rule = module.__dict__.get(RULE)
    kw = dict(attn_mask=attention_mask, dropout_p=dropout, is_causal=causal, scale=scaling)
    if rule is not None and impl == "eager":
        out, probs = rule.sdpa(query, key, value, **kw, weights=True)
        return out.transpose(1, 2).contiguous(), probs
    out = rule.sdpa(query, key, value, **kw) if rule is not None else \
        F.scaled_dot_product_attention(query, key, value, **kw)
    return out.transpose(1, 2).contiguous(), None


def _register_interface() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(INTERFACE, _hf_attention)
    AttentionMaskInterface.register(INTERFACE, sdpa_mask)


def _set_config(m: nn.Module, config) -> None:
    m.__dict__["config"] = config


def rule_of(site: AttentionSite, how: str, handles: list) -> LogitsRule:
    """The site's LogitsRule, attached on first use (`how`: route's first value); what undoes it goes to `handles`."""
    m = site.module
    if RULE in m.__dict__:
        return m.__dict__[RULE]
    rule = LogitsRule(m)
    m.__dict__[RULE] = rule
    handles.append(Undo(_drop_rule, m))
    if how == "interface":
        _register_interface()
        if not isinstance(m.config, ConfigView):
            handles.append(Undo(_set_config, m, m.config))
            _set_config(m, ConfigView(m.config))
        return rule
    if getattr(m, "fused_attn", None) is False:
        m.fused_attn = True
        handles.append(Undo(setattr, m, "fused_attn", False))
    previous = m.__dict__.get("forward")
    m.forward = LogitsForward(m, rule, previous)
    handles.append(Undo(_restore_forward, m, previous))
    return rule


def _drop_rule(m: nn.Module) -> None:
    m.__dict__.pop(RULE, None)


def _restore_forward(m: nn.Module, previous) -> None:
    if previous is None:
        m.__dict__.pop("forward", None)
    else:
        m.forward = previous


def plan_sites(sites: list[AttentionSite], method: str, extra=None) -> list[tuple[AttentionSite, str, str]]:
    """(site, route or '', detail or why) for every site; `extra(site) -> why` adds a method's own refusals."""
    out = []
    for site in sites:
        how, words = route(site, method)
        if how and extra is not None and (why := extra(site)):
            how, words = "", why
        out.append((site, how, words))
    return out


def refuse_if_none(plan: list[tuple[AttentionSite, str, str]], method: str, model: nn.Module) -> None:
    if not any(how for _, how, _ in plan):
        why = "; ".join(sorted({w for _, _, w in plan}))
        raise ValueError(f"{method}: no attention layer of {type(model).__name__} takes it ({why}); nothing was "
                         "changed")


def patchable(model: nn.Module, report, method: str, partial: bool = False,
              extra=None, heads: bool = True) -> list[tuple[AttentionSite, str, str]]:
    """The logit methods' common start: the model's attention sites, planned (`plan_sites`); the ones that cannot take
    `method` recorded as skipped in `report`, none at all refused in one line; (site, route, detail) of the rest.
    `heads=False`: the method needs no head count (softcap acts on whatever the kernel call receives)."""
    sites, warnings = require_attention(model, method, partial, heads=heads)
    report.warnings += warnings
    plan = plan_sites(sites, method, extra)
    refuse_if_none(plan, method, model)
    report.skipped += [PatchEntry(site.name, f"{method}:{site.layout}", words) for site, how, words in plan if not how]
    return [(site, how, words) for site, how, words in plan if how]
