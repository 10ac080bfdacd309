"""The papers' methods, applied through their MethodSpec like every other: SCA (`spectral`), CET (`embedded`) and the
follow-up's `conditioned_init`. Each has a `plan` (every site found, or the call refused, before anything is
written to the model; a composite plans all its parts first) and an `apply` (returns the handles that undo it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .embedded import EmbeddedTokens
from .initialise import conditioned_init
from .report import PatchEntry, PatchReport
from .sites import qk_norms, require_attention, require_tokens
from .spectral import patch_spectral, unpatch_spectral


class Undo:
    """A handle whose remove() calls `fn(*args)` once."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def remove(self) -> None:
        if self.fn is not None:
            self.fn(*self.args)
            self.fn = None


def plan_attention(method: str, heads=lambda spec: True):
    """The plan of a method on attention sites; `heads(spec)`: whether these options need each layer's head count."""
    def plan(model: nn.Module, spec, partial: bool = False):
        sites, warnings = require_attention(model, method, partial, heads=heads(spec))
        if not any(s.group is not None for s in sites):  # a kind selector set on a model whose sites have no kinds
            for key, value in spec.set_kind_options().items():
                raise ValueError(f"{method}: {key}={list(value)} selects attention kinds, but the attention sites of "
                                 f"{type(model).__name__} carry none (only DETR's do), so it would be ignored; drop "
                                 "it (nothing was changed)")
        return sites, warnings
    return plan


CAUSAL_WHY = "the SVD over the sequence lets each token see later ones"


def plan_tokens(model: nn.Module, spec, partial: bool = False):
    """(the token site, whether the model is a causal decoder). Refused on a causal decoder unless
    causal_leak=accept."""
    site = require_tokens(model, "embedded")
    for key, other in (("position", "before_pos_embed"), ("tokens", "patches_only")):
        if spec[key] == other and key in site.unknown:
            raise ValueError(f"embedded: {key}={other} cannot be read on {type(model).__name__}: "
                             f"{site.unknown[key]}; nothing was changed")
    causal = site.causal or any(getattr(m, "is_causal", False) is True for m in model.modules())
    if causal and spec["causal_leak"] != "accept":
        raise ValueError(f"embedded: refused on the causal decoder {type(model).__name__}: {CAUSAL_WHY} "
                         "(conditioning.causal_leak=accept applies it anyway, and the report says so)")
    return site, causal


def selected(sites: list, kinds: tuple[str, ...], method: str, report: PatchReport) -> list:
    """The sites whose attention kind is selected by detr_attention; the others are listed as skipped."""
    for site in sites:
        if site.group is not None and site.group not in kinds:  # counted against attention_layers by check()
            report.skipped.append(PatchEntry(site.name, f"{method}:{site.layout}",
                                             f"{site.group} not in detr_attention={list(kinds)}"))
    return [s for s in sites if s.group is None or s.group in kinds]


def with_roles(sites: list, targets: tuple[str, ...], method: str, report: PatchReport) -> list:
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


def _sites(method: str, spec, report: PatchReport, planned) -> list:
    sites, warnings = planned
    report.warnings += warnings
    report.options = spec.on_model(site_kinds=any(s.group is not None for s in sites))
    sites = selected(sites, spec["detr_attention"], method, report)
    return with_roles(sites, spec["targets"], method, report)


def _entry(site, method: str, roles: list[str]) -> PatchEntry:
    detail = f"{'/'.join(roles)} heads={site.num_heads}x{site.head_dim}"
    detail += f"; {site.note}" if site.note else ""
    return PatchEntry(site.name, f"{method}:{site.layout}", detail)


def apply_spectral(model: nn.Module, spec, report: PatchReport, partial: bool = False, planned=None) -> list:
    """SCA on every planned site: W + C folded into W_Q/W_K/W_V (mode=fixed), or added to the weights once (init)."""
    opts = spec.values
    sites = _sites("spectral", spec, report, planned)
    try:
        handles, patched = patch_spectral(sites, opts["lam"], opts["targets"], opts["identity"], opts["correction"],
                                          opts["mode"], opts["lam_unit"], opts["refresh_every"])
    except BaseException:
        unpatch_spectral(model)
        raise
    if opts["mode"] != "init":
        handles.append(Undo(unpatch_spectral, model))
    report.entries += [_entry(site, "spectral", patched[site.name]) for site in sites]
    what = "λI" if opts["correction"] == "identity" else "C = σ_max(W)·UVᵀ (Theorem 3.5)"
    if caveat := norm_caveat(sites, opts["targets"], what):
        report.notes.append(caveat)
    if opts["mode"] == "init":
        report.notes.append(f"mode=init: {what} was added to the W_Q/W_K/W_V weights once; the modules are plain "
                            "Linears, trained and weight-decayed from here (remove_conditioning cannot undo it)")
    elif opts["correction"] == "svd":
        report.notes.append(f"correction=svd: {what} per block, detached, recomputed every {opts['refresh_every']} "
                            "optimizer step(s); κ(W + C) ≤ 2.05 asserted")
    return handles


def norm_caveat(sites: list, targets, what: str) -> str:
    """Where SCA's shift lands when the attention normalises q and k after W_Q / W_K (Qwen3's per-head RMSNorm): one
    line for the report, '' when no patched site does."""
    normed = [(s, {r: v for r, v in qk_norms(s.module).items() if r in targets}) for s in sites]
    normed = [(s, n) for s, n in normed if n]
    if not normed:
        return ""
    site, norms = normed[0]
    names = "/".join(f"W_{r.upper()}" for r in norms)
    children = ", ".join(n for n, _ in norms.values())
    norm = next(iter(norms.values()))[1]
    width = getattr(getattr(norm, "weight", None), "shape", (0,))[-1]
    over = "each head's" if width == site.head_dim else "the whole" if width else "its"
    return (f"{len(normed)} of {len(sites)} attention layers normalise q, k after the projections ({children}: "
            f"{type(norm).__name__} over {over} {width or ''} channels, e.g. {site.name}): {what} is added to {names} "
            "before that norm, which then rescales each token's q, k, so the logits see norm(x(W + λI)), not "
            "x(W + λI): the norm removes the λ² growth of the logits, and for large λ the normalised q, k tend to "
            "x's own channels (of each head), normalised; κ(W + λI) is the projection's, not the normalised q's")


def apply_conditioned_init(model: nn.Module, spec, report: PatchReport, partial: bool = False, planned=None) -> list:
    sites = _sites("conditioned_init", spec, report, planned)
    done = conditioned_init(sites, spec["targets"], spec["identity"])
    report.entries += [_entry(site, "conditioned_init", done[site.name]) for site in sites]
    report.notes.append("conditioned_init: W_Q, W_K set to independent semi-orthogonal matrices per head and W_V to "
                        "the rectangular identity, once; plain Linears trained from here")
    return []


SOLVER_OPTIONS = ("solver", "gradient", "lift_iters", "ns_iters", "power_iters", "scale")


def apply_embedded(model: nn.Module, spec, report: PatchReport, partial: bool = False, planned=None) -> list:
    """CET at the planned token site: X + σ_max(X)·UVᵀ at the first block's input (or the embedding's output)."""
    (site, causal), opts = planned, spec.values
    hook = EmbeddedTokens(site, opts["position"], opts["tokens"], **{k: opts[k] for k in SOLVER_OPTIONS})
    handles = hook.attach()
    where = site.first_block_name + " input" if opts["position"] == "after_pos_embed" else site.embed_name
    detail = f"prefix_tokens={site.num_prefix_tokens}" + (" scale=norm" if opts["scale"] == "norm" else "")
    detail += f"; {site.found}" if site.found else ""
    if opts["position"] == "before_pos_embed" and site.no_pos_embed:
        report.notes.append("position=before_pos_embed is the same X as after_pos_embed here: " + site.no_pos_embed)
    if not causal:  # (the option acts only on a causal decoder)
        report.options.pop("causal_leak", None)
    else:
        detail += " causal_leak=accept"
        report.notes.append(f"causal_leak=accept: CET on a causal decoder, {CAUSAL_WHY}: each corrected token "
                            "depends on later tokens (the causal mask no longer holds through the correction)")
    report.entries.append(PatchEntry(where, f"embedded:{site.layout}", detail))
    return handles


def spectral_once(values: Mapping[str, Any]) -> str:
    """SCA is init-only under mode=init (C added to the weights once)."""
    return "spectral with mode=init" if values.get("mode") == "init" else ""
