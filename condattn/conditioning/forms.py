"""How an attention site forms its attention matrix from its q and k roles: one `AttentionForm` per formula.

A layout attaches a form to each AttentionSite (`site.form`), so consumers never ask which family a site belongs
to: the attention-entropy probe calls `form.scores` on the per-head projections it captured, and κ(J) takes the
Jacobian of `form.head`, the formula of one head as a function of (X, W_Q, W_K, W_V).

- TOKEN_SOFTMAX: softmax(q kᵀ · scale) over the tokens (ViT, Swin, class attention, BERT, GPT-2, DETR, ...);
  scale = the module's `scale` when it is a number, else 1/sqrt(head_dim).
- CROSS_COVARIANCE: XCiT's XCA, softmax(τ · q̂ᵀ k̂) over the d_h channels of a head (q, k L2-normalised over the
  tokens), τ the learned per-head `temperature`.
- CHANNEL_SOFTMAX: DaViT's channel attention, softmax((q·scale)ᵀ k) over the d_h channels (in the roles the
  layout assigns: timm's k and v chunks).

`complete` says the formula is ALL of the module's attention (no position term, no mask but padding), so the entropy
probe may recompute the probabilities from the captured q and k where it cannot read the module's own
(diagnostics/readers.py). A token softmax is not complete: modules add RoPE, relative position biases and causal masks.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

HeadFn = Callable[..., torch.Tensor]


def attention_head(X, W_q, W_k, W_v, scale: float | None = None) -> torch.Tensor:
    """softmax(X W_q W_k^T X^T · scale) X W_v, shape (N, d); scale None means 1/sqrt(d); scale=1 is the
    papers' unscaled notation."""
    s = W_q.shape[1] ** -0.5 if scale is None else float(scale)
    return torch.softmax((X @ W_q) @ (X @ W_k).T * s, dim=-1) @ (X @ W_v)


def xca_head(X, W_q, W_k, W_v, temperature: float = 1.0) -> torch.Tensor:
    """One head of XCiT's cross-covariance attention (timm `XCA.forward`, head h with τ = temperature[h]),
    shape (N, d): Q = X W_q, K = X W_k, V = X W_v (N, d); each of Q's and K's d columns is L2-normalised over
    the N tokens (q̂, k̂, as torch.nn.functional.normalize: ‖·‖ clamped at 1e-12); the d × d channel attention
    A = softmax(τ · q̂ᵀ k̂) (rows sum to 1) mixes V's channels: output V Aᵀ (tokens kept, channels mixed).
    No bias (as `attention_head`): timm's qkv bias would shift Q, K, V by constant rows."""
    norm = torch.nn.functional.normalize
    q, k = norm(X @ W_q, dim=0), norm(X @ W_k, dim=0)
    return (X @ W_v) @ torch.softmax(float(temperature) * (q.T @ k), dim=-1).T


def channel_head(X, W_q, W_k, W_v, scale: float | None = None) -> torch.Tensor:
    """One head of DaViT's channel attention in the layout's roles, shape (N, d): A = softmax((X W_q · scale)ᵀ X W_k)
    (d × d, scale None means 1/sqrt(d)) mixes the channels of V = X W_v: output V Aᵀ. No bias."""
    s = W_q.shape[1] ** -0.5 if scale is None else float(scale)
    return (X @ W_v) @ torch.softmax(((X @ W_q) * s).T @ (X @ W_k), dim=-1).T


def module_scale(site) -> float | None:
    """The site module's own logit scale when it stores one as a number (timm), else None (= 1/sqrt(head_dim))."""
    s = getattr(site.module, "scale", None)
    return float(s) if isinstance(s, (int, float)) else None


class AttentionForm:
    """The formula of a site's attention. `name` is recorded with κ(J) ("formula")."""

    name = "token_softmax"
    over = "tokens"  # what the softmax runs over: "tokens" (queries = tokens) or "channels" (queries = channels)
    complete = False  # the formula is all of the module's attention (module docstring)

    def scores(self, site, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Pre-softmax scores (B, H, queries, keys) from the heads (B, H, N, d) of the q and k roles."""
        raise NotImplementedError

    def head(self, site, h: int) -> tuple[HeadFn, dict]:
        """(f(X, W_q, W_k, W_v) -> (N, d) of head h, the parameters bound into f, for the record)."""
        raise NotImplementedError

    def describe(self, params: dict) -> str:
        """One line for the diagnose CLI."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class TokenSoftmax(AttentionForm):
    name = "token_softmax"

    def scores(self, site, q, k):
        s = module_scale(site)
        return q @ k.transpose(-1, -2) * (s if s is not None else site.head_dim**-0.5)

    def head(self, site, h):
        s = module_scale(site)  # None: attention_head's own 1/sqrt(d)
        return partial(attention_head, scale=s), {"scale": s if s is not None else site.head_dim**-0.5}

    def describe(self, params):
        return f"exact softmax head, scale {params['scale']:.4g}"


class CrossCovariance(AttentionForm):
    name = "xca"
    over = "channels"
    complete = True

    def scores(self, site, q, k):
        q = torch.nn.functional.normalize(q, dim=-2)
        k = torch.nn.functional.normalize(k, dim=-2)
        return q.transpose(-1, -2) @ k * site.module.temperature.detach().float()

    def head(self, site, h):
        tau = float(site.module.temperature.detach().reshape(-1)[h])
        return partial(xca_head, temperature=tau), {"scale": None, "temperature": tau}

    def describe(self, params):
        return f"XCiT cross-covariance head softmax(τ q̂ᵀk̂) over channels, τ {params['temperature']:.4g} (baseline)"


class ChannelSoftmax(AttentionForm):
    name = "channel_softmax"
    over = "channels"
    complete = True

    def scores(self, site, q, k):
        s = module_scale(site)
        return (q * (s if s is not None else site.head_dim**-0.5)).transpose(-1, -2) @ k

    def head(self, site, h):
        s = module_scale(site)
        return partial(channel_head, scale=s), {"scale": s if s is not None else site.head_dim**-0.5}

    def describe(self, params):
        return f"channel softmax head softmax((q·s)ᵀk) over channels, scale {params['scale']:.4g}"


TOKEN_SOFTMAX = TokenSoftmax()
CROSS_COVARIANCE = CrossCovariance()
CHANNEL_SOFTMAX = ChannelSoftmax()
FORMS = {f.name: f for f in (TOKEN_SOFTMAX, CROSS_COVARIANCE, CHANNEL_SOFTMAX)}
