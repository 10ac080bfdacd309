"""`apply_conditioning(model, method, **options) -> PatchReport`: the one entry point for both methods."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .embedded import GRADIENTS, POSITIONS, SOLVERS, TOKENS, EmbeddedTokens
from .layouts.detr import DETR_ATTENTION  # (importing a layout module registers every family's layouts)
from .report import PatchEntry, PatchReport
from .sites import ATTENTION_LAYOUTS, ROLES, TOKEN_LAYOUTS, find_attention, find_tokens
from .spectral import IDENTITY_PLACEMENTS, patch_spectral, unpatch_spectral

METHODS = ("none", "spectral", "embedded", "spectral+embedded")

# Defaults and the meaning of each open choice: configs/conditioning/_options.yaml. The same keys make up the Hydra
# `conditioning/` group, so every option is accepted with every method and ignored where it does not apply.
SPECTRAL_DEFAULTS: dict[str, Any] = {
    "lam": 10.0,  # SCA: the paper's best value of its ablation
    "targets": ("q", "k", "v"),  # which projections get λI (paper: all three)
    "identity": "full",  # open choice: λI_D over the fused block vs the same λI_{D×d} in every head
    # open choice for encoder–decoder models (the papers do not say): which DETR attention kinds get λI (default:
    # all); models whose attention sites carry no kind (every other layout) ignore it
    "detr_attention": DETR_ATTENTION,
}
EMBEDDED_DEFAULTS: dict[str, Any] = {
    "position": "after_pos_embed",  # open choice: X exactly as the first block receives it
    "tokens": "all",  # open choice: prefix (CLS) tokens included in X
    "gradient": "detach",  # open choice: C is a constant in backward
    "solver": "newton_schulz",  # fast, κ ≤ 2.05 (configs/conditioning/_options.yaml says why); svd is exact
    "lift_iters": 8,  # newton_schulz only: quintic steps that lift small singular values
    "ns_iters": 4,  # newton_schulz only: cubic Newton–Schulz steps that converge them to 1
    "power_iters": 20,  # newton_schulz only: power iterations for σ_1
}
NEWTON_SCHULZ_ONLY = ("lift_iters", "ns_iters", "power_iters")
CHOICES = {
    "identity": IDENTITY_PLACEMENTS,
    "position": POSITIONS,
    "tokens": TOKENS,
    "gradient": GRADIENTS,
    "solver": SOLVERS,
}


@dataclass
class _State:
    report: PatchReport
    handles: list = field(default_factory=list)


def _normalise_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    items = list(targets) if not isinstance(targets, str) else list(targets.replace(",", "").replace(" ", ""))
    bad = [t for t in items if t not in ROLES]
    if bad or not items or len(set(items)) != len(items):
        raise ValueError(f"targets={targets!r}: give a non-empty subset of {list(ROLES)}, e.g. targets=[q,k,v]")
    return tuple(r for r in ROLES if r in items)


def _normalise_detr_attention(kinds: str | Iterable[str]) -> tuple[str, ...]:
    items = [kinds] if isinstance(kinds, str) else list(kinds)
    bad = [k for k in items if k not in DETR_ATTENTION]
    if bad or not items or len(set(items)) != len(items):
        raise ValueError(f"detr_attention={kinds!r}: give a non-empty subset of {list(DETR_ATTENTION)}, e.g. "
                         "conditioning.detr_attention=[encoder,decoder_cross] (conditioning=none turns SCA off)")
    return tuple(k for k in DETR_ATTENTION if k in items)


def resolve_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check method and option names/values; return the options that apply to `method` with defaults."""
    if method not in METHODS:
        raise ValueError(f"unknown conditioning method {method!r}; valid methods: {', '.join(METHODS)}")
    known = {**SPECTRAL_DEFAULTS, **EMBEDDED_DEFAULTS}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown conditioning option(s) {unknown}; valid options: {', '.join(known)}")
    opts = {**known, **{k: v for k, v in options.items() if v is not None}}
    for key, choices in CHOICES.items():
        if opts[key] not in choices:
            raise ValueError(f"conditioning option {key}={opts[key]!r} is invalid; choose one of {list(choices)}")
    opts["lam"] = float(opts["lam"])
    opts["targets"] = _normalise_targets(opts["targets"])
    opts["detr_attention"] = _normalise_detr_attention(opts["detr_attention"])
    for key in ("lift_iters", "ns_iters", "power_iters"):
        low = 0 if key == "lift_iters" else 1
        if int(opts[key]) < low:
            raise ValueError(f"conditioning option {key}={opts[key]!r} must be an integer >= {low}")
        opts[key] = int(opts[key])
    applies = {
        "none": [],
        "spectral": list(SPECTRAL_DEFAULTS),
        "embedded": list(EMBEDDED_DEFAULTS),
        "spectral+embedded": [*SPECTRAL_DEFAULTS, *EMBEDDED_DEFAULTS],
    }[method]
    return {k: opts[k] for k in applies}


def apply_conditioning(model: nn.Module, method: str = "none", **options: Any) -> PatchReport:
    """Patch `model` in place with SCA (`spectral`), CET (`embedded`), both, or nothing (`none`).

    No parameters or buffers are added and `state_dict` keys are unchanged, so checkpoints load into a
    patched or unpatched model alike. Returns a PatchReport listing every patched module.
    """
    if getattr(model, "_condattn", None) is not None:
        raise RuntimeError(
            f"model is already conditioned (method={model._condattn.report.method!r}); applying twice would "
            "stack the corrections. Call condattn.remove_conditioning(model) first, or build a fresh model."
        )
    opts = resolve_options(method, options)
    # the report (printed, patch_report.json, summary.json) lists only the options that act on this model
    report = PatchReport(method=method, options=dict(opts))
    if opts.get("solver") == "svd":  # the iteration counts belong to the newton_schulz solver
        for key in NEWTON_SCHULZ_ONLY:
            report.options.pop(key, None)
    state = _State(report)

    if "spectral" in method:
        sites = find_attention(model)
        if not sites:
            raise ValueError(
                f"spectral: no attention module of {type(model).__name__} matches a known layout "
                f"({', '.join(ATTENTION_LAYOUTS)}); add one in condattn/conditioning/layouts/"
            )
        if all(s.group is None for s in sites):  # no attention kinds to select (every model but DETR)
            report.options.pop("detr_attention", None)
        kinds = opts["detr_attention"]
        skipped = [s for s in sites if s.group is not None and s.group not in kinds]
        sites = [s for s in sites if s.group is None or s.group in kinds]
        handles, patched = patch_spectral(sites, opts["lam"], opts["targets"], opts["identity"])
        state.handles += handles
        for site in skipped:  # counted against the model config's attention_layers by PatchReport.check
            report.skipped.append(PatchEntry(site.name, f"spectral:{site.layout}",
                                             f"{site.group} not in detr_attention={list(kinds)}"))
        for site in sites:
            detail = f"{'/'.join(patched[site.name])} heads={site.num_heads}x{site.head_dim}"
            report.entries.append(PatchEntry(site.name, f"spectral:{site.layout}", detail))

    if "embedded" in method:
        site = find_tokens(model)
        if site is None:
            raise ValueError(
                f"embedded: cannot locate the first transformer block of {type(model).__name__} "
                f"(known layouts: {', '.join(TOKEN_LAYOUTS)}); add one in condattn/conditioning/layouts/"
            )
        solver_opts = {k: opts[k] for k in ("solver", "gradient", "lift_iters", "ns_iters", "power_iters")}
        hook = EmbeddedTokens(site, opts["position"], opts["tokens"], **solver_opts)
        state.handles += hook.attach()
        where = site.first_block_name + " input" if opts["position"] == "after_pos_embed" else site.embed_name
        report.entries.append(PatchEntry(where, f"embedded:{site.layout}", f"prefix_tokens={site.num_prefix_tokens}"))

    model._condattn = state
    return report


def remove_conditioning(model: nn.Module) -> None:
    """Undo `apply_conditioning` (hooks removed, model as built)."""
    state = getattr(model, "_condattn", None)
    if state is None:
        return
    for h in state.handles:
        h.remove()
    unpatch_spectral(model)
    model._condattn = None


def conditioning_report(model: nn.Module) -> PatchReport | None:
    state = getattr(model, "_condattn", None)
    return None if state is None else state.report
