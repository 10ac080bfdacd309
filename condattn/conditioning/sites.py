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
    # or any module computing x @ W + b whose output columns hold the role (Conv1D: see transposed; a pointwise
    # nn.Conv1d / nn.Conv2d, kernel 1 and groups 1, whose output channels hold it: its weight's (out, in) view)
    linear: nn.Linear
    # output columns of `linear` that hold this role, all heads, head-major: a slice, or a LongTensor of rows where
    # the roles are interleaved per head (GPT-NeoX / BLOOM `query_key_value`: `interleaved`)
    cols: slice | torch.Tensor
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
        if isinstance(self.cols, slice):
            return self.cols.stop - (self.cols.start or 0)
        return int(self.cols.numel())

    @property
    def rows(self) -> torch.Tensor:
        """The output rows of `linear` that hold this role, as an index (a slice's range, or the index of an
        interleaved layout, where `cols` is a LongTensor of rows: `interleaved`)."""
        if isinstance(self.cols, slice):
            return torch.arange(self.cols.start or 0, self.cols.stop, device="cpu")  # an index: CPU, also under meta
        return self.cols


def stored_weight(p: Projection) -> torch.Tensor:
    """The parameter that holds a projection's weight (never the W + λI an SCA fold puts in its place during a
    forward of a module that reads the weight itself)."""
    params = p.linear._parameters
    return params[p.param] if p.param in params else getattr(p.linear, p.param)


def as_matrix(w: torch.Tensor) -> torch.Tensor:
    """The (out, in) view of a projection weight: a pointwise convolution's (out, in, 1, …) weight flattened (a view,
    so writes reach the parameter), a Linear's as it is."""
    return w.flatten(1) if w.dim() > 2 else w


def is_pointwise_conv(m: nn.Module) -> bool:
    """A plain nn.Conv1d / nn.Conv2d (or SCA's shifted one) with kernel 1 and groups 1: a Linear over the channels at
    every position."""
    plain = type(m) in (nn.Conv1d, nn.Conv2d) or getattr(type(m), "_condattn_shifted_conv", False)
    return plain and all(k == 1 for k in m.kernel_size) and m.groups == 1


def out_features(m: nn.Module) -> int:
    """Output width of a projection (Linear / Conv1D's out_features, a pointwise convolution's out_channels)."""
    return int(m.out_features) if hasattr(m, "out_features") else int(m.out_channels)


def shift_of(p: Projection):
    """The SCA shift (spectral.SpectralShift) attached to a projection's weight, or None."""
    if p.param == "weight":
        return getattr(p.linear, "_condattn_shift", None)
    return getattr(p.linear, "_condattn_shifts", {}).get(p.param)


def is_conv1d(m: nn.Module) -> bool:
    """transformers' `Conv1D` (GPT-2): a Linear whose weight is stored (in, out)."""
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers")


@dataclass
class OutputProjection:
    """An attention layer's output projection W_O: the module applied to the heads' merged output."""

    module: nn.Module  # the Linear (or Conv1D) computing W_O
    name: str = ""  # its dotted name in the model ('' in a layout: filled in where it is found)
    transposed: bool = False  # Conv1D: weight stored (in, out)
    called: bool = True  # False: the attention module reads its weight itself (nn.MultiheadAttention's out_proj)
    how: str = "named by its layout"  # how it was found (traced.py), for the report

    def weight(self) -> torch.Tensor:
        """The stored parameter (torch layout (out, in) unless transposed)."""
        return self.module.weight


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
    # the reading this site is patched under, where the layout states one (PatchReport entry detail)
    note: str = ""
    # roles the layer has no projection for, each with why (GCViT's global attention: no W_Q, its queries are the
    # stage's global query tokens). `proj` then lacks them: methods act on the roles it holds or skip the site with
    # that reason, diagnostics of a missing role are absent with it (never NaN)
    missing: dict[str, str] = field(default_factory=dict)
    # the output projection W_O where the layout names it; None: found by a traced call when a method needs it
    # (methods/common.output_projection)
    out: OutputProjection | None = None
    out_why: str = ""  # why no W_O was found (set with out=None once it was looked for)
    # how the head count was found where the module names none (traced.find_heads), or why none was: then
    # num_heads is 1 and head_dim the whole width, and methods that need heads refuse the site with this reason
    heads_found: str = ""
    heads_unknown: str = ""

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this site has a projection for, in ROLES order (all three except where `missing` says)."""
        return tuple(r for r in ROLES if r in self.proj)

    def lacks(self, *roles: str) -> str:
        """Why this site has no projection for one of `roles` ('' when it has all of them)."""
        gone = [r for r in roles if r not in self.proj]
        return "; ".join(f"no W_{r.upper()}: {self.missing.get(r, 'the layout found none')}" for r in gone)

    def absent(self) -> dict[str, str]:
        """{role: why} for each role this site has no projection for (the diagnostics' "absent" entry)."""
        return {r: self.lacks(r) for r in ROLES if r not in self.proj}

    def _proj(self, role: str) -> Projection:
        if role not in self.proj:
            raise KeyError(f"{self.name} ({self.layout}) has {self.lacks(role)}")
        return self.proj[role]

    def weight(self, role: str, effective: bool = True) -> torch.Tensor:
        """torch-layout weight (heads*head_dim, D_in) of one role; `effective` includes an SCA correction (W + C)."""
        p = self._proj(role)
        w = as_matrix(stored_weight(p).detach())
        if p.transposed:  # Conv1D stores (in, out): back to torch layout, where delta_weight() lives
            w = w.T
        shift = shift_of(p)
        if effective and shift is not None:
            w = w + shift.delta_weight(w).to(w)
        return w[p.cols]

    def role_head_dim(self, role: str) -> int:
        """One head's width in this role: head_dim for q and k; value heads may be wider (d_v = r·d, LeViT /
        EfficientFormer style), as many as k's heads (fewer than q's under grouped-query attention)."""
        if role == "v" and "k" in self.proj:
            return self.proj["v"].out_features // max(self.proj["k"].out_features // self.head_dim, 1)
        return self.head_dim

    def head_weight(self, role: str, head: int, effective: bool = True) -> torch.Tensor:
        d = self.role_head_dim(role)
        return self.weight(role, effective)[head * d : (head + 1) * d]

    def grad(self, role: str) -> torch.Tensor | None:
        p = self._proj(role)
        g = stored_weight(p).grad
        g = None if g is None else as_matrix(g)
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
    # the mask owner's mask is True at padding (torch's src_key_padding_mask), not at real tokens
    mask_marks_padding: bool = False
    # blocks receive (N, B, D) (nn.TransformerEncoder built without batch_first): X is read as (B, N, D)
    sequence_first: bool = False
    # the blocks' attention masks later keys (a decoder that says so only in its kernel call, found by a trace)
    causal: bool = False
    # {option: why it cannot be read here} for a site found by structure ("position": no token embedding known
    # before positions; "tokens": no prefix count known): CET refuses those options' other values with why
    unknown: dict[str, str] = field(default_factory=dict)
    found: str = ""  # how the site was found, where a structural finder found it (the report entry's detail)


AttentionFinder = Callable[[str, nn.Module], "AttentionSite | None"]
TokenFinder = Callable[[str, nn.Module], "TokenSite | None"]
ATTENTION_LAYOUTS: dict[str, AttentionFinder] = {}
TOKEN_LAYOUTS: dict[str, TokenFinder] = {}
PRIORITY: dict[tuple[str, str], int] = {}  # (registry, layout name) -> priority; higher is tried first


def _register(registry: dict, kind: str, name: str, priority: int, replace: bool = False):
    def deco(fn):
        if name in registry and not replace:
            raise ValueError(f"{kind} layout {name!r} is registered twice; pass replace=True to replace it (e.g. "
                             f"when rerunning a notebook cell: @{kind}_layout({name!r}, replace=True))")
        registry[name] = fn
        PRIORITY[(kind, name)] = int(priority)
        return fn

    return deco


def attention_layout(name: str, priority: int = 0, replace: bool = False):
    """Register an attention finder. `priority` breaks ties when two finders could match one module (the more
    specific one gets the higher number); finders that match disjoint explicit types can all keep 0. `replace=True`
    replaces a finder of the same name (rerunning a notebook cell); without it a second registration is refused."""
    return _register(ATTENTION_LAYOUTS, "attention", name, priority, replace)


def token_layout(name: str, priority: int = 0, replace: bool = False):
    """Register a token finder (see attention_layout for `priority` and `replace`)."""
    return _register(TOKEN_LAYOUTS, "token", name, priority, replace)


def _ordered(registry: dict, kind: str) -> list:
    names = sorted(registry, key=lambda n: (-PRIORITY[(kind, n)], n))
    return [registry[n] for n in names]


def find_attention(model: nn.Module) -> list[AttentionSite]:
    """Every attention module of `model` that some registered layout recognises, in module order."""
    finders = _ordered(ATTENTION_LAYOUTS, "attention")
    sites: list[AttentionSite] = []
    claimed: set[int] = set()  # projections already owned by a site (a module inside a matched one is not a 2nd)
    for name, module in model.named_modules():
        for finder in finders:
            found = finder(name, module)
            if found is not None:  # one site, or a list: one per head of a layer (layer_of names them)
                for site in found if isinstance(found, list) else [found]:
                    ids = {id(p.linear) for p in site.proj.values()}
                    if not ids & claimed:
                        sites.append(site)
                        claimed |= ids
                break
    return sites


def layer_of(site_name: str) -> str:
    """The attention layer a site belongs to: its name, or the part before `#` for a site that is one head of a
    layer whose heads have projections of their own (EfficientViT-MSRA: `...attn#h0`)."""
    return site_name.partition("#")[0]


def find_tokens(model: nn.Module) -> TokenSite | None:
    """The outermost sub-model whose first-block input a registered layout recognises; the fallbacks (negative
    priority: layouts/structural_tokens.py) only where no other layout recognises any sub-model."""
    names = sorted(TOKEN_LAYOUTS, key=lambda n: (-PRIORITY[("token", n)], n))
    for fallback in (False, True):
        finders = [TOKEN_LAYOUTS[n] for n in names if (PRIORITY[("token", n)] < 0) == fallback]
        for name, module in model.named_modules():
            for finder in finders:
                site = finder(name, module)
                if site is not None:
                    return site
    return None


def join(prefix: str, name: str) -> str:
    """A submodule's dotted name under `prefix` (the empty prefix: the model itself)."""
    return f"{prefix}.{name}" if prefix else name


def feature_stages(m: nn.Module, attr: str, stage_type: type) -> list[tuple[str, nn.Module]] | None:
    """The stages of a hierarchical timm model as the FeatureListNet / FeatureDictNet of `features_only=True` holds
    them: its own children `{attr}_0`, `{attr}_1`, ... (the model's `{attr}[i]`, flattened), in order; None if `m`
    is not such a wrapper."""
    wrapper = any(c.__module__ == "timm.models._features" and c.__name__ == "FeatureDictNet" for c in type(m).__mro__)
    if not wrapper or type(m._modules.get(f"{attr}_0")) is not stage_type:
        return None
    return [(k, v) for k, v in m.items() if k.startswith(f"{attr}_") and type(v) is stage_type]


def stacked(lin: nn.Module, heads: int, order: tuple[int, int, int] = (0, 1, 2)) -> tuple[int, dict[str, Projection]]:
    """Roles of a fused Linear whose output is block-stacked in three equal chunks; `order[i]` is the chunk that
    plays role ROLES[i]. Returns (head_dim, projections)."""
    out = out_features(lin)
    a = out // 3
    if a * 3 != out or a % heads:
        raise ValueError(f"fused qkv with {out} outputs does not split into 3 × {heads} heads")
    return a // heads, {r: Projection(lin, slice(order[i] * a, (order[i] + 1) * a)) for i, r in enumerate(ROLES)}


def interleaved(lin: nn.Module, heads: int, widths: tuple[int, int, int] | None = None) -> tuple[int, dict]:
    """Roles of a fused Linear whose output is interleaved per head: [q_0; k_0; v_0; q_1; k_1; v_1; ...] (GPT-NeoX,
    BLOOM `query_key_value`: the output is viewed (…, heads, 3·head_dim)). `widths` (default: equal thirds) gives
    the q, k, v rows of one head where they differ. Returns (q head_dim, projections whose `cols` index the rows)."""
    per_head = out_features(lin) // heads
    widths = widths or (per_head // 3,) * 3
    if per_head * heads != out_features(lin) or sum(widths) != per_head or min(widths) <= 0:
        raise ValueError(f"fused qkv with {out_features(lin)} outputs does not interleave {heads} heads of widths "
                         f"{list(widths)}")
    offsets = [sum(widths[:i]) for i in range(3)]
    proj = {}
    for r, off, w in zip(ROLES, offsets, widths):
        rows = torch.cat([torch.arange(h * per_head + off, h * per_head + off + w, device="cpu")
                          for h in range(heads)])
        proj[r] = Projection(lin, rows)
    return widths[0], proj


def separate(lins: tuple[nn.Module, nn.Module, nn.Module]) -> dict[str, Projection]:
    """Roles of three separate Linears (W_Q, W_K, W_V), each using all its output columns."""
    return {r: Projection(lin, slice(0, out_features(lin))) for r, lin in zip(ROLES, lins)}


def is_class(m: nn.Module, module: str, qualname: str) -> bool:
    """`type(m)` is exactly the class `module.qualname`, without importing that module."""
    t = type(m)
    return t.__module__ == module and t.__qualname__ == qualname


def of_library(m: nn.Module, package: str) -> bool:
    """Whether `type(m)` or one of its bases is defined in `package` (a top-level name: "timm", "transformers"), read
    from the classes' module names, never importing it. Every layout finder of an optional library asks this before
    it imports that library: a model built without it cannot hold its classes, and the library needs torch alone."""
    prefix = package + "."
    return any(c.__module__ == package or c.__module__.startswith(prefix) for c in type(m).__mro__)


# the norms a module applies to q and k after W_Q / W_K: Qwen3, Gemma 3, OLMo 2 and timm's qk_norm=True (q_norm,
# k_norm), Persimmon / StableLM (q_layernorm, k_layernorm)
QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_norm", "key_norm"))


def qk_norms(m: nn.Module) -> dict[str, tuple[str, nn.Module]]:
    """{role: (child name, norm module)} for the q / k norms `m` applies after its projections; {} when it has none
    (an nn.Identity is none: timm's qk_norm=False)."""
    for names in QK_NORMS:
        found = {r: (n, c) for r, n in zip("qk", names)
                 if isinstance(c := getattr(m, n, None), nn.Module) and not isinstance(c, nn.Identity)}
        if found:
            return found
    return {}


# ---------------------------------------------------------------- strictness: attention layers no layout matched

# class names that say "attention" but are channel / spatial gates of convolutional nets, not token attention
GATES = frozenset({"SplitAttn", "SelectiveKernelAttn", "ChannelAttn", "SpatialAttn", "LightChannelAttn",
                   "LightSpatialAttn", "CbamModule", "LightCbamModule", "EcaModule", "CecaModule"})


def _attention_named(m: nn.Module) -> bool:
    n = type(m).__name__
    low = n.lower()
    named = n not in GATES and ("attention" in low or low.endswith("attn"))
    return isinstance(m, nn.MultiheadAttention) or named or bool(refusal(m))  # (a refused class is attention too)


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention layers of `model` by what the module says it is, independently of the layouts: the innermost
    modules whose class name says attention (…Attention, …Attn, nn.MultiheadAttention) and that hold parameters,
    convolutional gates (GATES) excepted."""
    cand = [(n, m) for n, m in model.named_modules() if _attention_named(m) and next(m.parameters(), None) is not None]
    names = [n for n, _ in cand]
    return [(n, m) for n, m in cand if not any(o != n and (not n or o.startswith(n + ".")) for o in names)]


def _covers(site: str, layer: str) -> bool:
    site = layer_of(site)
    return site == layer or not layer or not site or site.startswith(layer + ".") or layer.startswith(site + ".")


def unmatched_attention(model: nn.Module, sites: list[AttentionSite]) -> list[tuple[str, nn.Module]]:
    """Attention layers (attention_layers) that no site lies at, inside or around."""
    return [(n, m) for n, m in attention_layers(model) if not any(_covers(s.name, n) for s in sites)]


ROLE_NAMES = {  # child names that say which role a projection holds (the structural layout's, and a few more)
    "q": ("q", "query", "q_proj", "to_q", "wq", "q_lin", "query_proj", "linear_q", "w_q"),
    "k": ("k", "key", "k_proj", "to_k", "wk", "k_lin", "key_proj", "linear_k", "w_k"),
    "v": ("v", "value", "v_proj", "to_v", "wv", "v_lin", "value_proj", "linear_v", "w_v"),
}
FUSED_NAMES = ("qkv", "c_attn", "wqkv", "qkv_proj", "to_qkv", "w_pack", "query_key_value", "in_proj")


def layout_snippet(m: nn.Module) -> str:
    """The user-side registration for an unmatched attention class (docs/getting-started.md, "Register a layout for
    your own model"). It names only submodules the class really has: a fused projection or q/k/v children found by
    their names, else placeholders (YOUR_W_Q, ...) with the class's actual Linear / 1×1-conv children listed."""
    t = type(m)
    lay = "my_" + t.__name__.lower()
    lins = [n for n, c in m.named_children() if isinstance(c, nn.Linear) or is_pointwise_conv(c)]
    fused = [n for n in lins if n.lower() in FUSED_NAMES]
    found = {r: next((n for n in lins if n.lower() in names), None) for r, names in ROLE_NAMES.items()}
    heads = next((a for a in HEADS if isinstance(getattr(m, a, None), int)), None)
    h = f"m.{heads}" if heads else "YOUR_NUM_HEADS"
    note = "" if heads else "  # no head count found on the module: give it"
    if fused:
        roles = f"stacked(m.{fused[0]}, {h})  # or interleaved(...) when the output is per head [q;k;v]"
        body = [f"head_dim, proj = {roles}", f"return AttentionSite(name, m, {lay!r}, {h}, head_dim, proj){note}"]
    else:
        names = [f"m.{found[r]}" if found[r] else f"m.YOUR_W_{r.upper()}" for r in ROLES]
        what = "the Linears holding W_Q, W_K, W_V"
        if not all(found.values()):
            what = f"name {what}: its Linear / 1×1-conv children are {lins or 'none'}"
        body = [f"proj = separate(({', '.join(names)}))  # {what}",
                f"return AttentionSite(name, m, {lay!r}, {h}, proj['q'].out_features // {h}, proj){note}"]
    return (f"    from condattn.conditioning import AttentionSite, attention_layout, separate, stacked, interleaved\n"
            f"    from {t.__module__} import {t.__qualname__.split('.')[0]}\n\n"
            f"    @attention_layout({lay!r})\n    def {lay}(name, m):\n"
            f"        if type(m) is not {t.__qualname__}:\n            return None\n"
            + "\n".join("        " + line for line in body))


HEADS = ("num_heads", "num_attention_heads", "n_head", "n_heads", "heads", "num_head", "attention_heads")
UNSUPPORTED_WHY: dict[type, str] = {}  # class -> one line why no layout can patch it (filled by layouts/structural)


# (module, qualname) -> why no layout may patch that class (or a function of the instance returning it, '' when this
# instance can be patched): attention without q·kᵀ logits or one W per role (layouts/refused.py). Never matched.
REFUSED: dict[tuple[str, str], str | Callable[[nn.Module], str]] = {}


def refusal(m: nn.Module) -> str:
    """Why `m`'s class (or this instance) is refused by REFUSED, or ''."""
    why = REFUSED.get((type(m).__module__, type(m).__qualname__), "")
    return why(m) if callable(why) else why


def why_unmatched(m: nn.Module) -> str:
    """One line: why `m` was not matched (a refusal, or a structural finder's reason where it recorded one)."""
    return refusal(m) or UNSUPPORTED_WHY.get(type(m), "no layout recognises it: its W_Q/W_K/W_V are not q/k/v (or "
                                                      "fused qkv) Linear children with a head count on the module")


# checks every matched site passes before anything is written: (site) -> (the site, possibly re-read, or None when
# refused; what the check found). verify.py registers the probe of sites matched by structure alone.
SITE_CHECKS: list[Callable[[AttentionSite], tuple[AttentionSite | None, str]]] = []


def verified(sites: list[AttentionSite]) -> tuple[list[AttentionSite], list[AttentionSite]]:
    """(the sites kept, the sites refused) by SITE_CHECKS: each note says how the site was matched and verified, a
    refused one's class gets the reason (why_unmatched)."""
    kept, refused = [], []
    for site in sites:
        checked, words = site, ""
        for check in SITE_CHECKS:
            checked, words = check(checked)
            if checked is None:
                break
        if checked is None:
            UNSUPPORTED_WHY[type(site.module)] = words
            refused.append(site)
            continue
        if words:
            checked.note = f"{checked.note}; {words}" if checked.note else words
        kept.append(checked)
    return kept, refused


def require_heads(sites: list[AttentionSite], method: str, model: nn.Module) -> None:
    """Refuse, in one line, a method that needs each layer's head count where some site's is unknown."""
    unknown = [s for s in sites if s.heads_unknown]
    if unknown:
        s = unknown[0]
        raise ValueError(f"{method}: {len(unknown)} of {len(sites)} attention layers of {type(model).__name__} have no "
                         f"head count, which {method} needs (e.g. {s.name or '<model>'}, "
                         f"{type(s.module).__name__}: {s.heads_unknown}); nothing was changed. Give the module a "
                         f"`num_heads` attribute, or register a layout naming it (docs/getting-started.md, 'Register "
                         "a layout for your own model')")


def require_attention(model: nn.Module, method: str, partial: bool = False,
                      heads: bool = True) -> tuple[list[AttentionSite], list[str]]:
    """The attention sites of `model`, or a refusal that names every unmatched attention class, why, and the
    `attention_layout(...)` registration for it. `partial=True` accepts unmatched layers (returned as warnings).
    `heads=False`: the method needs no head count (SCA's λI over whole weights), so a site whose head count could
    not be found is kept; otherwise such a site refuses the call (require_heads)."""
    sites, refused = verified(find_attention(model))
    if heads:
        require_heads(sites, method, model)
    missing = unmatched_attention(model, sites)
    missing += [(s.name, s.module) for s in refused if not any(n == s.name for n, _ in missing)]
    if sites and (not missing or partial):
        warn = []
        if missing:
            classes = sorted({type(m).__qualname__ for _, m in missing})
            warn.append(f"partial=True: {method} patched {len(sites)} attention layers and left {len(missing)} "
                        f"unmatched ({', '.join(classes)})")
        return sites, warn
    kind = type(model).__name__
    if not missing:
        raise ValueError(f"{method}: {kind} has no attention layer: no module's class says attention and no layout "
                         "matches one (nothing was changed). If it has attention under another name, register a layout "
                         "for it with condattn.conditioning.attention_layout (docs/getting-started.md, 'Register a "
                         "layout for your own model')")
    by_class: dict[type, list[str]] = {}
    for n, m in missing:
        by_class.setdefault(type(m), []).append(n)
    lines = [f"{method}: {len(missing)} of {len(missing) + len(sites)} attention layers of {kind} are not matched "
             f"by any layout (nothing was changed; partial=True patches the {len(sites)} matched ones):"]
    for cls, names in by_class.items():
        m = dict(model.named_modules())[names[0]]
        lines.append(f"  {cls.__module__}.{cls.__qualname__} ({len(names)}×, e.g. {names[0] or '<model>'}): "
                     f"{why_unmatched(m)}")
    open_ = [names[0] for names in by_class.values() if not refusal(dict(model.named_modules())[names[0]])]
    if open_:  # (a refused class has no registration that could patch it: no snippet for it)
        lines.append("register it from your code:\n" + layout_snippet(dict(model.named_modules())[open_[0]]))
    raise ValueError("\n".join(lines))


TOKENS_WHY: dict[type, str] = {}  # model class -> why the structural token finder could not decide (its last try)


def token_snippet(model: nn.Module, blocks: str = "YOUR_BLOCKS") -> str:
    """The one registration that names a model's token site (docs/getting-started.md, 'Register a layout ...')."""
    t = type(model).__name__
    return (f"condattn.conditioning.token_layout('{t.lower()}')(lambda name, m: condattn.conditioning.TokenSite("
            f"'{t.lower()}', m.{blocks}[0], '{blocks}.0', None, '', 0, list(m.{blocks}.named_children())) "
            f"if type(m) is {t} else None)")


def require_tokens(model: nn.Module, method: str) -> TokenSite:
    """The token site of `model`, or a refusal naming the fix (a token_layout registration)."""
    site = find_tokens(model)
    if site is None:
        why = TOKENS_WHY.get(type(model), "")
        raise ValueError(
            f"{method}: cannot locate the first transformer block of {type(model).__name__}"
            f"{' (' + why + ')' if why else ''}; nothing was changed. Name it in one line: {token_snippet(model)} "
            "(docs/getting-started.md, 'Register a layout for your own model')")
    return site
