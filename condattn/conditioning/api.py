"""`apply_conditioning(model, method, **options) -> PatchReport`: the one entry point for both methods."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .embedded import EmbeddedTokens
from .initialise import conditioned_init
from .report import PatchEntry, PatchReport
from .sites import require_attention, require_tokens
from .spec import EMBEDDED_OPTIONS, METHODS, SPECTRAL_OPTIONS, ConditioningSpec, conditioning_spec, method_spec
from .spectral import UNSHIFTED, NotScriptable, patch_spectral, unpatch_spectral

__all__ = ["EMBEDDED_DEFAULTS", "METHODS", "SPECTRAL_DEFAULTS", "apply_conditioning", "conditioning_report",
           "remove_conditioning"]

# Every method's options, defaults, checks and which of them act: spec.py (ConditioningSpec). Defaults and the meaning
# of each open choice: configs/conditioning/_options.yaml.
SPECTRAL_DEFAULTS: dict[str, Any] = dict(SPECTRAL_OPTIONS)
INIT_ONLY = ("conditioned_init", "mimetic_init")  # methods that only set weights once: nothing to remove
EMBEDDED_DEFAULTS: dict[str, Any] = dict(EMBEDDED_OPTIONS)


@dataclass
class _State:
    report: PatchReport
    handles: list = field(default_factory=list)


def apply_conditioning(model: nn.Module, method: str | ConditioningSpec = "none", *, partial: bool = False,
                       **options: Any) -> PatchReport:
    """Patch `model` in place with SCA (`spectral`), CET (`embedded`), both, the follow-up's `conditioned_init`, or
    nothing (`none`), or any method registered in spec.py. `method` may be a ConditioningSpec (then no options).
    Options and the readings they select: configs/conditioning/_options.yaml.

    No parameters or buffers are added and `state_dict` keys are unchanged, so checkpoints load into a
    patched or unpatched model alike. `spectral` with mode=init and `conditioned_init` change the weights' values
    once (the report's notes say so) and attach nothing. Returns a PatchReport listing every patched module.

    Atomic and strict: every attention site and the token site the method needs are found before the model is
    touched, and a refusal (an attention layer no layout matches, no token site) leaves it exactly as it was.
    `partial=True` accepts attention layers no layout matches (for every method); the report then carries a
    warning.
    """
    if getattr(model, "_condattn", None) is not None:
        raise RuntimeError(
            f"model is already conditioned (method={model._condattn.report.method!r}); applying twice would "
            "stack the corrections. Call condattn.remove_conditioning(model) first, or build a fresh model."
        )
    spec = conditioning_spec(method, **options) if isinstance(method, ConditioningSpec) else \
        conditioning_spec(method=method, **options)
    method, opts = spec.method, spec.values
    # the report (printed, patch_report.json, summary.json) lists only the options that act on this model
    report = PatchReport(method=method, options=spec.options)
    state = _State(report)
    # plan: every site is found, or the call refused, before anything is written to the model
    per_layer = next((m for m in ("spectral", "conditioned_init") if spec.uses(m)), None)
    planned, warnings = require_attention(model, per_layer, partial) if per_layer else ([], [])
    tokens = require_tokens(model, "embedded") if spec.uses("embedded") else None
    report.warnings += warnings
    with _atomic(model, state):  # an error while patching undoes what was attached
        if spec.uses("spectral"):
            sites = planned
            report.options = spec.on_model(site_kinds=any(s.group is not None for s in sites))
            sites = _selected(sites, opts["detr_attention"], "spectral", report)
            sites = _with_roles(sites, opts["targets"], "spectral", report)
            handles, patched = patch_spectral(sites, opts["lam"], opts["targets"], opts["identity"],
                                              opts["correction"], opts["mode"], opts["lam_unit"],
                                              opts["refresh_every"])
            state.handles += handles
            for site in sites:
                detail = f"{'/'.join(patched[site.name])} heads={site.num_heads}x{site.head_dim}"
                detail += f"; {site.note}" if site.note else ""
                report.entries.append(PatchEntry(site.name, f"spectral:{site.layout}", detail))
            what = "λI" if opts["correction"] == "identity" else "C = σ_max(W)·UVᵀ (Theorem 3.5)"
            if opts["mode"] == "init":
                report.notes.append(f"mode=init: {what} was added to the W_Q/W_K/W_V weights once; the modules are "
                                    "plain Linears, trained and weight-decayed from here (remove_conditioning cannot "
                                    "undo it)")
            elif opts["correction"] == "svd":
                report.notes.append(f"correction=svd: {what} per block, detached, recomputed every "
                                    f"{opts['refresh_every']} optimizer step(s); κ(W + C) ≤ 2.05 asserted")

        if spec.uses("conditioned_init"):
            sites = planned
            report.options = spec.on_model(site_kinds=any(s.group is not None for s in sites))
            sites = _selected(sites, opts["detr_attention"], "conditioned_init", report)
            sites = _with_roles(sites, opts["targets"], "conditioned_init", report)
            done = conditioned_init(sites, opts["targets"], opts["identity"])
            for site in sites:
                detail = f"{'/'.join(done[site.name])} heads={site.num_heads}x{site.head_dim}"
                detail += f"; {site.note}" if site.note else ""
                report.entries.append(PatchEntry(site.name, f"conditioned_init:{site.layout}", detail))
            report.notes.append("conditioned_init: W_Q, W_K set to independent semi-orthogonal matrices per head and "
                                "W_V to the rectangular identity, once; plain Linears trained from here")

        if spec.uses("embedded"):
            site = tokens
            solver_opts = {k: opts[k] for k in ("solver", "gradient", "lift_iters", "ns_iters", "power_iters", "scale")}
            hook = EmbeddedTokens(site, opts["position"], opts["tokens"], **solver_opts)
            state.handles += hook.attach()
            where = site.first_block_name + " input" if opts["position"] == "after_pos_embed" else site.embed_name
            detail = f"prefix_tokens={site.num_prefix_tokens}" + (" scale=norm" if opts["scale"] == "norm" else "")
            if opts["position"] == "before_pos_embed" and site.no_pos_embed:
                report.notes.append("position=before_pos_embed is the same X as after_pos_embed here: "
                                    + site.no_pos_embed)
            report.entries.append(PatchEntry(where, f"embedded:{site.layout}", detail))

        for part in spec.parts:  # methods registered with their own patch (spec.py)
            if (apply := method_spec(part).apply) is not None:
                state.handles += list(apply(model, spec, report, partial=partial) or [])

    model._condattn = state
    if state.handles or any(type(m) in UNSHIFTED for m in model.modules()):  # attached: TorchScript refused
        model.__prepare_scriptable__ = NotScriptable(method)
    return report


@contextmanager
def _atomic(model: nn.Module, state: _State):
    """Undo the hooks and projection patches attached so far when patching raises (nothing is left half-applied)."""
    try:
        yield
    except BaseException:
        for h in state.handles:
            h.remove()
        unpatch_spectral(model)
        raise


def _selected(sites: list, kinds: tuple[str, ...], method: str, report: PatchReport) -> list:
    """The sites whose attention kind is selected by detr_attention; the others are listed as skipped."""
    for site in sites:
        if site.group is not None and site.group not in kinds:  # counted against attention_layers by check()
            report.skipped.append(PatchEntry(site.name, f"{method}:{site.layout}",
                                             f"{site.group} not in detr_attention={list(kinds)}"))
    return [s for s in sites if s.group is None or s.group in kinds]


def _with_roles(sites: list, targets: tuple[str, ...], method: str, report: PatchReport) -> list:
    """The sites holding at least one target role; the others (e.g. targets=[q] on GCViT's global attention, which
    has no W_Q) are listed as skipped with why. Refused, before anything is changed, when no site holds one."""
    kept = [s for s in sites if any(r in s.proj for r in targets)]
    ids = {id(s) for s in kept}
    if sites and not kept:
        raise ValueError(f"{method}: targets={list(targets)} selects no projection of any attention layer "
                         f"({sites[0].name}: {sites[0].lacks(*targets)}; nothing was changed)")
    for site in sites:
        if id(site) not in ids:
            report.skipped.append(PatchEntry(site.name, f"{method}:{site.layout}",
                                             f"targets={list(targets)}: {site.lacks(*targets)}"))
    return kept


def remove_conditioning(model: nn.Module) -> None:
    """Undo `apply_conditioning` (hooks removed, model as built). Refuses for methods that changed the weights
    themselves (spectral with mode=init, conditioned_init): there is nothing attached to remove."""
    state = getattr(model, "_condattn", None)
    if state is None:
        return
    r = state.report
    if r.method in INIT_ONLY or ("spectral" in r.method and r.options.get("mode") == "init"):
        what = r.method if r.method in INIT_ONLY else "spectral with mode=init"
        raise RuntimeError(f"remove_conditioning: {what} changed the weights themselves (and training has moved them "
                           "since), so there is nothing to remove; rebuild the model, or load its original weights")
    for h in state.handles:
        h.remove()
    unpatch_spectral(model)
    model._condattn = None
    model.__dict__.pop("__prepare_scriptable__", None)


def conditioning_report(model: nn.Module) -> PatchReport | None:
    state = getattr(model, "_condattn", None)
    return None if state is None else state.report
