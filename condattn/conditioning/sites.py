"""Where the conditioning goes: the sites a layout finds in a model, and the registry of layouts.

Two registries, filled by the family modules in `conditioning/layouts/` (one file per architecture family):
- ATTENTION_LAYOUTS: finders that recognise one attention module and say which Linear (and which slice of its
  output columns) holds W_Q, W_K and W_V, and how the module forms its attention logits (`AttentionForm`).
  SCA patches the projections; diagnostics read them and the form.
- TOKEN_LAYOUTS: finders that locate, in a whole model, the first transformer block (CET's input X), the
  token-embedding module (for position=before_pos_embed), the number of prefix tokens, and the module whose
  forward receives the padding mask.

Finders match by explicit type and are tried by explicit priority (higher first, then by name), never by the
order in which modules happened to register them. A new architecture is one file in `layouts/` with one
`@attention_layout(...)` and one `@token_layout(...)` finder, plus its import in `layouts/__init__.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .forms import TOKEN_SOFTMAX, AttentionForm

ROLES = ("q", "k", "v")


@dataclass
class Projection:
    linear: nn.Linear  # or any module computing x @ W + b whose output columns hold the role (Conv1D: see transposed)
    cols: slice  # output columns of `linear` that hold this role, all heads, head-major
    # True when `linear.weight` is stored (in, out), i.e. already the paper's W, instead of torch Linear's (out, in):
    # transformers' `Conv1D` (GPT-2). AttentionSite.weight/.grad transpose it back to the torch layout they return.
    transposed: bool = False
    # Which parameter of `linear` holds the weight ("weight" for Linear / Conv1D). `called` is False when the owner
    # module never calls `linear` but reads that parameter itself: timm Eva / BEiT pass `qkv.weight` to F.linear
    # with their q/v biases, nn.MultiheadAttention passes its `in_proj_weight` (or q/k/v_proj_weight) to
    # F.multi_head_attention_forward. SCA then folds W + λI into that attribute for the duration of the site
    # module's forward (spectral.py); the parameter itself is never changed.
    param: str = "weight"
    called: bool = True

    @property
    def out_features(self) -> int:
        return self.cols.stop - (self.cols.start or 0)


def stored_weight(p: Projection) -> torch.Tensor:
    """The parameter that holds a projection's weight (never the W + λI an SCA fold puts in its place during a
    forward of a module that reads the weight itself)."""
    params = p.linear._parameters
    return params[p.param] if p.param in params else getattr(p.linear, p.param)


def shift_of(p: Projection):
    """The SCA shift (spectral.SpectralShift) attached to a projection's weight, or None."""
    if p.param == "weight":
        return getattr(p.linear, "_condattn_shift", None)
    return getattr(p.linear, "_condattn_shifts", {}).get(p.param)


@dataclass
class AttentionSite:
    name: str
    module: nn.Module
    layout: str
    num_heads: int
    head_dim: int
    proj: dict[str, Projection]
    # vision zoo additions (defaults = every earlier layout): what the site's attention matrix is
    attends_over: str = "tokens"  # "tokens" (N×N softmax) | "channels" (d_h×d_h per head: XCiT XCA, DaViT channel)
    queries: str = "all"  # "all" tokens query | "first": only token 0 (class attention)
    # detection additions (defaults = every earlier layout)
    group: str | None = None  # attention kind, for options selecting kinds (DETR: encoder|decoder_self|decoder_cross)
    masked_queries: bool = True  # the model's padding mask (B, N) applies to this site's queries / outputs
    masked_keys: bool = True  # ... and to its keys (DETR: decoder queries are never padded, cross-attention keys are)
    # how the logits are formed from the q and k roles (scores for the entropy probe, head function for κ(J))
    form: AttentionForm = field(default=TOKEN_SOFTMAX)

    def weight(self, role: str, effective: bool = True) -> torch.Tensor:
        """torch-layout weight (heads*head_dim, D_in) of one role; `effective` includes an SCA correction (W + C)."""
        p = self.proj[role]
        w = stored_weight(p).detach()
        if p.transposed:  # Conv1D stores (in, out): back to torch layout, where delta_weight() lives
            w = w.T
        shift = shift_of(p)
        if effective and shift is not None:
            w = w + shift.delta_weight(w).to(w)
        return w[p.cols]

    def head_weight(self, role: str, head: int, effective: bool = True) -> torch.Tensor:
        d = self.head_dim
        return self.weight(role, effective)[head * d : (head + 1) * d]

    def grad(self, role: str) -> torch.Tensor | None:
        p = self.proj[role]
        g = stored_weight(p).grad
        if g is not None and p.transposed:
            g = g.T
        return None if g is None else g[p.cols]


@dataclass
class TokenSite:
    layout: str
    first_block: nn.Module
    first_block_name: str
    embed: nn.Module | None  # its output = token embeddings before positions are added; None: the model adds no
    #                          positions to its tokens (DETR), so before_pos_embed hooks the first block's input too
    embed_name: str
    num_prefix_tokens: int  # CLS / register tokens at the front of the first block's input
    blocks: list[tuple[str, nn.Module]]  # all transformer blocks in order (diagnostics: κ of each input)
    mask_owner: nn.Module | None = None  # forward receives the padding mask
    mask_arg: tuple[str, int] | None = None  # (kwarg name, positional index) of that mask
    channels_first: bool = False  # blocks receive (B, C, H, W) maps (DaViT): X = x.flatten(2).transpose(1, 2)
    # why position=before_pos_embed is not a separate reading here (no absolute positions are added to the tokens
    # before the first block, so it hooks the same X); empty where it is (ViT, XCiT, BERT, GPT-2, crammed BERT)
    no_pos_embed: str = ""


AttentionFinder = Callable[[str, nn.Module], "AttentionSite | None"]
TokenFinder = Callable[[str, nn.Module], "TokenSite | None"]
ATTENTION_LAYOUTS: dict[str, AttentionFinder] = {}
TOKEN_LAYOUTS: dict[str, TokenFinder] = {}
PRIORITY: dict[tuple[str, str], int] = {}  # (registry, layout name) -> priority; higher is tried first


def _register(registry: dict, kind: str, name: str, priority: int):
    def deco(fn):
        if name in registry:
            raise ValueError(f"{kind} layout {name!r} is registered twice")
        registry[name] = fn
        PRIORITY[(kind, name)] = int(priority)
        return fn

    return deco


def attention_layout(name: str, priority: int = 0):
    """Register an attention finder. `priority` breaks ties when two finders could match one module (the more
    specific one gets the higher number); finders that match disjoint explicit types can all keep 0."""
    return _register(ATTENTION_LAYOUTS, "attention", name, priority)


def token_layout(name: str, priority: int = 0):
    """Register a token finder (see attention_layout for `priority`)."""
    return _register(TOKEN_LAYOUTS, "token", name, priority)


def _ordered(registry: dict, kind: str) -> list:
    names = sorted(registry, key=lambda n: (-PRIORITY[(kind, n)], n))
    return [registry[n] for n in names]


def find_attention(model: nn.Module) -> list[AttentionSite]:
    """Every attention module of `model` that some registered layout recognises, in module order."""
    finders = _ordered(ATTENTION_LAYOUTS, "attention")
    sites = []
    for name, module in model.named_modules():
        for finder in finders:
            site = finder(name, module)
            if site is not None:
                sites.append(site)
                break
    return sites


def find_tokens(model: nn.Module) -> TokenSite | None:
    """The outermost sub-model whose first-block input a registered layout recognises."""
    finders = _ordered(TOKEN_LAYOUTS, "token")
    for name, module in model.named_modules():
        for finder in finders:
            site = finder(name, module)
            if site is not None:
                return site
    return None


def join(prefix: str, name: str) -> str:
    """A submodule's dotted name under `prefix` (the empty prefix: the model itself)."""
    return f"{prefix}.{name}" if prefix else name


def stacked(lin: nn.Module, heads: int, order: tuple[int, int, int] = (0, 1, 2)) -> tuple[int, dict[str, Projection]]:
    """Roles of a fused Linear whose output is block-stacked in three equal chunks; `order[i]` is the chunk that
    plays role ROLES[i]. Returns (head_dim, projections)."""
    a = lin.out_features // 3
    if a * 3 != lin.out_features or a % heads:
        raise ValueError(f"fused qkv with {lin.out_features} outputs does not split into 3 × {heads} heads")
    return a // heads, {r: Projection(lin, slice(order[i] * a, (order[i] + 1) * a)) for i, r in enumerate(ROLES)}


def separate(lins: tuple[nn.Module, nn.Module, nn.Module]) -> dict[str, Projection]:
    """Roles of three separate Linears (W_Q, W_K, W_V), each using all its output columns."""
    return {r: Projection(lin, slice(0, lin.out_features)) for r, lin in zip(ROLES, lins)}


def is_class(m: nn.Module, module: str, qualname: str) -> bool:
    """`type(m)` is exactly the class `module.qualname`, without importing that module."""
    t = type(m)
    return t.__module__ == module and t.__qualname__ == qualname
