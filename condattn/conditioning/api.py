"""`apply_conditioning(model, method, **options) -> PatchReport`: the one entry point for both methods."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .embedded import GRADIENTS, POSITIONS, SCALES, SOLVERS, TOKENS, EmbeddedTokens
from .initialise import conditioned_init
from .layouts.detr import DETR_ATTENTION  # (importing a layout module registers every family's layouts)
from .report import PatchEntry, PatchReport
from .sites import ATTENTION_LAYOUTS, ROLES, TOKEN_LAYOUTS, find_attention, find_tokens
from .spectral import CORRECTIONS, IDENTITY_PLACEMENTS, LAM_UNITS, MODES, patch_spectral, unpatch_spectral

METHODS = ("none", "spectral", "embedded", "spectral+embedded", "conditioned_init")

# Defaults and the meaning of each open choice: configs/conditioning/_options.yaml. The same keys make up the Hydra
# `conditioning/` group, so every option is accepted with every method and ignored where it does not apply.
SPECTRAL_DEFAULTS: dict[str, Any] = {
    "lam": 10.0,  # SCA: the paper's best value of its ablation
    "targets": ("q", "k", "v"),  # which projections get λI (paper: all three)
    "identity": "full",  # open choice: λI_D over the fused block vs the same λI_{D×d} in every head
    "correction": "identity",  # the paper's experiments: C = λI; svd: Theorem 3.5's exact C = σ_max(W)·UVᵀ per block
    "mode": "fixed",  # the paper: C never trained; init: C added to the weights once, then trained and decayed
    "lam_unit": "abs",  # λ as given; init_std / sigma_max: λ times the block's std / σ_max at application
    "refresh_every": 1,  # correction=svd: C recomputed after this many weight updates (optimizer steps)
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
    "scale": "keep",  # the paper's X + C; norm: X + C rescaled to ‖X‖_F per sample (κ unchanged)
}
NEWTON_SCHULZ_ONLY = ("lift_iters", "ns_iters", "power_iters")
# conditioned_init reads these of SCA's options (which projections, W_V's placement, DETR's attention kinds)
INIT_OPTIONS = ("targets", "identity", "detr_attention")
CHOICES = {
    "identity": IDENTITY_PLACEMENTS,
    "correction": CORRECTIONS,
    "mode": MODES,
    "lam_unit": LAM_UNITS,
    "scale": SCALES,
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
    for key in ("lift_iters", "ns_iters", "power_iters", "refresh_every"):
        low = 0 if key == "lift_iters" else 1
        try:
            ok = int(opts[key]) == float(opts[key]) and int(opts[key]) >= low
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"conditioning option {key}={opts[key]!r} must be an integer >= {low}")
        opts[key] = int(opts[key])
    applies = {
        "none": [],
        "spectral": list(SPECTRAL_DEFAULTS),
        "embedded": list(EMBEDDED_DEFAULTS),
        "spectral+embedded": [*SPECTRAL_DEFAULTS, *EMBEDDED_DEFAULTS],
        "conditioned_init": list(INIT_OPTIONS),
    }[method]
    return {k: opts[k] for k in applies}


def apply_conditioning(model: nn.Module, method: str = "none", **options: Any) -> PatchReport:
    """Patch `model` in place with SCA (`spectral`), CET (`embedded`), both, the follow-up's `conditioned_init`, or
    nothing (`none`). Options and the readings they select: configs/conditioning/_options.yaml.

    No parameters or buffers are added and `state_dict` keys are unchanged, so checkpoints load into a
    patched or unpatched model alike. `spectral` with mode=init and `conditioned_init` change the weights' values
    once (the report's notes say so) and attach nothing. Returns a PatchReport listing every patched module.
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
    if opts.get("correction") == "identity":  # C is λI: it is never recomputed
        report.options.pop("refresh_every", None)
    elif opts.get("correction") == "svd":  # C = σ_max(W)·UVᵀ: no λ
        for key in ("lam", "lam_unit"):
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
        sites = _selected(sites, opts["detr_attention"], "spectral", report)
        handles, patched = patch_spectral(sites, opts["lam"], opts["targets"], opts["identity"], opts["correction"],
                                          opts["mode"], opts["lam_unit"], opts["refresh_every"])
        state.handles += handles
        for site in sites:
            detail = f"{'/'.join(patched[site.name])} heads={site.num_heads}x{site.head_dim}"
            report.entries.append(PatchEntry(site.name, f"spectral:{site.layout}", detail))
        what = "λI" if opts["correction"] == "identity" else "C = σ_max(W)·UVᵀ (Theorem 3.5)"
        if opts["mode"] == "init":
            report.notes.append(f"mode=init: {what} was added to the W_Q/W_K/W_V weights once; the modules are plain "
                                "Linears, trained and weight-decayed from here (remove_conditioning cannot undo it)")
        elif opts["correction"] == "svd":
            report.notes.append(f"correction=svd: {what} per block, detached, recomputed every "
                                f"{opts['refresh_every']} optimizer step(s); κ(W + C) ≤ 2.05 asserted")

    if method == "conditioned_init":
        sites = find_attention(model)
        if not sites:
            raise ValueError(
                f"conditioned_init: no attention module of {type(model).__name__} matches a known layout "
                f"({', '.join(ATTENTION_LAYOUTS)}); add one in condattn/conditioning/layouts/"
            )
        sites = _selected(sites, opts["detr_attention"], "conditioned_init", report)
        done = conditioned_init(sites, opts["targets"], opts["identity"])
        for site in sites:
            detail = f"{'/'.join(done[site.name])} heads={site.num_heads}x{site.head_dim}"
            report.entries.append(PatchEntry(site.name, f"conditioned_init:{site.layout}", detail))
        report.notes.append("conditioned_init: W_Q, W_K set to independent semi-orthogonal matrices per head and "
                            "W_V to the rectangular identity, once; plain Linears trained from here")

    if "embedded" in method:
        site = find_tokens(model)
        if site is None:
            raise ValueError(
                f"embedded: cannot locate the first transformer block of {type(model).__name__} "
                f"(known layouts: {', '.join(TOKEN_LAYOUTS)}); add one in condattn/conditioning/layouts/"
            )
        solver_opts = {k: opts[k] for k in ("solver", "gradient", "lift_iters", "ns_iters", "power_iters", "scale")}
        hook = EmbeddedTokens(site, opts["position"], opts["tokens"], **solver_opts)
        state.handles += hook.attach()
        where = site.first_block_name + " input" if opts["position"] == "after_pos_embed" else site.embed_name
        detail = f"prefix_tokens={site.num_prefix_tokens}" + (" scale=norm" if opts["scale"] == "norm" else "")
        if opts["position"] == "before_pos_embed" and site.no_pos_embed:
            report.notes.append(f"position=before_pos_embed is the same X as after_pos_embed here: {site.no_pos_embed}")
        report.entries.append(PatchEntry(where, f"embedded:{site.layout}", detail))

    model._condattn = state
    return report


def _selected(sites: list, kinds: tuple[str, ...], method: str, report: PatchReport) -> list:
    """The sites whose attention kind is selected by detr_attention; the others are listed as skipped."""
    for site in sites:
        if site.group is not None and site.group not in kinds:  # counted against attention_layers by check()
            report.skipped.append(PatchEntry(site.name, f"{method}:{site.layout}",
                                             f"{site.group} not in detr_attention={list(kinds)}"))
    return [s for s in sites if s.group is None or s.group in kinds]


def remove_conditioning(model: nn.Module) -> None:
    """Undo `apply_conditioning` (hooks removed, model as built). Refuses for methods that changed the weights
    themselves (spectral with mode=init, conditioned_init): there is nothing attached to remove."""
    state = getattr(model, "_condattn", None)
    if state is None:
        return
    r = state.report
    if r.method == "conditioned_init" or ("spectral" in r.method and r.options.get("mode") == "init"):
        what = "conditioned_init" if r.method == "conditioned_init" else "spectral with mode=init"
        raise RuntimeError(f"remove_conditioning: {what} changed the weights themselves (and training has moved them "
                           "since), so there is nothing to remove; rebuild the model, or load its original weights")
    for h in state.handles:
        h.remove()
    unpatch_spectral(model)
    model._condattn = None


def conditioning_report(model: nn.Module) -> PatchReport | None:
    state = getattr(model, "_condattn", None)
    return None if state is None else state.report
