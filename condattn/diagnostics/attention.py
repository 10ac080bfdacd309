"""Attention entropy, maximum probability and self-attention measures per layer and head, from the attention
probabilities each site's module really computes (its masks, causal or padding, its position terms such as RoPE or
a relative position bias, its biases, and weights it reads itself). How they are read is readers.py: transformers'
eager attention, timm's unfused path, nn.MultiheadAttention's need_weights, F.scaled_dot_product_attention's inputs,
or, for a form that is the module's whole formula (DaViT's channel attention), a recomputation from q and k.

A site whose probabilities cannot be read (Nyströmformer's landmark approximation forms none) is ABSENT: its values
are None and results() gives the reason under "absent", never NaN. For sites that attend over channels
(AttentionSite.attends_over == "channels": XCiT's XCA, DaViT's channel attention) the softmax runs over the d_h
channels, so "queries" are channels; class attention (queries == "first") has one query, the class token. Padded
queries are excluded (the model's mask, read from each call where the token site names its owner).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..conditioning.sites import AttentionSite, find_attention, find_tokens
from ..conditioning.tokens import track_model_mask
from ._util import rows_kept
from .readers import MISSING, reader_for


def softmax_entropy(logits: torch.Tensor, key_keep: torch.Tensor | None = None):
    """Entropy (nats) and max probability of softmax(logits) over the last dim; logits (B, H, Nq, Nk),
    key_keep (B, Nk) bool. Returns two (B, H, Nq) tensors."""
    if key_keep is not None:
        logits = logits.masked_fill(~key_keep[:, None, None, :], float("-inf"))
    return prob_entropy(torch.softmax(logits.float(), dim=-1))


def prob_entropy(p: torch.Tensor):
    """Entropy (nats) and max probability of probabilities p over the last dim (0 log 0 = 0)."""
    p = p.double()
    ent = -torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p)).sum(-1)
    return ent, p.amax(-1)


def self_attention_sites(site: AttentionSite, nq: int, nk: int) -> tuple[bool, bool]:
    """(whether "query i attends to key i" is defined: token softmax with every token querying its own keys, whether
    the first query is the class token attending over keys that start with it: class attention, or a token site
    of a model with prefix tokens — the caller decides the latter)."""
    own = site.attends_over == "tokens" and site.queries == "all" and nq == nk and site.group != "decoder_cross"
    own = own and "q" in site.proj  # a site without W_Q takes its queries from elsewhere (GCViT's global tokens)
    return own, site.attends_over == "tokens" and site.group != "decoder_cross" and "q" in site.proj


def _as_heads(p: torch.Tensor, allowed: torch.Tensor | None, heads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, …, H, …, Nq, Nk) probabilities as (B·…, H, Nq, Nk): the last leading axis of the head count is the
    heads', every other leading axis joins the batch (`allowed` follows where it has the same axes)."""
    lead = list(range(p.dim() - 2))
    ax = next((i for i in reversed(lead[1:]) if p.shape[i] == heads), p.dim() - 3)
    nq, nk = p.shape[-2:]
    out = p.movedim(ax, -3).reshape(-1, p.shape[ax], nq, nk)
    if allowed is not None:
        allowed = allowed.expand(p.shape).movedim(ax, -3).reshape(out.shape) if allowed.dim() == p.dim() else None
    return out, allowed


class AttentionProbe:
    """Context manager: while active, every forward accumulates per-head attention entropy and max
    probability of every attention site. `mask` (B, N), 1/True = real token; models whose encoder
    receives the mask (HF) have it read from each call instead."""

    def __init__(self, model: nn.Module, mask: torch.Tensor | None = None):
        self.sites = find_attention(model)
        self.token_site = find_tokens(model)
        self.mask = mask
        n = len(self.sites)
        self.ent = [torch.zeros(s.num_heads, dtype=torch.float64) for s in self.sites]
        self.maxp = [torch.zeros(s.num_heads, dtype=torch.float64) for s in self.sites]
        self.count = [0.0] * n
        self.uniform = [0.0] * n  # Σ over queries of log(#keys it may attend to)
        # saturation: queries whose argmax key is themselves, and the class token's attention to itself
        self.has_cls = self.token_site is not None and self.token_site.num_prefix_tokens > 0
        self.self_hits, self.self_count = [0.0] * n, [0.0] * n
        self.cls_self, self.cls_count = [0.0] * n, [0] * n
        # the attention input's per-head squared norm ‖x_h‖² (mean over tokens and heads): a fixed λI on W_Q and W_K
        # adds λ²‖x_h‖²/√d_h to a token's logit on itself, the scale at which SCA's λ starts to saturate the softmax
        self.xh_norm2, self.xh_count = [0.0] * n, [0] * n
        self.reader = [""] * n
        self.absent: list[str | None] = [None] * n  # why a site has no values (set on enter or by a bad capture)
        self._handles: list = []

    def __enter__(self) -> AttentionProbe:
        self._handles += track_model_mask(self.token_site, lambda m: setattr(self, "mask", m))
        for i, site in enumerate(self.sites):
            self.reader[i], attach = reader_for(site)
            got = attach(site, lambda p, allowed, i=i: self._accumulate(i, p, allowed), self._keys_kept(i))
            if isinstance(got, str):
                self.absent[i] = got
            else:
                self._handles += got
            if site.attends_over == "tokens" and site.group != "decoder_cross":  # cross: no token meets itself
                self._handles.append(site.module.register_forward_pre_hook(
                    lambda mod, args, kwargs, i=i: self._input_norm(i, args, kwargs), with_kwargs=True))
        return self

    def _input_norm(self, i: int, args: tuple, kwargs: dict) -> None:
        """Accumulate ‖x_h‖² of the site's input tokens (..., N, D), D = heads × head_dim; other inputs are skipped."""
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
        pos = kwargs.get("position_embeddings", kwargs.get("object_queries"))  # DETR: q, k see x + positions
        if isinstance(x, torch.Tensor) and isinstance(pos, torch.Tensor) and pos.shape == x.shape:
            x = x + pos
        site = self.sites[i]
        if isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[-1] == site.num_heads * site.head_dim:
            x = x.detach().double().reshape(-1, site.num_heads, site.head_dim)
            self.xh_norm2[i] += float(x.pow(2).sum(-1).mean(-1).sum())
            self.xh_count[i] += x.shape[0]

    def __exit__(self, *exc) -> None:
        for h in reversed(self._handles):  # reversed: attribute switches shared by sites restore in order
            h.remove()
        self._handles.clear()

    def _keys_kept(self, i: int) -> Callable:
        site = self.sites[i]
        return lambda b, n, device: rows_kept(self.mask, b, n, device) if site.masked_keys else None

    def _accumulate(self, i: int, p: torch.Tensor, allowed: torch.Tensor | None) -> None:
        site = self.sites[i]
        tol = 1e-3 if p.dtype in (torch.float32, torch.float64) else 0.05  # half-precision probabilities round
        p = p.detach().double()
        if p.dim() > 4:  # windows or groups beside the heads (Twins: (B, groups, H, N, N)): windows join the batch
            p, allowed = _as_heads(p, allowed, site.num_heads)
        b, h, nq, nk = p.shape
        channels = site.attends_over == "channels"
        qkeep = None if channels or not site.masked_queries else rows_kept(self.mask, b, nq, p.device)
        w = torch.ones(b, nq, dtype=p.dtype, device=p.device) if qkeep is None else qkeep.to(p.dtype)
        w = w * torch.isfinite(p).all(-1).all(1)  # a query with no key to attend to (NaN row) is left out
        p = torch.nan_to_num(p)
        kept = w[:, None, :] > 0
        if float(p.amin()) < 0 or (kept.any() and float(((p.sum(-1) - 1).abs() * kept).amax()) > tol):
            self.absent[i] = f"the {self.reader[i]} weights of {type(site.module).__name__} are not probabilities " \
                             "(rows do not sum to 1)"
            return
        ent, maxp = prob_entropy(p)
        w3 = w[:, None, :]
        self.ent[i] += (ent * w3).sum((0, 2)).cpu()
        self.maxp[i] += (maxp * w3).sum((0, 2)).cpu()
        keys = torch.full((b, nq), float(nk), dtype=p.dtype, device=p.device) if allowed is None else \
            torch.broadcast_to(allowed, (b, h, nq, nk)).double().sum(-1).mean(1)
        self.count[i] += float(w.sum())
        self.uniform[i] += float((w * keys.clamp_min(1).log()).sum())
        own, first = self_attention_sites(site, nq, nk - self.reader[i].endswith("+sink"))  # (a sink: N + 1 keys)
        if own:  # argmax over keys == the query's own index, over heads and valid queries
            hit = (p.argmax(-1) == torch.arange(nq, device=p.device)).to(p.dtype)
            self.self_hits[i] += float((hit * w3).sum())
            self.self_count[i] += float(w.sum()) * h
        if first and (site.queries == "first" or (self.has_cls and own)):  # class token → itself, mean over heads
            self.cls_self[i] += float(p[:, :, 0, 0].mean(1).sum())
            self.cls_count[i] += b

    def results(self) -> list[dict]:
        """Per layer: {"layer", "name", "entropy", "maxprob", "entropy_uniform", "entropy_heads": [...],
        "maxprob_heads": [...], "self_argmax", "cls_self", "self_logit_unit", "reader", "absent"}; means over samples
        and valid queries (heads averaged for the layer values). entropy_uniform = mean log(#keys a query may attend
        to: causal and padding masks applied), the entropy of uniform attention. An absent site has None values and the
        reason."""
        out = []
        for i, site in enumerate(self.sites):
            c = self.count[i]
            absent = self.absent[i] or (None if c else f"{type(site.module).__name__}: {MISSING[self.reader[i]]}")
            ent = None if absent else (self.ent[i] / c).tolist()
            maxp = None if absent else (self.maxp[i] / c).tolist()
            out.append(
                {
                    "layer": i,
                    "name": site.name,
                    "entropy": None if absent else sum(ent) / len(ent),
                    "maxprob": None if absent else sum(maxp) / len(maxp),
                    "entropy_uniform": None if absent else self.uniform[i] / c,
                    "entropy_heads": ent,
                    "maxprob_heads": maxp,
                    # share of (query, head) pairs whose largest attention weight is on the query itself (None: the
                    # site's queries are not its keys, e.g. channel or cross-attention)
                    "self_argmax": self.self_hits[i] / self.self_count[i] if self.self_count[i] and not absent
                    else None,
                    # the class token's attention to itself, mean over heads and samples (None: no class token)
                    "cls_self": self.cls_self[i] / self.cls_count[i] if self.cls_count[i] and not absent else None,
                    # ‖x_h‖²/√d_h of the site's input (mean over tokens and heads): λI's self-logit per unit λ²
                    "self_logit_unit": self.xh_norm2[i] / self.xh_count[i] / site.head_dim ** 0.5
                    if self.xh_count[i] else None,
                    "reader": self.reader[i],  # how the probabilities were read (readers.py)
                    "absent": absent,  # None, or why this site has no values
                }
            )
        return out


def attention_entropy(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None) -> list[dict]:
    """Run `forward(model, batch)` once under no_grad and return AttentionProbe.results()."""
    with torch.no_grad(), AttentionProbe(model, mask) as probe:
        forward(model, batch)
    return probe.results()
