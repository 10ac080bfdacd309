"""Attention entropy and maximum probability per layer and head.

q and k are read from the outputs of each site's projection Linear(s) by forward hooks registered after
any conditioning hooks, so under SCA they are the (W + λI) projections the model really uses. From them
the exact softmax(q k^T · scale) over the keys is recomputed (scale = the module's `scale`, else
1/sqrt(head_dim); a timm q_norm/k_norm is applied first). Padded keys are masked out and padded queries
excluded. For Nyströmformer this is the exact softmax attention that its q and k define, i.e. the matrix
its landmark (Nyström) attention approximates, not the approximation itself.

The scores are the site's own formula (`AttentionSite.form.scores`, conditioning/forms.py): token softmax as
above, or, for sites that attend over channels (AttentionSite.attends_over == "channels"), e.g. XCiT's XCA
softmax(q̂ᵀk̂ · τ) or DaViT's channel attention, a d_h × d_h softmax whose "queries" are the d_h channels.
Class attention (queries == "first") has one query, the class token. Under grouped-query attention (Llama-style,
timm AttentionRope) each query head is scored against its shared key head. A site whose module reads its projection
weights itself (sites.Projection.called False: timm Eva / BEiT with q/v biases, nn.MultiheadAttention) has no
projection call to read q and k from: its entropy and max probability are NaN (its weight, gradient and κ(J)
diagnostics are measured as for any site).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..conditioning.sites import AttentionSite, find_attention, find_tokens
from ..conditioning.tokens import track_model_mask
from ._util import rows_kept

_CHUNK_ELEMENTS = 1 << 25  # logits per chunk of samples, to bound memory on long sequences


def _heads(t: torch.Tensor, site: AttentionSite) -> torch.Tensor:
    if t.dim() == 2:  # (B, C): class attention's single query (the class token)
        t = t.unsqueeze(1)
    b, n = t.shape[0], t.shape[-2]
    t = t.reshape(b, n, -1, site.head_dim).transpose(1, 2)  # (B, heads of this role, N, d)
    if t.shape[1] != site.num_heads:  # grouped-query attention: query head h reads k/v head h // (H / H_kv)
        t = t.repeat_interleave(site.num_heads // t.shape[1], dim=1)
    return t


def _roles(site: AttentionSite) -> tuple[str, str]:
    """The two projections whose product is softmaxed. Layouts name roles by what they do in the formula
    (DaViT's ChannelAttention: its `k` chunk is the "q" role), so this is always (q, k)."""
    return ("q", "k")


def softmax_entropy(logits: torch.Tensor, key_keep: torch.Tensor | None = None):
    """Entropy (nats) and max probability of softmax(logits) over the last dim; logits (B, H, Nq, Nk),
    key_keep (B, Nk) bool. Returns two (B, H, Nq) tensors."""
    if key_keep is not None:
        logits = logits.masked_fill(~key_keep[:, None, None, :], float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    ent = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    return ent, p.amax(-1)


def self_attention_sites(site: AttentionSite, nq: int, nk: int) -> tuple[bool, bool]:
    """(whether "query i attends to key i" is defined: token softmax with every token querying its own keys, whether
    the first query is the class token attending over keys that start with it: class attention, or a token site
    of a model with prefix tokens — the caller decides the latter)."""
    own = site.attends_over == "tokens" and site.queries == "all" and nq == nk and site.group != "decoder_cross"
    return own, site.attends_over == "tokens" and site.group != "decoder_cross"


class AttentionProbe:
    """Context manager: while active, every forward accumulates per-head attention entropy and max
    probability of every attention site. `mask` (B, N), 1/True = real token; models whose encoder
    receives the mask (HF) have it read from each call instead."""

    def __init__(self, model: nn.Module, mask: torch.Tensor | None = None):
        self.sites = find_attention(model)
        self.token_site = find_tokens(model)
        self.mask = mask
        h = [s.num_heads for s in self.sites]
        self.ent = [torch.zeros(n, dtype=torch.float64) for n in h]
        self.maxp = [torch.zeros(n, dtype=torch.float64) for n in h]
        self.count = [0] * len(self.sites)
        self.uniform = [0.0] * len(self.sites)  # Σ over queries of log(#valid keys)
        # saturation: queries whose argmax key is themselves, and the class token's attention to itself
        self.has_cls = self.token_site is not None and self.token_site.num_prefix_tokens > 0
        self.self_hits = [0.0] * len(self.sites)
        self.self_count = [0.0] * len(self.sites)
        self.cls_self = [0.0] * len(self.sites)
        self.cls_count = [0] * len(self.sites)
        self._buf: list[dict] = [{} for _ in self.sites]
        self._handles: list = []

    def __enter__(self) -> AttentionProbe:
        self._handles += track_model_mask(self.token_site, lambda m: setattr(self, "mask", m))
        for i, site in enumerate(self.sites):
            if not all(site.proj[r].called for r in _roles(site)):  # no projection call to read q, k from: NaN
                continue
            groups: dict[int, tuple[nn.Linear, list[str]]] = {}
            for role in _roles(site):
                lin = site.proj[role].linear
                groups.setdefault(id(lin), (lin, []))[1].append(role)
            for lin, roles in groups.values():

                def hook(module, args, output, i=i, roles=tuple(roles)):
                    self._capture(i, roles, output)

                self._handles.append(lin.register_forward_hook(hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._buf = [{} for _ in self.sites]

    def _capture(self, i: int, roles: tuple[str, ...], output: torch.Tensor) -> None:
        site, buf = self.sites[i], self._buf[i]
        for role in roles:
            buf[role] = output.detach()[..., site.proj[role].cols]
        qr, kr = _roles(site)
        if qr in buf and kr in buf:
            self._accumulate(i, _heads(buf.pop(qr), site), _heads(buf.pop(kr), site))

    def _accumulate(self, i: int, q: torch.Tensor, k: torch.Tensor) -> None:
        site = self.sites[i]
        qn, kn = getattr(site.module, "q_norm", None), getattr(site.module, "k_norm", None)
        q = (qn(q) if isinstance(qn, nn.Module) else q).float()
        k = (kn(k) if isinstance(kn, nn.Module) else k).float()
        b, h = q.shape[:2]
        channels = site.attends_over == "channels"
        nq, nk = (q.shape[3], k.shape[3]) if channels else (q.shape[2], k.shape[2])
        # the padding mask applies where the site says so (DETR: not to decoder queries, to cross-attention keys)
        qkeep = None if channels or not site.masked_queries else rows_kept(self.mask, b, nq, q.device)
        kkeep = None if channels or not site.masked_keys else rows_kept(self.mask, b, nk, q.device)
        qw = torch.ones(b, nq, device=q.device) if qkeep is None else qkeep.float()
        nkeys = torch.full((b,), float(nk), device=q.device) if kkeep is None else kkeep.sum(1).float()
        own, first = self_attention_sites(site, nq, nk)
        cls = first and (site.queries == "first" or (self.has_cls and own))
        step = max(1, _CHUNK_ELEMENTS // (h * nq * nk))
        for s in range(0, b, step):
            sl = slice(s, s + step)
            logits = site.form.scores(site, q[sl], k[sl])
            ent, maxp = softmax_entropy(logits, None if kkeep is None else kkeep[sl])
            w = qw[sl][:, None, :]
            self.ent[i] += (ent * w).sum((0, 2)).double().cpu()
            self.maxp[i] += (maxp * w).sum((0, 2)).double().cpu()
            if own or cls:
                if kkeep is not None:
                    logits = logits.masked_fill(~kkeep[sl][:, None, None, :], float("-inf"))
                if own:  # argmax over keys == the query's own index, over heads and valid queries
                    hit = (logits.argmax(-1) == torch.arange(nq, device=logits.device)).float()
                    self.self_hits[i] += float((hit * w).sum())
                    self.self_count[i] += float(w.sum()) * h
                if cls:  # query 0 (the class token) attending to key 0 (itself), mean over heads
                    self.cls_self[i] += float(torch.softmax(logits[:, :, 0], dim=-1)[..., 0].mean(1).sum())
                    self.cls_count[i] += logits.shape[0]
        self.count[i] += int(qw.sum())
        self.uniform[i] += float((qw.sum(1).double() * nkeys.double().log()).sum())

    def results(self) -> list[dict]:
        """Per layer: {"layer", "name", "entropy", "maxprob", "entropy_uniform", "entropy_heads": [...],
        "maxprob_heads": [...], "self_argmax", "cls_self"}; means over samples and valid queries (heads averaged
        for the layer values). entropy_uniform = mean log(#valid keys), the entropy of uniform attention."""
        out = []
        for i, site in enumerate(self.sites):
            c = self.count[i]
            ent = (self.ent[i] / c).tolist() if c else [math.nan] * site.num_heads
            maxp = (self.maxp[i] / c).tolist() if c else [math.nan] * site.num_heads
            out.append(
                {
                    "layer": i,
                    "name": site.name,
                    "entropy": sum(ent) / len(ent),
                    "maxprob": sum(maxp) / len(maxp),
                    "entropy_uniform": self.uniform[i] / c if c else math.nan,
                    "entropy_heads": ent,
                    "maxprob_heads": maxp,
                    # share of (query, head) pairs whose largest attention weight is on the query itself (None: the
                    # site's queries are not its keys, e.g. channel or cross-attention)
                    "self_argmax": self.self_hits[i] / self.self_count[i] if self.self_count[i] else None,
                    # the class token's attention to itself, mean over heads and samples (None: no class token)
                    "cls_self": self.cls_self[i] / self.cls_count[i] if self.cls_count[i] else None,
                }
            )
        return out


def attention_entropy(model: nn.Module, forward: Callable, batch, mask: torch.Tensor | None = None) -> list[dict]:
    """Run `forward(model, batch)` once under no_grad and return AttentionProbe.results()."""
    with torch.no_grad(), AttentionProbe(model, mask) as probe:
        forward(model, batch)
    return probe.results()
