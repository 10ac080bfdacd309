"""`apply_conditioning(model, method, **options) -> PatchReport`: the one entry point for every registered method.

Every method, the papers' included, is applied through its MethodSpec (spec.py): first every part's `plan` (its
sites found, or the call refused, before anything is written), then every part's `apply`, which returns the
handles that undo it. Nothing here knows a method by name.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import (
    BUILDING,
    CONFIG_KEY,
    LOADING_ITSELF,
    Build,
    forget,
    own_config,
    record,
    set_conditioner,
)
from .report import PatchReport
from .spec import (
    EMBEDDED_OPTIONS,
    METHODS,
    SPECTRAL_OPTIONS,
    ConditioningSpec,
    conditioning_spec,
    method_of_parts,
    method_spec,
    option_owners,
)
from .spectral import NotScriptable

__all__ = ["EMBEDDED_DEFAULTS", "METHODS", "SPECTRAL_DEFAULTS", "MethodWeightsMissing", "after_optimizer_step",
           "apply_conditioning", "conditioning_report", "from_pretrained", "remove_conditioning"]

# Every method's options, defaults, checks and which of them act: spec.py (ConditioningSpec). Defaults and the meaning
# of each open choice: configs/conditioning/_options.yaml.
SPECTRAL_DEFAULTS: dict[str, Any] = dict(SPECTRAL_OPTIONS)
EMBEDDED_DEFAULTS: dict[str, Any] = dict(EMBEDDED_OPTIONS)


@dataclass
class _State:
    report: PatchReport
    values: dict[str, Any] = field(default_factory=dict)  # every option of the method (a plain dict: picklable)
    handles: list = field(default_factory=list)  # what the method attached (hooks, swapped modules)
    config: Any = None  # the undo of own_config: not an attachment (an init-only method stays scriptable)


def apply_conditioning(model: nn.Module, method: str | ConditioningSpec = "none", *, partial: bool = False,
                       **options: Any) -> PatchReport:
    """Patch `model` in place with any registered method (`condattn.conditioning.METHODS`): SCA (`spectral`), CET
    (`embedded`), both, the follow-up's `conditioned_init`, the field's `qk_norm`, `sigma_reparam`, `mimetic_init`,
    `ns_attention`, today's attention fixes `gated_attention`, `softcap`, `attention_sink` and `qk_clip`, the papers'
    methods on a QK-norm baseline (`qk_norm+spectral`, `qk_norm+embedded`, `qk_norm+conditioned_init`), or nothing
    (`none`). `method` may be a ConditioningSpec (then no options). Options and the readings they select:
    configs/conditioning/_options.yaml.

    What a method adds is a fact of its MethodSpec: most add no parameters or buffers, so `state_dict` keys are
    unchanged and checkpoints load into a patched or unpatched model alike; `qk_norm` and `sigma_reparam` add theirs
    (`adds_keys`; `condattn.conditioning.from_pretrained` applies them before the weights load). Init-only methods
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
    _refuse_foreign(spec, options)
    # the report (printed, patch_report.json, summary.json) lists only the options that act on this model
    parts = [method_spec(p) for p in spec.parts]
    report = PatchReport(method=spec.method, options=spec.options,
                         per_layer=next((ms.name for ms in parts if ms.per_layer), None))
    state = _State(report, dict(spec.values))
    plans = {ms.name: ms.plan(model, spec, partial) for ms in parts if ms.plan is not None}
    if spec.method != "none":  # the method is written into the model's own copy of its config (removal undoes it)
        state.config = own_config(model)
    with _atomic(state):
        for ms in parts:
            if ms.apply is not None:
                planned = {"planned": plans[ms.name]} if ms.name in plans else {}
                state.handles += list(ms.apply(model, spec, report, partial=partial, **planned) or [])
    model._condattn = state
    record(model, spec.method, state.values)  # (a transformers config carries it into save_pretrained)
    if state.handles:  # attached: TorchScript refused
        model.__prepare_scriptable__ = NotScriptable(spec.method)
    return report


def _refuse_foreign(spec: ConditioningSpec, options: dict[str, Any]) -> None:
    """An option of another method (`lam` with CET) would be silently ignored: refuse it, as `train` does."""
    foreign = spec.ignored(k for k, v in options.items() if v is not None)
    if foreign:
        key = foreign[0]
        owners = ", ".join(m.name for m in option_owners(key))
        raise ValueError(f"apply_conditioning: option {key}={options[key]!r} is not an option of method "
                         f"{spec.method!r} (it belongs to {owners}); drop it, or choose one of those methods")


@contextmanager
def _atomic(state: _State):
    """Undo what was attached so far when applying raises (nothing is left half-applied)."""
    try:
        yield
    except BaseException:
        for h in reversed(state.handles):
            h.remove()
        if state.config is not None:
            state.config.remove()
        raise


def remove_conditioning(model: nn.Module) -> None:
    """Undo `apply_conditioning` (hooks removed, model as built). Refuses in one line for methods that set the weights'
    values once (MethodSpec.init_only: spectral with mode=init, conditioned_init, mimetic_init): they attach nothing,
    keep no copy of the weights they replaced, and their values are the model's weights from then on."""
    state = getattr(model, "_condattn", None)
    if state is None:
        return
    once = method_spec(state.report.method).once(state.values)
    if once:
        raise RuntimeError(f"remove_conditioning: {once} set the weights' values once at application and attached "
                           "nothing, so there is nothing to remove (the values it set are the model's weights now); "
                           "rebuild the model, or load the weights it had before")
    forget(model)  # (from the model's own copy of its config; the handles then give back the config it was built with)
    for h in reversed(state.handles):
        h.remove()
    if state.config is not None:
        state.config.remove()
    model._condattn = None
    model.__dict__.pop("__prepare_scriptable__", None)


def after_optimizer_step(model: nn.Module) -> None:
    """Call after every `optimizer.step()` of a conditioned model: each applied method's per-step work
    (MethodSpec.after_step; qk_clip's rescale of W_Q / W_K). Nothing for methods without one, or an unconditioned
    model. The trainer calls it; in your own loop, call it yourself, or once:
    `optimizer.register_step_post_hook(lambda *_: condattn.after_optimizer_step(model))`."""
    state = getattr(model, "_condattn", None)
    if state is None:
        return
    step = method_spec(state.report.method).after_step
    if step is not None:
        step(state.handles)


def conditioning_report(model: nn.Module) -> PatchReport | None:
    state = getattr(model, "_condattn", None)
    return None if state is None else state.report


class MethodWeightsMissing(UserWarning):
    """condattn's loader: the checkpoint's config records a method whose added weights the checkpoint lacks."""


def from_pretrained(model_class, pretrained_model_name_or_path: str | Path | None = None, *model_args: Any,
                    strict: bool = False, **kwargs: Any) -> nn.Module:
    """`model_class.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)`, the same call, with the
    conditioning recorded in the checkpoint's config (or in the `config=` given) applied as transformers builds the
    model, before any weight loads: the parameters and buffers the method adds load with every other weight, through
    transformers' own loading (its key renaming, `dtype`, `ignore_mismatched_sizes`, sharded or .bin checkpoints, a
    checkpoint with or without the model's head), and `output_loading_info=True` returns transformers' own report. An
    init-only method is not re-applied (its effect is in the weights); a composite applies its parts that attach.

    A checkpoint that lacks some of the weights the method adds loads as transformers loads any missing weight: they
    are in `loading_info["missing_keys"]` and transformers' report; condattn adds one MethodWeightsMissing warning
    naming the method, and those weights take the method's own initialisation on the loaded model (as
    `apply_conditioning` would set them). `strict=True` raises ValueError instead."""
    build = Build()
    tokens = LOADING_ITSELF.set(True), BUILDING.set(build)
    try:
        model, info = model_class.from_pretrained(pretrained_model_name_or_path, *model_args,
                                                  **{**kwargs, "output_loading_info": True})
    finally:
        BUILDING.reset(tokens[1])
        LOADING_ITSELF.reset(tokens[0])
    if build.model is None:  # (nothing was conditioned while building: see the error below)
        build.node = dict(getattr(getattr(model, "config", None), CONFIG_KEY, None) or {})
        if build.node and any(not method_spec(p).once(build.node) for p in _parts(build.node["method"])):
            raise RuntimeError(
                f"condattn from_pretrained: {type(model).__name__} was built without PreTrainedModel.from_pretrained "
                "calling its PreTrainedModel.post_init (the class overrides one of them), so the recorded "
                f"{build.node['method']} could not be applied before its weights loaded; load it with a transformers "
                "class that keeps them, or build the model, apply_conditioning, then load_state_dict")
    missing = sorted(build.added & set(info.get("missing_keys", ())))
    if missing:
        method, where = build.node["method"], pretrained_model_name_or_path
        line = (f"condattn: the checkpoint at {where} records {method} but lacks {len(missing)} of the "
                f"{len(build.added)} weights it adds (e.g. {missing[0]}; all are in transformers' missing keys)")
        if strict:
            raise ValueError(f"{line}; strict=True refuses it: save the model conditioned with {method} and load "
                             "that, or load with strict=False to give them the method's own initialisation")
        _initialise_missing(model, build, set(missing))
        warnings.warn(f"{line}: they take {method}'s own initialisation on the loaded weights", MethodWeightsMissing,
                      stacklevel=2)
    return (model, info) if kwargs.get("output_loading_info") else model


def _parts(method: str) -> list[str]:
    try:
        spec = method_spec(method)
    except ValueError:
        raise ValueError(f"condattn from_pretrained: the checkpoint records the method {method!r}, which this "
                         "condattn does not register: upgrade condattn") from None
    return list(spec.parts or (method,))


def condition_as_recorded(model: nn.Module, node: dict[str, Any]) -> set[str]:
    """Apply the conditioning `node` (a config's record: the method and its options) to `model`, as transformers
    builds it for condattn's loader; returns the state_dict keys it added. An init-only method (or part) is not
    applied: its effect is in the saved weights."""
    if not node:
        return set()
    node = dict(node)
    method = node.pop("method")
    parts = [p for p in _parts(method) if not method_spec(p).once(node)]
    if not parts or parts == ["none"]:
        return set()
    before = set(model.state_dict())
    opts = {k for p in parts for k in method_spec(p).options}
    apply_conditioning(model, method_of_parts(parts), **{k: v for k, v in node.items() if k in opts})
    record(model, method, node)  # (the config keeps what was saved)
    return set(model.state_dict()) - before


set_conditioner(condition_as_recorded)


def _initialise_missing(model: nn.Module, build: Build, missing: set[str]) -> None:
    """The method's own initialisation of the added weights the checkpoint lacked: the method removed and applied
    again on the loaded model, then the added weights that did load put back."""
    state = model.state_dict()
    loaded = {k: state[k].detach().clone() for k in build.added - missing}
    remove_conditioning(model)
    condition_as_recorded(model, build.node)
    with torch.no_grad():
        state = model.state_dict()
        for k, v in loaded.items():
            state[k].copy_(v)
