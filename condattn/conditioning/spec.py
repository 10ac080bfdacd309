"""`ConditioningSpec`: the one place that knows each conditioning method's options, their defaults, their checks and
which of them act. `conditioning_spec(node)` builds it once from a config's `conditioning` node (any Mapping: a dict,
an OmegaConf DictConfig, a whole config with a `conditioning` key) or from keyword options; `apply_conditioning`,
the run identity, the preflight, reports and tables all read that one value.

Each method is a `MethodSpec` registered by name. Adding a method is one registration, in its own module (e.g.
`conditioning/methods/qk_norm.py`, imported by the package so that it runs before any spec is built):

    from ..spec import MethodSpec, finite_number, register_method

    def _apply(model, spec, report, partial):   # patch `model` (partial: require_attention's); return the handles
        ...

    register_method(MethodSpec(
        "qk_norm", label="qk_norm (QK-norm)",
        options={"qk_eps": 1e-6},                 # option -> default (the YAML node may set it)
        validators={"qk_eps": finite_number(1e-12)},  # option -> check(key, value) -> normalised value
        applies=lambda o: {"qk_eps"},             # optional: which options act given all values (default: all)
        apply=_apply,
        # its facts, read by the report's counts, remove_conditioning, the tables, the cost estimate and the
        # contract test (tests/test_method_contract.py, which needs a case for every registered method)
        per_layer=True, init_only=False, short="QK-norm", cost="two per-head norms per layer", adds_keys=True,
        # read by provenance (its own modules: the code fingerprint of its runs) and `make bench` (its arms)
        sources=("methods/qk_norm.py",), bench_arms={"QK-norm": {}},
    ))

An option name means one option everywhere: a method may list another method's option again (conditioned_init uses
SCA's `targets`) with the same default, and then shares its check. Every registered option is accepted with every
method (the Hydra `conditioning/` group carries them all) and ignored where it does not apply. `composite(...)`
registers a union ("spectral+embedded"). This module imports no Hydra/OmegaConf: configs are read by duck typing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .embedded import CAUSAL_LEAK, GRADIENTS, POSITIONS, SCALES, SOLVERS, TOKENS
from .layouts.detr import DETR_ATTENTION  # (importing a layout module registers every family's layouts)
from .paper import apply_conditioned_init, apply_embedded, apply_spectral, plan_attention, plan_tokens, spectral_once
from .sites import ROLES
from .spectral import CORRECTIONS, IDENTITY_PLACEMENTS, LAM_UNITS, MODES

Validator = Callable[[str, Any], Any]  # (option name, given value) -> normalised value; ValueError names the fix


@dataclass(frozen=True)
class MethodSpec:
    """One conditioning method: its options (name -> default), their checks, which of them act, how it is applied,
    and the facts the layers above read from here (the report's counts, remove_conditioning, the tables' labels,
    the cost estimate, checkpoint loading)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    validators: Mapping[str, Validator] = field(default_factory=dict)
    # which options act, given every option's (normalised) value; None: all of them
    applies: Callable[[Mapping[str, Any]], set[str]] | None = None
    label: str = ""  # how messages name the method ("spectral (SCA)"); default: its name
    # options that act only on a model whose attention sites carry kinds (DETR's detr_attention)
    site_kind_options: frozenset[str] = frozenset()
    parts: tuple[str, ...] = ()  # a composite's methods; () for a plain one
    # plan(model, spec, partial) -> what apply needs (its sites), found before anything is written to the model
    # (every part of a composite is planned before any part is applied); None: apply finds its own sites
    plan: Callable[..., Any] | None = None
    # apply(model, spec, report, partial=[, planned=]) -> the handles that undo it (remove() each)
    apply: Callable[..., list] | None = None
    # --- facts
    per_layer: bool = False  # one PatchReport entry (or skip) per attention layer: PatchReport.check counts them
    # changes the weights once and attaches nothing (no per-step cost, nothing to remove): True, or a function of the
    # option values returning '' or what is init-only ("spectral with mode=init")
    init_only: bool | Callable[[Mapping[str, Any]], str] = False
    short: str = ""  # the tables' name ("SCA", "QK-norm"); default: the name
    cost: str = ""  # its per-step cost term, in words ('' for none)
    adds_keys: bool = False  # adds parameters or buffers: the state_dict gains keys (from_pretrained applies it first)
    # options that permit rather than change the computation (CET's causal_leak): left out of the run identity, so
    # accepting what a method used to do silently renames no run
    permissions: frozenset[str] = frozenset()
    # called after every optimizer step with the handles its apply returned (qk_clip rescales W_Q / W_K there): the
    # trainer calls condattn.after_optimizer_step(model), which calls it; None: nothing to do between steps
    after_step: Callable[[list], None] | None = None
    # what a plain load (without condattn's loader) of its checkpoint loses, in words, where that is not "the outputs
    # differ" (qk_clip: the clip lives in the weights, only the clip in further training is lost); '' for the default
    plain_load: str = ""
    # methods it cannot be combined with, each with why (composite(...) refuses such a union in one line)
    conflicts: Mapping[str, str] = field(default_factory=dict)
    # --- what the papers say of it (the tables, reach and findings read these; nothing else lists method names)
    claim: str = ""  # whose published numbers its rows test ("SCA", "CET", "conditioned init"); '' for none
    # keys of an experiment's `paper:` node: the claimed number for this method and the same paper's own baseline
    paper_key: str = ""
    paper_baseline_key: str = ""
    effect: bool = True  # the paper claims an effect for it (False: the paper's control, e.g. mimetic init)
    rival: bool = False  # not one of the two papers' methods (SCA, CET): a method they are compared against
    # --- what the harness reads of it (provenance, `make bench`, table 6)
    # its own modules, relative to condattn/conditioning/: the conditioning part of a run's code fingerprint covers
    # these only for runs of this method (engine/provenance.py); () runs shared code only (the baseline)
    sources: tuple[str, ...] = ()
    # `make bench`'s arms that time it: arm name -> the options it is applied with (the arm's options beside defaults)
    bench_arms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # what the papers say it does to a step diagnostic (a condattn.diagnostics flat key): key -> "lower" | "higher";
    # table 6 and the findings check the final values against these
    diagnostics_claimed: Mapping[str, str] = field(default_factory=dict)

    def acting(self, values: Mapping[str, Any]) -> set[str]:
        return set(self.options) if self.applies is None else set(self.applies(values)) & set(self.options)

    def once(self, values: Mapping[str, Any]) -> str:
        """'' when the method attaches something under these option values, else what changed the weights once."""
        if callable(self.init_only):
            return self.init_only(values)
        return self.name if self.init_only else ""

    @property
    def table_label(self) -> str:
        return self.short or self.name


BASELINE = "none"  # the method that conditions nothing: every table's reference row
_METHODS: dict[str, MethodSpec] = {}
_OPTIONS: dict[str, tuple[Any, Validator | None]] = {}  # option -> (normalised default, check)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def register_method(spec: MethodSpec) -> MethodSpec:
    """Register `spec` under its name (ValueError on a second method of that name or a clashing option default)."""
    if spec.name in _METHODS:
        if _METHODS[spec.name] is spec:
            return spec
        raise ValueError(f"conditioning method {spec.name!r} is already registered")
    pending: dict[str, tuple[Any, Validator | None]] = {}
    for key, default in spec.options.items():
        check = spec.validators.get(key)
        if key in _OPTIONS:
            known_default, known_check = _OPTIONS[key]
            if check is not None and known_check is not None and check is not known_check:
                raise ValueError(f"{spec.name}: option {key!r} already has a check (registered by another method); "
                                 f"leave validators[{key!r}] out to share it")
            check = check or known_check
            value = check(key, default) if check else default
            if not _same(value, known_default):
                raise ValueError(f"{spec.name}: option {key!r} has default {default!r}, another method's is "
                                 f"{known_default!r}; one option name means one option: rename it")
        else:
            value = check(key, default) if check else default
        pending[key] = (value, check)
    _OPTIONS.update(pending)
    _METHODS[spec.name] = spec
    return spec


def composite(name: str, *parts: str, label: str = "", short: str = "") -> MethodSpec:
    """The union of registered methods (their options, checks, rules and facts), e.g. composite("spectral+embedded",
    ...). Applied part by part, in order, after every part has planned. A part named twice, or two parts one of which
    lists the other in its `conflicts`, are refused in one line."""
    specs = [method_spec(p) for p in parts]
    if len(set(parts)) != len(parts):
        twice = next(p for p in parts if parts.count(p) > 1)
        raise ValueError(f"composite {name!r}: {twice!r} is named twice; a method is applied once")
    for a in specs:
        clash = next((b.name for b in specs if b.name in a.conflicts), None)
        if clash:
            raise ValueError(f"composite {name!r}: {a.name} conflicts with {clash}: {a.conflicts[clash]}")
    steps = [s.after_step for s in specs if s.after_step is not None]

    def applies(values: Mapping[str, Any]) -> set[str]:
        return set().union(*(s.acting(values) for s in specs))

    def once(values: Mapping[str, Any]) -> str:
        return "; ".join(w for s in specs if (w := s.once(values)))

    return MethodSpec(name, options={k: v for s in specs for k, v in s.options.items()},
                      validators={k: v for s in specs for k, v in s.validators.items()}, applies=applies,
                      label=label, site_kind_options=frozenset().union(*(s.site_kind_options for s in specs)),
                      parts=tuple(parts), per_layer=any(s.per_layer for s in specs), init_only=once, short=short,
                      cost="; ".join(s.cost for s in specs if s.cost), adds_keys=any(s.adds_keys for s in specs),
                      permissions=frozenset().union(*(s.permissions for s in specs)),
                      after_step=_AfterSteps(steps) if steps else None,
                      sources=tuple(dict.fromkeys(f for s in specs for f in s.sources)))


class _AfterSteps:
    """A composite's after_step: each part's, in order."""

    def __init__(self, steps: list[Callable[[list], None]]):
        self.steps = steps

    def __call__(self, handles: list) -> None:
        for step in self.steps:
            step(handles)


def method_of_parts(parts: Sequence[str]) -> str:
    """The registered method that applies exactly `parts` in this order (a plain method for one part)."""
    parts = tuple(parts)
    if len(parts) == 1:
        return parts[0]
    found = next((m.name for m in _METHODS.values() if m.parts == parts), None)
    if found is None:
        raise ValueError(f"no registered method applies {' then '.join(parts)}; register one with composite(...)")
    return found


def method_spec(name: str) -> MethodSpec:
    if name not in _METHODS:
        raise ValueError(f"unknown conditioning method {name!r}; valid methods: {', '.join(_METHODS)}")
    return _METHODS[name]


def option_default(key: str) -> Any:
    return _OPTIONS[key][0]


def option_owners(key: str) -> list[MethodSpec]:
    """The registered methods that use option `key`, plain methods first (registration order)."""
    found = [m for m in _METHODS.values() if key in m.options]
    return [m for m in found if not m.parts] + [m for m in found if m.parts]


class _Methods(Sequence):
    """The registered method names, read live (a method registered later is listed too)."""

    def __getitem__(self, i):  # type: ignore[override]
        return tuple(_METHODS)[i]

    def __len__(self) -> int:
        return len(_METHODS)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_METHODS))

    def __contains__(self, name: object) -> bool:
        return name in _METHODS

    def __repr__(self) -> str:
        return repr(tuple(_METHODS))


METHODS: Sequence[str] = _Methods()


@dataclass(frozen=True)
class ConditioningSpec:
    """A method and its options, checked and normalised. `options`: the ones that act (what the method reads);
    `identity()`: what the run identity hashes."""

    method: str
    values: Mapping[str, Any]  # every option of the method, defaults filled (read-only)
    applying: tuple[str, ...]  # the options that act, in declaration order

    @property
    def options(self) -> dict[str, Any]:
        return {k: self.values[k] for k in self.applying}

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def parts(self) -> tuple[str, ...]:
        """The plain methods this one applies ((self.method,) for a plain method)."""
        return method_spec(self.method).parts or (self.method,)

    def uses(self, part: str) -> bool:
        return part in self.parts

    def on_model(self, site_kinds: bool) -> dict[str, Any]:
        """The options that act on a model: without attention kinds (every model but DETR), the kind selectors go."""
        drop = set() if site_kinds else method_spec(self.method).site_kind_options
        return {k: v for k, v in self.options.items() if k not in drop}

    def set_kind_options(self) -> dict[str, Any]:
        """The attention-kind selectors (MethodSpec.site_kind_options) given a value other than their default."""
        kinds = method_spec(self.method).site_kind_options
        return {k: v for k, v in self.values.items() if k in kinds and not _same(v, option_default(k))}

    def identity(self) -> dict[str, Any]:
        """The method and its options, those that do not act held at their defaults: two configs that differ only
        in an option that does nothing (λ under correction=svd) are one run, and the hash of every run made before
        this rule is unchanged."""
        free = method_spec(self.method).permissions
        kept = {k: v for k, v in self.values.items() if k not in free}
        return {"method": self.method, **{k: (v if k in self.applying else option_default(k)) for k, v in kept.items()}}

    def ignored(self, given: Iterable[str]) -> list[str]:
        """Of the option names `given`, those that are options of another method, not of this one (a permission,
        such as CET's causal_leak, is never one: granting it where nothing needs it changes nothing)."""
        free = set().union(*(m.permissions for m in _METHODS.values()))
        return [k for k in given if k in _OPTIONS and k not in self.values and k not in free]


def _plain(v: Any) -> Any:
    """A config value as plain Python (DictConfig/ListConfig are Mappings/Sequences: read by duck typing)."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, Sequence) and not isinstance(v, str | bytes):
        return [_plain(x) for x in v]
    return v


def conditioning_spec(node: Mapping[str, Any] | ConditioningSpec | None = None, /, **options: Any) -> ConditioningSpec:
    """The spec of a `conditioning` node (`method` plus options; a whole config with a `conditioning` key is read
    through it), or of keyword options (`method=...` among them). Options set to None take their defaults. Raises
    ValueError with one line naming the bad method, option or value and the fix."""
    if isinstance(node, ConditioningSpec):
        if options:
            raise TypeError("conditioning_spec(spec) takes no further options")
        return node
    if node is not None and isinstance(node.get("conditioning"), Mapping):
        node = node["conditioning"]
    given = {**_plain(node or {}), **_plain(options)}
    method = given.pop("method", "none")
    ms = method_spec(method) if isinstance(method, str) else method_spec(repr(method))
    unknown = sorted(set(given) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"unknown conditioning option(s) {unknown}; valid options: {', '.join(_OPTIONS)}")
    checked: dict[str, Any] = {}
    for key, (default, check) in _OPTIONS.items():  # every given option is checked, whichever method uses it
        v = given.get(key)
        checked[key] = default if v is None else (check(key, v) if check else v)
    values = {k: checked[k] for k in ms.options}
    acting = ms.acting(values)
    return ConditioningSpec(method, MappingProxyType(values), tuple(k for k in ms.options if k in acting))


# ---------------------------------------------------------------- checks


def choice(choices: Sequence[str]) -> Validator:
    def check(key: str, v: Any) -> Any:
        if v not in choices:
            raise ValueError(f"conditioning option {key}={v!r} is invalid; choose one of {list(choices)}")
        return v
    return check


def integer(low: int) -> Validator:
    def check(key: str, v: Any) -> int:
        if isinstance(v, str):
            raise ValueError(f"conditioning option {key}={v!r} must be an integer >= {low}, not a string")
        try:
            ok = not isinstance(v, bool) and int(v) == float(v) and int(v) >= low
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise ValueError(f"conditioning option {key}={v!r} must be an integer >= {low}")
        return int(v)
    return check


def finite_number(low: float, hint: str = "") -> Validator:
    def check(key: str, v: Any) -> float:
        if isinstance(v, str):
            raise ValueError(f"conditioning.{key}={v!r} must be a number, not a string")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"conditioning.{key}={v!r} must be a number") from None
        if isinstance(v, bool) or not (low <= x and math.isfinite(x)):
            raise ValueError(f"conditioning.{key}={v!r} must be a finite number ≥ {low:g}{hint}")
        return x
    return check


def subset(universe: Sequence[str], example: str, *, letters: bool = False) -> Validator:
    """A non-empty subset of `universe`, returned in its order; `letters`: a string is read as one name per letter."""
    def check(key: str, v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            items = list(v.replace(",", "").replace(" ", "")) if letters else [v]
        else:
            items = list(v)
        if [x for x in items if x not in universe] or not items or len(set(items)) != len(items):
            raise ValueError(f"{key}={v!r}: give a non-empty subset of {list(universe)}, e.g. {example}")
        return tuple(x for x in universe if x in items)
    return check


# ---------------------------------------------------------------- the built-in methods


def _spectral_applies(o: Mapping[str, Any]) -> set[str]:
    out = set(SPECTRAL_OPTIONS)
    if o["correction"] == "identity":  # C is λI: never recomputed
        out.discard("refresh_every")
    elif o["correction"] == "svd":  # C = σ_max(W)·UVᵀ: no λ
        out -= {"lam", "lam_unit"}
    return out


def _embedded_applies(o: Mapping[str, Any]) -> set[str]:
    if o["solver"] == "svd":  # the iteration counts belong to the newton_schulz solver
        return set(EMBEDDED_OPTIONS) - set(NEWTON_SCHULZ_ONLY)
    return set(EMBEDDED_OPTIONS)


# Defaults and the meaning of each open choice: configs/conditioning/_options.yaml (the same keys and defaults).
SPECTRAL_OPTIONS: dict[str, Any] = {
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
EMBEDDED_OPTIONS: dict[str, Any] = {
    "position": "after_pos_embed",  # open choice: X exactly as the first block receives it
    "tokens": "all",  # open choice: prefix (CLS) tokens included in X
    "gradient": "detach",  # open choice: C is a constant in backward
    "solver": "newton_schulz",  # fast, κ ≤ 2.05 (configs/conditioning/_options.yaml says why); svd is exact
    "lift_iters": 8,  # newton_schulz only: quintic steps that lift small singular values
    "ns_iters": 4,  # newton_schulz only: cubic Newton–Schulz steps that converge them to 1
    "power_iters": 20,  # newton_schulz only: power iterations for σ_1
    "scale": "keep",  # the paper's X + C; norm: X + C rescaled to ‖X‖_F per sample (κ unchanged)
    # on a causal decoder the SVD over the sequence lets each token see later ones: refused unless accepted
    "causal_leak": "refuse",
}
NEWTON_SCHULZ_ONLY = ("lift_iters", "ns_iters", "power_iters")
# conditioned_init reads these of SCA's options (which projections, W_V's placement, DETR's attention kinds)
INIT_OPTIONS = ("targets", "identity", "detr_attention")

register_method(MethodSpec(BASELINE, label="none (the baseline)", short="baseline", bench_arms={"baseline": {}}))
register_method(MethodSpec(
    "spectral", SPECTRAL_OPTIONS, label="spectral (SCA)", applies=_spectral_applies,
    site_kind_options=frozenset({"detr_attention"}),
    validators={
        "lam": finite_number(0, " (λ = 0 adds nothing; the SCA paper's default is 10)"),
        "targets": subset(ROLES, "targets=[q,k,v]", letters=True),
        "identity": choice(IDENTITY_PLACEMENTS),
        "correction": choice(CORRECTIONS),
        "mode": choice(MODES),
        "lam_unit": choice(LAM_UNITS),
        "refresh_every": integer(1),
        "detr_attention": subset(DETR_ATTENTION, "conditioning.detr_attention=[encoder,decoder_cross] "
                                                 "(conditioning=none turns SCA off)"),
    },
    # λI over whole weights needs no head count; the same λI in every head (identity=per_head) does
    plan=plan_attention("spectral", heads=lambda spec: spec["identity"] == "per_head"), apply=apply_spectral,
    per_layer=True,
    init_only=spectral_once, short="SCA", claim="SCA", paper_key="sca", paper_baseline_key="sca_baseline",
    sources=("spectral.py",), bench_arms={"SCA": {}},
    diagnostics_claimed={"kappa_wq/mean": "lower", "kappa_wk/mean": "lower", "kappa_wv/mean": "lower",
                         "sigma_min_wq/mean": "higher", "kappa_jacobian/l0": "lower"},
    cost="W + C folded into each W_Q/W_K/W_V per call: one weight-sized add (svd: an SVD per block per refresh)",
))
register_method(MethodSpec(
    "embedded", EMBEDDED_OPTIONS, label="embedded (CET)", applies=_embedded_applies,
    validators={
        "position": choice(POSITIONS),
        "tokens": choice(TOKENS),
        "gradient": choice(GRADIENTS),
        "solver": choice(SOLVERS),
        "lift_iters": integer(0),
        "ns_iters": integer(1),
        "power_iters": integer(1),
        "scale": choice(SCALES),
        "causal_leak": choice(CAUSAL_LEAK),
    },
    permissions=frozenset({"causal_leak"}), plan=plan_tokens, apply=apply_embedded, short="CET",
    claim="CET", paper_key="cet", paper_baseline_key="cet_baseline",
    sources=("embedded.py", "tokens.py"),
    bench_arms={"CET-svd": {"solver": "svd"}, "CET-fast": {"solver": "newton_schulz"}},
    diagnostics_claimed={"kappa_x/b0": "lower", "kappa_attn/l0": "lower", "kappa_attn/mean": "lower"},
    cost="the polar factor of each sample's N × D token matrix per forward (Newton–Schulz steps, or one SVD)",
))
register_method(composite("spectral+embedded", "spectral", "embedded", label="spectral+embedded (SCA and CET)",
                          short="SCA+CET"))
register_method(MethodSpec("conditioned_init", {k: SPECTRAL_OPTIONS[k] for k in INIT_OPTIONS},
                           label="conditioned_init", site_kind_options=frozenset({"detr_attention"}),
                           plan=plan_attention("conditioned_init"), apply=apply_conditioned_init,
                           per_layer=True, init_only=True, short="conditioned init", rival=True,
                           claim="conditioned init", paper_key="ci_conditioned", paper_baseline_key="ci_baseline",
                           sources=("initialise.py", "spectral.py")))
