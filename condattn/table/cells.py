"""A table's cells: rows × methods × seeds, named by their identity, with the overrides that make each one."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..experiment import Experiment
from ..runs import RunId


def select_rows(exp: Experiment, scale: str, patterns: list[str]) -> list[str]:
    """The rows of this scale that match any of `patterns` (shell globs: `vit_*`, `listops`); ValueError naming
    a pattern that matches no row, with the rows there are."""
    rows = exp.rows_at(scale)
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(r, pat) for r in rows):
            raise ValueError(f"--rows {pat!r} matches no row of {exp.table} at scale {scale}; "
                             f"its rows are: {', '.join(rows)}")
    return [r for r in rows if any(fnmatch.fnmatchcase(r, pat) for pat in patterns)]



@dataclass
class Part:
    """One cell before it is composed: its readable name and the overrides that name accounts for (`own`; the
    command's extra overrides and an lr-grid value come after them)."""

    name: str
    own: list[str]
    row: str
    method: str
    seed: int
    pretrain: bool = False



def parts(exp: Experiment, scale: str, seeds: list[int], launcher: str = "local") -> list[Part]:
    """Every cell of the table in the order they run: with a `pretrain:` stage (table 3), first one pretraining run
    per method, then the rows' runs of that method, each given `model.init_from=<its pretraining run's name>`."""
    out = []
    common = [f"run.table={exp.table}", f"launcher={launcher}"]
    pre = exp.pretrain
    pre_names = {}
    if pre:
        pseed = pre.seed
        for method in exp.methods:
            name = pre_names[method] = RunId(exp.table, "pretrain", method, scale, pseed).name
            out.append(Part(name, [*pre.overrides, *(pre.scales.get(scale) or ()),
                                   f"conditioning={method}", f"scale={scale}", f"seed={pseed}", "run.row=pretrain",
                                   f"run.name={name}", *common], "pretrain", method, pseed, pretrain=True))
    for row in exp.rows_at(scale):
        for method in exp.methods_of(row):
            init = [f"model.init_from={pre_names[method]}"] if pre else []
            for seed in exp.row_seeds(scale, row, seeds):
                name = RunId(exp.table, row, method, scale, seed).name
                out.append(Part(name, [*exp.cell_overrides(row, method, scale, seed), *init, f"run.row={row}",
                                       f"run.name={name}", *common], row, method, seed))
    return out



def cells(exp: Experiment, scale: str, seeds: list[int], extra: list[str],
          launcher: str = "local", only_rows: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """(run name, overrides) of every cell, in the order they run (`parts`, the command's `extra` overrides last);
    `only_rows`: train just these rows (the table still shows every row from the runs there are)."""
    return [(p.name, [*p.own, *extra]) for p in parts(exp, scale, seeds, launcher)
            if p.pretrain or only_rows is None or p.row in only_rows]



def needs(exp: Experiment, variants: Mapping[str, str], name: str, scale: str) -> str | None:
    """The pretraining cell a fine-tuning cell starts from (None without a pretrain stage), with its variant (among a
    plan's `variants`)."""
    if not exp.pretrain or "_pretrain_" in name:
        return None
    run = RunId.parse(name, exp.table, exp.rows, exp.methods, scale)
    if run is None:
        return None
    pre = RunId(exp.table, "pretrain", run.method, scale, exp.pretrain.seed)
    return RunId(**{**vars(pre), "variant": variants.get(pre.name, "")}).name



def override_slug(overrides: list[str]) -> str:
    """'conditioning.lam=5' -> 'lam-5' (several joined by '+'): the overrides as a file-name part."""
    def one(o: str) -> str:
        key, _, value = o.lstrip("+~").partition("=")
        return re.sub(r"[^A-Za-z0-9_.-]", "", f"{key.rsplit('.', 1)[-1]}-{value}")
    return "+".join(one(o) for o in overrides) or "overrides"



def rows_slug(rows: str) -> str:
    """'vit_*,listops' -> 'vit_+listops': the --rows patterns as a file-name part (glob characters dropped)."""
    return "+".join(re.sub(r"[^A-Za-z0-9_.-]", "", part) for part in rows.replace(",", " ").split()) or "rows"

