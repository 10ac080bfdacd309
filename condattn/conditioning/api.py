"""`apply_conditioning(model, method, **options) -> PatchReport`: the one entry point for every registered method.

Every method, the papers' included, is applied through its MethodSpec (spec.py): first every part's `plan` (its
sites found, or the call refused, before anything is written), then every part's `apply`, which returns the
handles that undo it. Nothing here knows a method by name.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from . import checkpoint
from .report import PatchReport
from .spec import EMBEDDED_OPTIONS, METHODS, SPECTRAL_OPTIONS, ConditioningSpec, conditioning_spec, method_spec
from .spectral import NotScriptable

__all__ = ["EMBEDDED_DEFAULTS", "METHODS", "SPECTRAL_DEFAULTS", "apply_conditioning", "conditioning_report",
           "remove_conditioning"]

# Every method's options, defaults, checks and which of them act: spec.py (ConditioningSpec). Defaults and the meaning
# of each open choice: configs/conditioning/_options.yaml.
SPECTRAL_DEFAULTS: dict[str, Any] = dict(SPECTRAL_OPTIONS)
EMBEDDED_DEFAULTS: dict[str, Any] = dict(EMBEDDED_OPTIONS)


@dataclass
class _State:
    report: PatchReport
    values: dict[str, Any] = field(default_factory=dict)  # every option of the method (a plain dict: picklable)
    handles: list = field(default_factory=list)


def apply_conditioning(model: nn.Module, method: str | ConditioningSpec = "none", *, partial: bool = False,
                       **options: Any) -> PatchReport:
    """Patch `model` in place with any registered method (`condattn.conditioning.METHODS`): SCA (`spectral`), CET
    (`embedded`), both, the follow-up's `conditioned_init`, the field's `qk_norm`, `sigma_reparam`, `mimetic_init`,
    `ns_attention`, or nothing (`none`). `method` may be a ConditioningSpec (then no options). Options and the
    readings they select: configs/conditioning/_options.yaml.

    What a method adds is a fact of its MethodSpec: most add no parameters or buffers, so `state_dict` keys are
    unchanged and checkpoints load into a patched or unpatched model alike; `qk_norm` and `sigma_reparam` add theirs
    (`adds_keys`; `condattn.conditioning.load` re-applies them before the weights load). Init-only methods
    (`conditioned_init`, `mimetic_init`, `spectral` with mode=init) change the weights' values once and attach
    nothing. Returns a PatchReport listing every patched (and skipped) module, with how it was matched.

    Atomic and strict: every part plans (finds every site it needs) before the model is touched, and a refusal (an
    attention layer no layout matches, no token site) leaves it exactly as it was; an error while applying removes
    what was attached. `partial=True` accepts attention layers no layout matches; the report then carries a warning.
    """
    if getattr(model, "_condattn", None) is not None:
        raise RuntimeError(
            f"model is already conditioned (method={model._condattn.report.method!r}); applying twice would "
            "stack the corrections. Call condattn.remove_conditioning(model) first, or build a fresh model."
        )
    spec = conditioning_spec(method, **options) if isinstance(method, ConditioningSpec) else \
        conditioning_spec(method=method, **options)
    # the report (printed, patch_report.json, summary.json) lists only the options that act on this model
    report = PatchReport(method=spec.method, options=spec.options)
    state = _State(report, dict(spec.values))
    parts = [method_spec(p) for p in spec.parts]
    plans = {ms.name: ms.plan(model, spec, partial) for ms in parts if ms.plan is not None}
    with _atomic(state):
        for ms in parts:
            if ms.apply is not None:
                planned = {"planned": plans[ms.name]} if ms.name in plans else {}
                state.handles += list(ms.apply(model, spec, report, partial=partial, **planned) or [])
    model._condattn = state
    checkpoint.record(model, spec.method, state.values)  # (a transformers config carries it into save_pretrained)
    if state.handles:  # attached: TorchScript refused
        model.__prepare_scriptable__ = NotScriptable(spec.method)
    return report


@contextmanager
def _atomic(state: _State):
    """Undo what was attached so far when applying raises (nothing is left half-applied)."""
    try:
        yield
    except BaseException:
        for h in reversed(state.handles):
            h.remove()
        raise


def remove_conditioning(model: nn.Module) -> None:
    """Undo `apply_conditioning` (hooks removed, model as built). Refuses for methods that changed the weights
    themselves (MethodSpec.init_only: spectral with mode=init, conditioned_init, mimetic_init): there is nothing
    attached to remove."""
    state = getattr(model, "_condattn", None)
    if state is None:
        return
    once = method_spec(state.report.method).once(state.values)
    if once:
        raise RuntimeError(f"remove_conditioning: {once} changed the weights themselves (and training has moved them "
                           "since), so there is nothing to remove; rebuild the model, or load its original weights")
    for h in reversed(state.handles):
        h.remove()
    model._condattn = None
    checkpoint.forget(model)
    model.__dict__.pop("__prepare_scriptable__", None)


def conditioning_report(model: nn.Module) -> PatchReport | None:
    state = getattr(model, "_condattn", None)
    return None if state is None else state.report
