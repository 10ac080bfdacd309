"""A table's cells: rows × methods × seeds, named by their identity, with the overrides that make each one."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..experiment import cell_overrides
from ..reporting.metric import row_seeds
from ..reporting.tables import methods_for, rows_for
from ..runs import RunId


def select_rows(exp: dict, scale: str, patterns: list[str]) -> list[str]:
    """The rows of this scale that match any of `patterns` (shell globs: `vit_*`, `listops`); ValueError naming
    a pattern that matches no row, with the rows there are."""
    rows = rows_for(exp, scale)
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(r, pat) for r in rows):
            raise ValueError(f"--rows {pat!r} matches no row of {exp['table']} at scale {scale}; "
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



def parts(exp: dict, scale: str, seeds: list[int], launcher: str = "local") -> list[Part]:
    """Every cell of the table in the order they run: with a `pretrain:` stage (table 3), first one pretraining run
    per method, then the rows' runs of that method, each given `model.init_from=<its pretraining run's name>`."""
    out = []
    common = [f"run.table={exp['table']}", f"launcher={launcher}"]
    pre = exp.get("pretrain")
    pre_names = {}
    if pre:
        pseed = int(pre.get("seed", 0))
        for method in exp["methods"]:
            name = pre_names[method] = RunId(exp["table"], "pretrain", method, scale, pseed).name
            out.append(Part(name, [*pre.get("overrides", []), *(pre.get("scales", {}).get(scale) or []),
                                   f"conditioning={method}", f"scale={scale}", f"seed={pseed}", "run.row=pretrain",
                                   f"run.name={name}", *common], "pretrain", method, pseed, pretrain=True))
    for row in rows_for(exp, scale):
        for method in methods_for(exp, row):
            init = [f"model.init_from={pre_names[method]}"] if pre else []
            for seed in row_seeds(exp, scale, row, seeds):
                name = RunId(exp["table"], row, method, scale, seed).name
                out.append(Part(name, [*cell_overrides(exp, row, method, scale, seed), *init, f"run.row={row}",
                                       f"run.name={name}", *common], row, method, seed))
    return out



def cells(exp: dict, scale: str, seeds: list[int], extra: list[str],
          launcher: str = "local", only_rows: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """(run name, overrides) of every cell, in the order they run (`parts`, the command's `extra` overrides last);
    `only_rows`: train just these rows (the table still shows every row from the runs there are)."""
    return [(p.name, [*p.own, *extra]) for p in parts(exp, scale, seeds, launcher)
            if p.pretrain or only_rows is None or p.row in only_rows]



def needs(exp: dict, name: str, scale: str) -> str | None:
    """The pretraining cell a fine-tuning cell starts from (None without a pretrain stage), with its variant."""
    if not exp.get("pretrain") or "_pretrain_" in name:
        return None
    run = RunId.parse(name, exp["table"], exp["rows"], exp["methods"], scale)
    if run is None:
        return None
    pre = RunId(exp["table"], "pretrain", run.method, scale, int(exp["pretrain"].get("seed", 0)))
    return RunId(**{**vars(pre), "variant": (exp.get("variants") or {}).get(pre.name, "")}).name



def override_slug(overrides: list[str]) -> str:
    """'conditioning.lam=5' -> 'lam-5' (several joined by '+'): the overrides as a file-name part."""
    def one(o: str) -> str:
        key, _, value = o.lstrip("+~").partition("=")
        return re.sub(r"[^A-Za-z0-9_.-]", "", f"{key.rsplit('.', 1)[-1]}-{value}")
    return "+".join(one(o) for o in overrides) or "overrides"



def rows_slug(rows: str) -> str:
    """'vit_*,listops' -> 'vit_+listops': the --rows patterns as a file-name part (glob characters dropped)."""
    return "+".join(re.sub(r"[^A-Za-z0-9_.-]", "", part) for part in rows.replace(",", " ").split()) or "rows"

