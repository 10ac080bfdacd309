"""What a run is: the part of its config that changes its result (the *science config*), a short hash of it, and the
one rule that says whether a recorded run is a run of a cell (`answers`: its own run dir, a twin, a kept record).

A run's directory name is readable (`runs.RunId`: table, row, method, scale, seed), so options that the name does not
carry (`conditioning.lam=2`, `task.steps=50`, `model=...`) get a variant suffix: `<name>-<8 hex>`, the hash of the
science config, whenever the config differs from the one the name alone composes (`variant`); a table's own lr-grid
and length-check variants are named in words before it (`-lr2x-steps2x`, table/compose.py `named`). Whatever the name, a
run directory that already records a config (its config.yaml) is only resumed or reused when the science configs
agree (`answers`, through `config_mismatch` for a run dir): resuming never mixes configs, and a finished run answers
only for its own config. Code: a finished run answers for its cell whatever code made it, under the cell's own name or
another (a twin, engine/twins.py, table/store.py), until STALE=1 (--refresh-stale) asks for this code's runs: then
both are compared, and a run of other code answers for nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..runs import RunRecord

# How a run is run, where it is written and logged: never what it computes (configs/impl/default.yaml says the same of
# impl.*; impl.precision is the exception, it changes the numbers). Everything else is science. impl.threads: how CPU
# reductions are split changes the last bits, as the CPU's instruction set does (docs/runs.md, Determinism); both are
# recorded (hardware.torch_threads, cpu_capability) and printed in the tables' provenance line, neither is identity.
NOT_SCIENCE = (
    "run", "paths", "resume", "logger", "launcher", "hydra", "debug",
    "impl.threads", "impl.micro_batch_size", "impl.compile", "impl.num_workers", "impl.pin_memory",
    "impl.deterministic", "impl.flush_denormal", "impl.checkpoint_every", "impl.keep_checkpoints", "impl.max_loss",
    "impl.compile_mode", "impl.cpu_compile", "impl.compile_cost", "impl.fused_adamw",
    "impl.worker_samples_per_s",  # the dry run's cost estimate only
    "task.log_every", "data.root", "data.cache", "model.runs_root",
)


# Science keys added after runs were recorded without them, each with the value every run before it had: at that value
# the key is left out of the science config (so no recorded run's hash, twin or name moves), and a config that lacks
# it is read as having it (so a run recorded before the key answers only for cells at that value, never for one that
# turns it off).
IMPLIED = {
    "task.augment.enabled": True,  # data/images.py: False trains on the cached evaluation tensors, no augmentation
}


def _container(cfg: Any) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return json.loads(json.dumps(cfg, default=str))


def _drop(d: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d.get(p) if isinstance(d, dict) else None  # type: ignore[assignment]
        if not isinstance(d, dict):
            return
    d.pop(last, None)


def _get(d: dict, dotted: str) -> Any:
    for p in dotted.split("."):
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def is_science_key(key: str) -> bool:
    """Whether a dotted config key (or a config group) can change a run's result."""
    return not any(key == k or key.startswith(k + ".") for k in NOT_SCIENCE)


def science_config(cfg: Any) -> dict:
    """The resolved config without NOT_SCIENCE, with the conditioning node as its ConditioningSpec's identity: the
    options of its method, those that do not act held at their defaults (λ does nothing to a baseline or under
    correction=svd, so it does not rename the run)."""
    from ..conditioning.spec import conditioning_spec

    d = _container(cfg)
    for key in NOT_SCIENCE:
        _drop(d, key)
    for key, implied in IMPLIED.items():
        if _get(d, key) == implied:
            _drop(d, key)
    try:
        d["conditioning"] = conditioning_spec(d.get("conditioning") or {}).identity()
    except (TypeError, ValueError):  # bad options: the preflight names them; keep what was given
        pass
    return json.loads(json.dumps(d, sort_keys=True, default=list))


def config_hash(science: dict) -> str:
    """8 hex digits of the sha256 of the science config (key order does not matter)."""
    return hashlib.sha256(json.dumps(science, sort_keys=True).encode()).hexdigest()[:8]


def variant(cfg: Any, base: Any | None) -> str:
    """'' when `cfg` is the config its readable name composes (`base`), else the hash of its science config."""
    science = science_config(cfg)
    if base is not None and science_config(base) == science:
        return ""
    return config_hash(science)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def differing_keys(recorded: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, current value) of the science keys set in both configs that differ. A key only one of them
    has (a run from a version of the code that had no such key) is not counted."""
    a, b = _flat(science_config(recorded)), _flat(science_config(current))
    for key, implied in IMPLIED.items():  # left out at its implied value, so absent means that value
        a.setdefault(key, implied)
        b.setdefault(key, implied)
    return [(k, a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]


def recorded_config(run_dir: str | Path) -> dict | None:
    """The resolved config a run directory recorded (config.yaml, else its summary's), None when it has none."""
    record = RunRecord(run_dir)
    if record.config_path.is_file():
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(record.config_path), resolve=False)
            if isinstance(loaded, dict):
                return loaded
        except Exception:  # unreadable: fall back to the summary's copy
            pass
    s = record.read_summary()
    return s.get("config") if s and isinstance(s.get("config"), dict) else None


def answers(cfg: Any, recorded: dict | None, code: dict | None = None, recorded_code: dict | None = None,
            same: dict | None = None) -> str | None:
    """The one rule of run identity: None when a run that recorded the config `recorded` (made by the code
    `recorded_code`) is a run of the cell `cfg`, else why not, one phrase. Config: the science keys both configs set
    agree (`differing_keys`: how a run is run, NOT_SCIENCE, never counts). Code: compared only when `code` (this
    code's engine/provenance fingerprint for the cell's method) is given, as under --refresh-stale, for a run under
    the cell's own name and a twin alike; fingerprints recorded as computing the same (`same`,
    results/code_equivalence.json) agree."""
    if recorded is None:
        return None
    if diff := differing_keys(recorded, _container(cfg)):
        shown = "; ".join(f"{k} is {v0!r} there and {v1!r} here" for k, v0, v1 in diff[:4])
        return shown + (f" (and {len(diff) - 4} more)" if len(diff) > 4 else "")
    if code is not None:
        from .provenance import stale_parts

        if stale := stale_parts(recorded_code, code, same):
            return f"made by other code ({', '.join(stale)} differ from this code's)"
    return None


def config_mismatch(cfg: Any, run_dir: str | Path) -> str | None:
    """Why the run in `run_dir` is not a run of `cfg` (`answers`: its science keys that differ, named), or None."""
    why = answers(cfg, recorded_config(run_dir))
    if why is None:
        return None
    return (f"run dir {run_dir} holds a run of another config: {why}. Resuming or reusing it would mix configs: give a "
            "run.name of its own, or resume=never to start this one over")


# what the readable run name carries: `${task.name}_${conditioning.method}_${scale.name}_s${seed}` (configs/train.yaml)
NAMED = ("task", "conditioning", "scale", "seed")


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def base_overrides(overrides: list[str]) -> list[str] | None:
    """The overrides the readable run name accounts for (the named group choices, the seed, and keys that are no
    science); None when the overrides name the run themselves (run.name / run.dir)."""
    keys = [override_key(o) for o in overrides]
    if any(k in ("run", "run.name", "run.dir") for k in keys):
        return None
    return [o for o, k in zip(overrides, keys) if (k in NAMED and not o.startswith(("+", "~")))
            or not is_science_key(k)]


def name_variant(cfg: Any, overrides: list[str], compose: Any) -> str:
    """The variant suffix of a run started as `train OVERRIDES` ('' when its name already says all): the hash of its
    science config when the overrides outside the name change it. `compose(overrides)` composes the base config."""
    base = base_overrides(overrides)
    if base is None or len(base) == len(overrides):
        return ""
    try:
        base_cfg = compose(base)
    except Exception:  # the base alone does not compose: the suffix is the hash of the full config
        base_cfg = None
    return variant(cfg, base_cfg)


def options_not_applying(cfg: Any, overrides: list[str]) -> list[str]:
    """One message per `conditioning.<option>=` override that the run's method does not use (λ on a baseline)."""
    from ..conditioning.spec import conditioning_spec, option_owners

    method = str(cfg.conditioning.method)
    try:
        spec = conditioning_spec(method=method)
    except ValueError:
        return []  # an unknown method: the preflight names it
    out = []
    for o in overrides:
        k = override_key(o)
        opt = k.partition(".")[2] if k.startswith("conditioning.") else ""
        if opt and spec.ignored([opt]):
            owner, *others = option_owners(opt)
            alt = f" (or {', '.join(m.name for m in others)})" if others else ""
            out.append(f"override '{o}' does not apply to conditioning={method}: it is an option of "
                       f"{owner.label or owner.name}; add conditioning={owner.name}{alt}, or drop it")
    return out
