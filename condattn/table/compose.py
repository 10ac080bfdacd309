"""Composing a cell's Hydra config once per process, and naming the variants the readable name does not carry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..launch import ConfigError, RunSpec, compose_cell
from ..runs import RunId
from .cells import Part


class Composer:
    """compose_cell with the errors collected (one message per distinct bad override) and the configs the readable
    names compose cached (they are only compared, never changed)."""

    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}
        self._base: dict[tuple, Any] = {}
        self._cells: dict[tuple, Any] = {}
        self.n = 0  # cells composed

    def cell(self, name: str, overrides: list[str]) -> RunSpec | None:
        """The composed cell. Cells that differ only in `seed=` and `run.name=` compose once: the others are a copy
        with those two keys set (a table of 10 seeds composes each row × method × lr once, not ten times)."""
        import copy

        self.n += 1
        rest = tuple(o for o in overrides if not o.startswith(("seed=", "run.name=")))
        try:
            if rest not in self._cells:
                self._cells[rest] = compose_cell(overrides)
                return RunSpec(name, overrides, copy.deepcopy(self._cells[rest]))
            cfg = copy.deepcopy(self._cells[rest])
            for o in overrides:
                key, _, value = o.partition("=")
                if key == "seed":
                    cfg.seed = int(value)
                elif key == "run.name":
                    cfg.run.name = value
            return RunSpec(name, overrides, cfg)
        except (ConfigError, ValueError) as e:
            self.errors.setdefault(str(e), []).append(name)
            return None

    def base(self, overrides: list[str]) -> Any:
        key = tuple(overrides)
        if key not in self._base:
            self._base[key] = compose_cell(overrides)
        return self._base[key]



def named(comp: Composer, part: Part, extra: list[str], renamed: Mapping[str, str], protocol: tuple[str, ...] = (),
          words: str = "") -> tuple[RunSpec | None, str]:
    """The cell of `part` with the protocol's overrides (`protocol`, the variant `words` say: 'lr2x', 'lr2x-steps2x')
    and the command's `extra` after its own, composed, with its variant name `<name>-<words>`, plus `-<8 hex>` of its
    science config (engine/identity.py) when `extra` changes it, so `ARGS="conditioning.lam=2"` trains its own run
    beside the table's; an `extra` that changes nothing (λ on a baseline) keeps the name and its finished run. A
    renamed pretraining run (`renamed`: {readable name: variant name}, read only) follows into the `model.init_from` of
    its fine-tuning cells."""
    from ..engine.identity import variant

    def follow(o: str) -> str:
        key, _, value = o.partition("=")
        return f"{key}={renamed[value]}" if key == "model.init_from" and value in renamed else o

    spec = comp.cell(part.name, [follow(o) for o in [*part.own, *protocol, *extra]])
    if spec is None or not (words or extra):
        return spec, ""
    digest = variant(spec.cfg, comp.base([*part.own, *protocol])) if extra else ""
    v = "-".join(w for w in (words, digest) if w)
    return (spec.renamed(f"{part.name}-{v}") if v else spec), v



def reseeded(part: Part, seed: int, table: str, scale: str) -> Part:
    """The same cell at another seed (a selection seed of the lr grid), under its own readable name."""
    name = RunId(table, part.row, part.method, scale, seed).name
    own = [f"seed={seed}" if o.startswith("seed=") else f"run.name={name}" if o.startswith("run.name=") else o
           for o in part.own]
    return Part(name, own, part.row, part.method, seed)



def reached(comp: Composer, part: Part, extra: list[str]) -> set[str]:
    """The overrides among the command's `extra` that change this cell's science config (engine/identity.py): λ on
    SCA does, on the baseline not (a method's options that do not act are not its science), nor a value the cell has
    already, nor a key that is no science. A cell that does not compose reaches none (its composition reports it)."""
    from ..engine.identity import _flat, is_science_key, science_config

    try:
        base, now = _flat(science_config(comp.base(part.own))), _flat(science_config(comp.base([*part.own, *extra])))
    except ConfigError:
        return set()
    moved = {k for k in base.keys() | now.keys() if base.get(k) != now.get(k)}
    out = set()
    for o in extra:
        key = o.split("=", 1)[0].lstrip("+~")
        if is_science_key(key) and any(k == key or k.startswith(key + ".") for k in moved):
            out.add(o)
    return out
