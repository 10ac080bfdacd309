"""`python -m condattn.reproduce experiments/tableN.yaml --scale smoke`: every cell of a table, then the table.

Cells are rows × methods × seeds; each is one `train` run with Hydra overrides
`<row overrides> <scale overrides> conditioning=<method> scale=<scale> seed=<seed>` (scale overrides: the
experiment's optional `scales: {<scale>: {overrides: [...]}}`) and a fixed run name
`<table>_<row>_<method>_<scale>_s<seed>`. Before any cell trains or is submitted, every cell's config is
composed and checked (overrides, options, data, batch split, checkpoints in its run dir); one message per
problem. Finished cells are skipped (their summary.json is valid), unfinished ones resume from their last
checkpoint, failed ones are reported in the table as missing. A stop request (Ctrl-C, SIGTERM) checkpoints
the running cell and ends the table; running the command again finishes only what is missing.

With `scales: {<scale>: {lr_grid: [0.5, 1, 2]}}` every row picks its lr first (the fair protocol): stage 1 runs the
row's first seed at each multiplier of its optim.lr (`optim.lr=<value>`, a variant run like any other), stage 2 its
other seeds at the multiplier with the best validation score (`selection_key`: never a test metric); the table
records the pick and the grid's scores.

The parts: `plan()` (cells, overrides, identity, lr picks, cost; no side effects), the launch
(`launch.run_local`, or a submitit job array: slurm / submitit_local, see README "Cluster"), and `report()`.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import re
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import early_problems
from .engine.artefacts import repair_finished
from .engine.identity import is_science_key
from .engine.preflight import preflight_checked
from .engine.signals import StopFlag
from .experiment import cell_overrides
from .launch import LAUNCHERS, SUBMITIT_LAUNCHERS, ConfigError, RunSpec, active_job, compose_cell, launcher_problems
from .reporting import load_experiment
from .reporting.metric import higher_is_better, row_metric, row_seeds
from .reporting.protocol import pick_key
from .reporting.tables import methods_for, renderer_for, rows_for
from .runs import RunId, RunRecord


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


# --------------------------------------------------------------------------------------------- the lr grid


def lr_grid(exp: dict, scale: str) -> list[float]:
    """The scale's starting `lr_grid`: log2-spaced multipliers of each row's optim.lr ([] without one); ConfigError
    for a bad grid."""
    grid = (exp["scales"].get(scale) or {}).get("lr_grid") or []
    ok = isinstance(grid, list) and all(isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0
                                        for m in grid)
    ok = ok and len(set(grid)) == len(grid) and all(
        math.isclose(b / a, 2.0) for a, b in zip(sorted(grid), sorted(grid)[1:]))
    if not ok:
        raise ConfigError(f"scales.{scale}.lr_grid={grid!r} in {exp['table']}: give distinct log2-spaced positive "
                          "multipliers of each row's optim.lr, e.g. lr_grid: [0.5, 1, 2]")
    return sorted(float(m) for m in grid)


def lr_bound(exp: dict, scale: str) -> tuple[float, float]:
    """The declared bound of the grid's extension (`lr_bound: [lo, hi]`, default ×1/8 … ×8): while a pick sits at an
    edge of the grid, the grid grows one log2 step that way, never past the bound."""
    lo, hi = (exp["scales"].get(scale) or {}).get("lr_bound") or (0.125, 8.0)
    grid = lr_grid(exp, scale)
    if not (0 < lo <= min(grid) and max(grid) <= hi):
        raise ConfigError(f"scales.{scale}.lr_bound=[{lo}, {hi}] in {exp['table']} must contain the lr_grid {grid}")
    return float(lo), float(hi)


def selection_seeds(exp: dict, scale: str, reported: list[int] | None = None) -> list[int]:
    """The seeds that pick each row's lr (`selection_seeds`, at least 2): never reported, disjoint from the
    reported seeds (the scale's, or `reported`: the ones this command reports, --seeds)."""
    sel = (exp["scales"].get(scale) or {}).get("selection_seeds") or []
    reported = set((exp["scales"].get(scale) or {}).get("seeds") or []) | set(reported or [])
    if len(sel) < 2 or len(set(sel)) != len(sel) or reported & set(sel):
        raise ConfigError(f"scales.{scale}.selection_seeds={sel!r} in {exp['table']}: an lr grid needs at least 2 "
                          f"distinct selection seeds, disjoint from the reported seeds {sorted(reported)}, e.g. "
                          "selection_seeds: [100, 101]")
    return [int(x) for x in sel]


def selection_key(exp: dict, row: str, scale: str | None = None) -> str:
    """The validation metric a row's lr grid picks by, never a test metric: the row's (or the experiment's)
    `select_metric`, else the validation twin of the row's metric: test_<k> (scored at the best validation
    checkpoint, LRA) -> val_<k> (the best validation value), final_test_<k> -> final_val_<k>, and a validation
    metric (final_val_<k>: ViT's final validation top-1) itself. The row's metric at `scale` is the one its table
    reports (reporting/metric.py row_metric)."""
    spec = exp["rows"][row]
    metric = row_metric(exp, scale, row)
    key = spec.get("select_metric", exp.get("select_metric"))
    if key is None:
        for test, val in (("final_test_", "final_val_"), ("test_", "val_")):
            if metric.startswith(test):
                key = val + metric[len(test):]
                break
        else:
            key = metric if metric.startswith(("val_", "final_val_")) else None
    if not key or "test" in key:
        raise ConfigError(f"row {row!r} of {exp['table']}: no validation metric to pick its lr by (its metric is "
                         f"{metric!r}, select_metric {key!r}); set select_metric: final_val_<k> or val_<k>")
    return str(key)


@dataclass
class LrPick:
    """One row's lr selection: the lr of each multiplier of the grid as it stands, each selection seed's validation
    score there (None: not finished yet; nan: the run failed), and the multiplier picked by the mean over the
    selection seeds (None until every run of the grid has ended, or while the grid still grows)."""

    row: str
    key: str
    base_lr: float
    lrs: dict[float, float]
    seeds: list[int] = field(default_factory=list)
    bound: tuple[float, float] = (0.125, 8.0)
    scores: dict[float, dict[int, float | None]] = field(default_factory=dict)
    pick: float | None = None

    def mean(self, m: float) -> float | None:
        """The mean validation score of multiplier m over the selection seeds: None until all have ended, nan when
        any failed (a diverged lr loses the grid)."""
        vals = list(self.scores.get(m, {}).values())
        if len(vals) < len(self.seeds) or any(v is None for v in vals):
            return None
        return math.nan if any(math.isnan(v) for v in vals) else statistics.fmean(vals)  # type: ignore[arg-type]

    def best(self, higher_is_better: bool) -> float | None:
        """The multiplier with the best finite mean score (a tie goes to the one nearest ×1), once every run of the
        grid has ended; None before."""
        means = {m: self.mean(m) for m in self.lrs}
        if any(v is None for v in means.values()):
            return None
        done = [m for m, v in means.items() if v is not None and math.isfinite(v)]
        sign = 1.0 if higher_is_better else -1.0
        return max(done, key=lambda m: (sign * means[m], -abs(math.log(m))), default=None)  # type: ignore[operator]

    def next_step(self, best: float) -> float | None:
        """The multiplier one log2 step beyond `best` when it is an edge of the grid and the bound allows, else
        None (the pick is final)."""
        grid = sorted(self.lrs)
        if len(grid) < 2:
            return None
        if best == grid[0] and best / 2 >= self.bound[0] - 1e-12:
            return best / 2
        if best == grid[-1] and best * 2 <= self.bound[1] + 1e-12:
            return best * 2
        return None

    def flat(self) -> bool:
        """Every multiplier of the grid that finished (at least 2; a failed lr is left out) has exactly the same mean
        score, so the grid says nothing about the lr: a row at chance, or at the majority class, at every lr of it.
        Exact, as `best` compares: a tie there goes to the multiplier nearest ×1."""
        means = [self.mean(m) for m in self.lrs]
        if any(v is None for v in means):
            return False
        done = [v for v in means if v is not None and math.isfinite(v)]
        return len(done) >= 2 and max(done) == min(done)

    def next_steps(self, best: float) -> list[float]:
        """The multipliers to add to the grid once every run of it has ended: one log2 step beyond an edge pick
        (`next_step`), or, when the grid is flat, one step beyond each edge that finished (a failed edge ends its
        side), as the bound allows. Empty: the pick is final (on a grid flat up to the bound: `best`, the multiplier
        nearest ×1, marked flat)."""
        if not self.flat():
            step = self.next_step(best)
            return [] if step is None else [step]
        lo, hi = min(self.lrs), max(self.lrs)
        ok = {m: math.isfinite(self.mean(m)) for m in (lo, hi)}  # type: ignore[arg-type]
        out = [lo / 2] if ok[lo] and lo / 2 >= self.bound[0] - 1e-12 else []
        return out + ([hi * 2] if ok[hi] and hi * 2 <= self.bound[1] + 1e-12 else [])

    @property
    def at_bound(self) -> bool:
        """The pick is an edge of the grid that the bound stops from growing."""
        grid = sorted(self.lrs)
        return self.pick is not None and len(grid) > 1 and self.pick in (grid[0], grid[-1]) and \
            self.next_step(self.pick) is None

    def as_dict(self) -> dict:
        return {"key": self.key, "base_lr": self.base_lr, "lrs": self.lrs, "seeds": self.seeds,
                "bound": list(self.bound), "scores": self.scores, "means": {m: self.mean(m) for m in self.lrs},
                "pick": self.pick, "at_bound": self.at_bound, "flat": self.pick is not None and self.flat(),
                "lr": self.lrs.get(self.pick) if self.pick is not None else None}


def lr_override(lr: float) -> str:
    return f"optim.lr={float(f'{lr:.6g}')!r}"


def grid_score(record: RunRecord, key: str) -> float | None:
    """A stage-1 run's validation score: its summary's `key` when finished, nan when it failed (a diverged lr loses
    the grid), None while it has not ended."""
    s = record.summary
    if s is not None:
        if key not in s["metrics"]:
            raise ConfigError(f"{record.dir}: summary.json has no {key!r} to pick an lr by (it has "
                              f"{', '.join(s['metrics'])}); set select_metric in the experiment")
        return float(s["metrics"][key])
    return math.nan if record.status == "failed" else None


# --------------------------------------------------------------------------------------------- the plan


class _Composer:
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


@dataclass
class Plan:
    """What a table is at this moment: its cells to train (composed, named), the lr picks, where runs and results go,
    and the experiment as its renderer reads it (`variants`: the variant of each cell run with overrides its name
    does not carry; `lr_picks`)."""

    exp: dict
    cells: list[RunSpec]
    picks: dict[str, LrPick]
    runs_root: Path
    results_root: Path

    @property
    def waiting(self) -> list[str]:
        """The rows (`pick_key`s: "<row>/<method>" where a row trains several) whose lr grid has no pick yet: their
        other seeds are not planned."""
        return [row for row, p in self.picks.items() if p.pick is None]

    def cost(self, specs: list[RunSpec]) -> list[str]:
        """What these cells will cost before anything is queued (engine/cost.py)."""
        from .engine.cost import describe_cost

        return describe_cost(self.exp["table"], [(c.name, c.cfg) for c in specs])


def _named(comp: _Composer, part: Part, tail: list[str], renamed: dict[str, str]) -> tuple[RunSpec | None, str]:
    """The cell of `part` with `tail` after its own overrides, composed, with its variant name `<name>-<8 hex>`
    (engine/identity.py) when the tail changes its science config, so `ARGS="conditioning.lam=2"` or an lr-grid value
    trains its own run beside the table's; a tail that changes nothing (λ on a baseline) keeps the name and its
    finished run. A renamed pretraining run follows into the `model.init_from` of its fine-tuning cells."""
    from .engine.identity import variant

    def follow(o: str) -> str:
        key, _, value = o.partition("=")
        return f"{key}={renamed[value]}" if key == "model.init_from" and value in renamed else o

    spec = comp.cell(part.name, [follow(o) for o in [*part.own, *tail]])
    if spec is None or not tail:
        return spec, ""
    v = variant(spec.cfg, comp.base(part.own))
    if v:
        renamed[part.name] = new = f"{part.name}-{v}"
        spec.overrides = [f"run.name={new}" if o.startswith("run.name=") else o for o in spec.overrides]
        spec.cfg.run.name, spec.name = new, new
    return spec, v


def _reseeded(part: Part, seed: int, table: str, scale: str) -> Part:
    """The same cell at another seed (a selection seed of the lr grid), under its own readable name."""
    name = RunId(table, part.row, part.method, scale, seed).name
    own = [f"seed={seed}" if o.startswith("seed=") else f"run.name={name}" if o.startswith("run.name=") else o
           for o in part.own]
    return Part(name, own, part.row, part.method, seed)


def _grid_row(comp: _Composer, group: list[Part], grid: list[float], extra: list[str], exp: dict, scale: str,
              read_records: bool, shown: dict[str, str],
              renamed: dict[str, str]) -> tuple[list[tuple[Part, RunSpec]], LrPick | None]:
    """One row's cells under an lr grid. Stage 1: every selection seed at every multiplier of the grid; while the best
    mean score sits at an edge of the grid, the grid grows one log2 step that way (up to the declared bound) and the new
    multiplier's runs are planned; a flat grid (every lr the same score) grows one step each way. Stage 2, once the pick
    is final: the row's reported seeds at the pick (selection runs are never reported). Adds the variants of the
    reported runs to `shown`. `renamed`: the pretraining runs' variant names, which the cells' model.init_from follows
    (table 3)."""
    first = group[0]
    try:
        base_lr = float(comp.base([*first.own, *extra]).optim.lr)
    except ConfigError as e:
        comp.errors.setdefault(str(e), []).append(first.name)
        return [], None
    table = exp["table"]
    sel = [_reseeded(first, s, table, scale) for s in selection_seeds(exp, scale, [p.seed for p in group])]
    pick = LrPick(first.row, selection_key(exp, first.row, scale), base_lr, {}, [p.seed for p in sel],
                  lr_bound(exp, scale))
    out: list[tuple[Part, RunSpec]] = []
    higher = higher_is_better(exp, first.row)
    todo = list(grid)
    while todo:
        for m in todo:
            pick.lrs[m] = base_lr * m
            pick.scores[m] = {}
            for part in sel:  # ×1 is the row's own cell: no lr override, its usual name
                spec, _ = _named(comp, part, [*([] if m == 1 else [lr_override(base_lr * m)]), *extra], renamed)
                if spec is None:
                    return out, None
                out.append((part, spec))
                pick.scores[m][part.seed] = grid_score(RunRecord(spec.run_dir), pick.key) if read_records else None
        best = pick.best(higher)
        todo = [] if best is None else pick.next_steps(best)
        if best is not None and not todo:
            pick.pick = best
    if pick.pick is not None:
        lr_tail = [] if pick.pick == 1 else [lr_override(base_lr * pick.pick)]
        for part in group:
            spec, v = _named(comp, part, [*lr_tail, *extra], renamed)
            if spec is not None:
                out.append((part, spec))
                shown[part.name] = v
    return out, pick


def length_check(exp: dict, scale: str) -> tuple[int, int] | None:
    """The scale's `length_check: {factor: 2, seeds: 5}`: the baseline and every primary row with a verdict run again
    at factor × their steps, on their `seeds` lowest reported seeds, at their lr pick. None without one."""
    spec = (exp["scales"].get(scale) or {}).get("length_check")
    if not spec:
        return None
    factor, n = spec.get("factor", 2), spec.get("seeds", 5)
    if not (isinstance(factor, int) and factor > 1 and isinstance(n, int) and n >= 2):
        raise ConfigError(f"scales.{scale}.length_check={spec!r} in {exp['table']}: give an integer factor > 1 and at "
                          "least 2 seeds, e.g. {factor: 2, seeds: 5}")
    return factor, n


def _finished_values(exp: dict, scale: str, row: str, specs: list[RunSpec]) -> list[float] | None:
    """The reported metric of the finished runs of a group once every one of them has ended (a failed run counts as
    ended, and is left out), or None while any is still to run."""
    key = row_metric(exp, scale, row)
    vals = []
    for c in specs:
        rec = RunRecord(c.run_dir)
        s = rec.summary
        if s is None or key not in s["metrics"]:
            if rec.status == "failed":
                continue
            return None
        vals.append(float(s["metrics"][key]))
    return vals


def _length_cells(comp: _Composer, exp: dict, scale: str, reported: dict[tuple, list[tuple[Part, RunSpec]]],
                  picks: dict[str, LrPick], extra: list[str], renamed: dict[str, str],
                  longer: dict[str, str]) -> list[tuple[Part, RunSpec]]:
    """The runs at factor × steps of each family whose baseline and primary rows have all finished: the baseline and
    every primary row whose adjusted p < 0.05 (the same tests the table prints). `longer`: their variants, by the
    readable name of the run at 1× steps."""
    from .reporting.metric import families, hypothesis
    from .reporting.protocol import verdicts

    factor, n = length_check(exp, scale) or (0, 0)
    out: list[tuple[Part, RunSpec]] = []
    for fam in families(exp, scale).values():
        groups = {rm: reported.get(rm) for rm in fam}
        primary = [rm for rm in fam[1:] if hypothesis(exp, rm[0]) == "primary"]
        values = {rm: _finished_values(exp, scale, rm[0], [c for _, c in groups[rm] or []])
                  for rm in [fam[0], *primary]}
        if any(not v for v in values.values()):
            continue
        found = verdicts(values[fam[0]], [(rm, values[rm], "primary") for rm in primary],
                         higher_is_better(exp, fam[0][0]))
        for rm in [fam[0], *(rm for rm in primary if found[rm].word in ("better", "worse"))]:
            pick = picks[pick_key(exp, *rm)]
            for part, spec in sorted(groups[rm] or [], key=lambda pc: pc[0].seed)[:n]:  # the n lowest, any order
                steps = int(spec.cfg.task.steps)
                tail = [*([] if pick.pick == 1 else [lr_override(pick.base_lr * pick.pick)]),
                        f"task.steps={factor * steps}", *extra]
                long_spec, v = _named(comp, part, tail, renamed)
                if long_spec is not None:
                    out.append((part, long_spec))
                    longer[part.name] = v
    return out


def _changes(comp: _Composer, part: Part, extra: list[str]) -> bool:
    """Whether the command's extra overrides change this cell's science config (λ on SCA does, on the baseline not)."""
    from .engine.identity import variant

    try:
        return bool(variant(comp.base([*part.own, *extra]), comp.base(part.own)))
    except ConfigError:
        return False  # the cell's own composition reports it


def override_slug(overrides: list[str]) -> str:
    """'conditioning.lam=5' -> 'lam-5' (several joined by '+'): the overrides as a file-name part."""
    def one(o: str) -> str:
        key, _, value = o.lstrip("+~").partition("=")
        return re.sub(r"[^A-Za-z0-9_.-]", "", f"{key.rsplit('.', 1)[-1]}-{value}")
    return "+".join(one(o) for o in overrides) or "overrides"


def plan(exp: dict, scale: str, seeds: list[int], extra: list[str], launcher: str = "local",
         only_rows: list[str] | None = None, read_records: bool = True, full: bool = True) -> Plan:
    """Every cell of the table at this scale, composed and named, without side effects (it reads run records, writes
    nothing). With an lr grid, a row's other seeds are planned once its stage-1 runs have ended (`read_records`
    False, as under --force: none has). The cells of rows outside `only_rows` are planned too when `full` (their
    variants and picks name the runs the table shows) but never returned to train; a plan that only trains
    (`full=False`) skips them, unless the scale has a length check: its verdicts read every primary row's runs, so a
    `--rows` process trains its rows' length runs too. ConfigError: the overrides that do not compose
    (one message each), an optim.lr override beside an lr grid, cells that would share a run dir."""
    grid = lr_grid(exp, scale)
    full = full or bool(grid and length_check(exp, scale) and read_records)
    if grid and (bad := [o for o in extra if o.split("=", 1)[0].lstrip("+~") == "optim.lr"]):
        raise ConfigError(f"{bad[0]} conflicts with scales.{scale}.lr_grid, which sets every row's lr (multiples of "
                          "its optim.lr): drop the override, or change the row's optim.lr in the experiment")
    comp, renamed, shown = _Composer(), {}, {}
    planned: list[tuple[Part, RunSpec]] = []
    picks: dict[str, LrPick] = {}
    groups: dict[tuple, list[Part]] = {}
    for p in parts(exp, scale, seeds, launcher):
        groups.setdefault((p.name,) if p.pretrain else (p.row, p.method), []).append(p)
    reported: dict[tuple, list[tuple[Part, RunSpec]]] = {}
    changed: set[str] = set()
    for group in groups.values():
        if not full and only_rows is not None and not group[0].pretrain and group[0].row not in only_rows:
            continue
        if extra and not group[0].pretrain and _changes(comp, group[0], extra):
            changed.add(group[0].method)
        if grid and not group[0].pretrain:
            row_cells, pick = _grid_row(comp, group, grid, extra, exp, scale, read_records, shown, renamed)
            planned += row_cells
            if pick is not None:
                picks[pick_key(exp, group[0].row, group[0].method)] = pick
                reported[(group[0].row, group[0].method)] = [(p, c) for p, c in row_cells if p in group]
            continue
        for part in group:
            spec, shown[part.name] = _named(comp, part, list(extra), renamed)
            if spec is not None:
                planned.append((part, spec))
    longer: dict[str, str] = {}
    if grid and length_check(exp, scale) and read_records and not comp.errors:
        planned += _length_cells(comp, exp, scale, reported, picks, extra, renamed, longer)
    if comp.errors:
        errors, n = comp.errors, comp.n
        if only_rows:  # report the rows asked for (`--rows`): the others are composed for their picks only
            def asked(name: str) -> bool:
                run = RunId.parse(name, exp["table"], exp["rows"], exp["methods"], scale)
                return run is None or run.row in only_rows
            kept = {m: [x for x in names if asked(x)] for m, names in errors.items()}
            n = sum(1 for p in parts(exp, scale, seeds, launcher) if p.row in only_rows) or n
            errors = {m: names for m, names in kept.items() if names} or errors
        raise ConfigError(_refusal(errors, n).lstrip(" "))
    _check_shared_dirs([spec for _, spec in planned])
    variants = {name: v for name, v in shown.items() if v}
    exp = {**exp, "planned_cells": [spec.name for _, spec in planned],  # what the table costs: every run it trains
           **({"variants": variants} if variants else {}),
           **({"lr_picks": {row: p.as_dict() for row, p in picks.items()}} if grid else {}),
           **({"longer": {"factor": length_check(exp, scale)[0], "variants": longer}} if longer else {}),
           **({"made_with": {"overrides": [o for o in extra if is_science_key(o.split("=", 1)[0].lstrip("+~"))],
                             "methods": sorted(changed)}} if changed else {})}
    if made := exp.get("made_with"):  # a table of other science than the file's: named by it, never over the default
        exp["output_stem"] = f"{exp.get('output_stem', exp['table'])}.{override_slug(made['overrides'])}"
    todo = [spec for part, spec in planned if part.pretrain or only_rows is None or part.row in only_rows]
    first = planned[0][1].cfg
    return Plan(exp, todo, picks, Path(first.paths.runs), Path(first.paths.results))


def _check_shared_dirs(specs: list[RunSpec]) -> None:
    by_dir: dict[str, list[str]] = {}
    for c in specs:
        by_dir.setdefault(str(c.run_dir), []).append(c.name)
    shared = {d: names for d, names in by_dir.items() if len(names) > 1}
    if shared:  # e.g. an extra run.name= override: the cells would overwrite each other's runs
        d, names = next(iter(shared.items()))
        raise ConfigError(f"{len(names)} cells ({', '.join(names[:3])}{', …' if len(names) > 3 else ''}) would share "
                          f"the run dir {d}; do not override run.name or run.dir for a whole table")


def _problem_report(problems: dict[str, list[str]], n_cells: int) -> list[str]:
    lines = []
    for msg, names in problems.items():
        if len(names) == n_cells and n_cells > 1:
            where = f"all {n_cells} cells"
        elif len(names) > 4:
            where = f"{len(names)} cells: {names[0]} … {names[-1]}"
        else:
            where = ", ".join(names)
        lines.append(f"  - {msg}  [{where}]")
    return lines


def _refusal(problems: dict[str, list[str]], n_cells: int) -> str:
    """What follows "refused before starting any job:": one problem on the same line, several one per line."""
    lines = _problem_report(problems, n_cells)
    return " " + lines[0][4:] if len(lines) == 1 else "\n" + "\n".join(lines)


# --------------------------------------------------------------------------------------------- checks and launch


@dataclass
class Todo:
    """What the cells of a plan need now."""

    pending: list[RunSpec] = field(default_factory=list)  # to train or submit
    stale: list[RunSpec] = field(default_factory=list)  # --force on SLURM: waiting cells whose old results must go
    waiting: dict[str, list[str]] = field(default_factory=dict)  # pretraining run -> the cells waiting for it
    queued: int = 0


def problems(p: Plan, args: argparse.Namespace, specs: list[RunSpec]) -> tuple[dict, dict]:
    """The preflight of every cell (options, data, batch split over the launcher's processes, checkpoints):
    ({message: cell names} that refuse the table, the same of warnings)."""
    found: dict[str, list[str]] = {}
    warnings: dict[str, list[str]] = {}
    for prob in launcher_problems(specs[0].cfg):
        found.setdefault(prob.message, []).append("launcher")
    for c in specs:
        c.checked = preflight_checked(c.cfg, check_data=bool(c.cfg.launcher.get("check_data", True)),
                                      check_run_dir=not args.force)
        for prob in c.checked.problems:
            # a dry run is often made away from the data (a laptop, a login node): missing data is a warning
            target = warnings if (args.dry_run and prob.kind == "data") else found
            target.setdefault(prob.message, []).append(c.name)
    return found, warnings


def todo(p: Plan, args: argparse.Namespace, specs: list[RunSpec]) -> Todo:
    """Skip finished cells and cells whose SLURM job is still queued or running; link a cell not started yet to a
    finished run of its science config under another name (engine/twins.py) instead of training it; on a job array,
    fine-tuning cells wait for their pretraining run (a job array has no order)."""
    from .engine.provenance import code_fingerprint, stale_parts
    from .engine.twins import TwinIndex, link

    out = Todo()
    by_name = {c.name: c for c in p.cells}
    twins: dict[Path, TwinIndex] = {}
    n = len(specs)
    code = code_fingerprint()
    for i, c in enumerate(specs, 1):
        # a reused twin (a link) is only ever read: under --force, or when its run is no longer finished (the owner
        # retrained or removed it), the link goes and this cell trains in its own dir; the twin is never touched
        if c.run_dir.is_symlink() and (args.force or not RunRecord(c.run_dir).finished) and not args.dry_run:
            c.run_dir.unlink()
        status = RunRecord(c.run_dir).status
        first_stage = needs(p.exp, c.name, args.scale)
        if first_stage and c.cfg.launcher.name in SUBMITIT_LAUNCHERS and \
                (args.force or not RunRecord(by_name[first_stage].run_dir).finished):
            out.waiting.setdefault(first_stage, []).append(c.name)
            if args.force:
                out.stale.append(c)
            out.queued += 1
            continue
        if args.force:
            out.pending.append(c)
            continue
        if status == "finished" and getattr(args, "refresh_stale", False) and not c.run_dir.is_symlink() and \
                (stale := stale_parts((RunRecord(c.run_dir).summary or {}).get("code"), code)):
            aside = _set_aside(c.run_dir, args.dry_run)
            print(f"[reproduce] {i}/{n} {c.name}: made by other code ({', '.join(stale)} differ from HEAD's); "
                  f"{'would be retrained' if args.dry_run else f'retrained (the old run kept as {aside.name})'}")
            out.pending.append(c)
            continue
        if status == "finished":
            if not args.dry_run and not c.run_dir.is_symlink():  # a broken best_model.pt: as `train` repairs it
                repair_finished(c.run_dir, say=lambda m: print(f"[reproduce] {m}"))
            print(f"[reproduce] {i}/{n} {c.name}: finished earlier, skipped")
            continue
        if not c.run_dir.is_symlink() and not c.run_dir.exists() and not getattr(args, "no_reuse", False):
            index = twins.setdefault(c.run_dir.parent, TwinIndex(c.run_dir.parent))
            if (twin := index.find(c.cfg, c.run_dir, code)) is not None:
                if not args.dry_run:
                    link(c.run_dir, twin)
                print(f"[reproduce] {i}/{n} {c.name}: the same science config finished as {twin.name}; "
                      f"{'would reuse' if args.dry_run else 'reused (linked)'} it, not trained again (--no-reuse: "
                      "train it anyway)")
                continue
        if status == "corrupt":
            print(f"[reproduce] {i}/{n} {c.name}: summary.json is unreadable (corrupt or half-written); "
                  "treating the cell as unfinished")
        elif status == "failed":
            print(f"[reproduce] {i}/{n} {c.name}: failed earlier; running it again")
        if c.cfg.launcher.name == "slurm" and (job := active_job(c.run_dir)):
            print(f"[reproduce] {i}/{n} {c.name}: job {job} is still queued or running, skipped")
            out.queued += 1
            continue
        out.pending.append(c)
    return out


def _set_aside(run_dir: Path, dry_run: bool) -> Path:
    """Move a finished run made by other code to `<dir>.stale-<n>` (kept, never deleted) so its cell trains again."""
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.stale-{n}")).exists():
        n += 1
    if not dry_run:
        run_dir.rename(aside)
    return aside


def _checked(p: Plan, args: argparse.Namespace, specs: list[RunSpec]) -> Todo | None:
    """The preflight, then what the cells need, with the waiting and warnings said; None when a problem refuses."""
    found, warnings = problems(p, args, specs)
    t = todo(p, args, specs)
    for first_stage, names in t.waiting.items():
        print(f"[reproduce] {len(names)} cells ({names[0]} … {names[-1]}) wait for their pretraining run "
              f"{first_stage}; run the same command again (without --force) once it has finished")
    if p.waiting:
        grid = ", ×".join(f"{m:g}" for m in p.picks[p.waiting[0]].lrs)
        keys = ", ".join(sorted({p.picks[r].key for r in p.waiting}))
        rows = ", ".join(p.waiting) if len(p.waiting) <= 4 else f"{p.waiting[0]} … {p.waiting[-1]}"
        print(f"[reproduce] lr grid ×{grid} of each row's optim.lr: {len(p.waiting)} rows ({rows}) run their first "
              f"seed at each multiplier first, picked by validation ({keys}); their other seeds are planned once "
              "those runs have ended")
    if warnings:
        print("[reproduce] warnings (a real submission would refuse these):")
        print("\n".join(_problem_report(warnings, len(specs))))
    if found:
        print("[reproduce] refused before starting any job:" + _refusal(found, len(specs)), file=sys.stderr)
        return None
    return t


def _submit(p: Plan, args: argparse.Namespace, t: Todo, seeds: list[int]) -> int:
    """The SLURM path (slurm, submitit_local): one job array of the pending cells."""
    from .launch import submit

    launcher = p.cells[0].cfg.launcher
    if args.dry_run and t.pending:
        print("\n".join(p.cost(t.pending)))
    if not t.pending:
        print("[reproduce] nothing to submit: every cell is finished or queued"
              + (f", or waits for its lr grid ({', '.join(p.waiting)})" if p.waiting else ""))
        if t.queued or p.waiting:
            print(f"[reproduce] {t.queued} cells are still queued or running; run the same command again once they "
                  f"end (lr grids: their stage 2), then `make report-table-N SCALE={args.scale}` writes the table")
            return 0
        return 0 if args.dry_run else report(args.full_plan() if args.only_rows else p, args.scale, seeds, [])
    if args.force and not args.dry_run:
        for c in [*t.pending, *t.stale]:  # a requeued job must resume, never wipe: clear the run dirs now instead
            shutil.rmtree(c.run_dir, ignore_errors=True)
    with StopFlag() as stop:
        failed = submit(t.pending, launcher, p.exp["table"], args.scale, dry_run=args.dry_run, stop=stop)
    if args.dry_run or (launcher.name == "slurm" and not launcher.get("wait")):
        return 0
    return report(args.full_plan() if args.only_rows else p, args.scale, seeds, failed)


def _local(p: Plan, args: argparse.Namespace, t: Todo, seeds: list[int], plan_again) -> int:
    """Train the pending cells here, one after another; with lr grids, plan again once a stage has run and train
    what the picks add (each cell at most once per command)."""
    from .launch import run_local

    if args.dry_run:
        print("\n".join(p.cost(t.pending)) if t.pending else "")
        print(f"[reproduce] dry run: {len(t.pending)} of {len(p.cells)} cells would train here, one after another "
              "(launcher=local)" + (f"; then the other seeds of {len(p.waiting)} rows at their lr pick"
                                    if p.waiting else ""))
        for c in t.pending:
            print(f"  {c.name} -> {c.run_dir}")
        return 0
    attempted: set[str] = set()
    failed: list[str] = []
    pending = t.pending
    res = None
    while True:
        attempted |= {c.name for c in pending}
        exp = p.exp
        if pending or res is None:  # the first stage always says what it trained, "0 of 0" included
            res = run_local(pending, exp["metric"], force=args.force,
                            needs=lambda name, exp=exp: needs(exp, name, args.scale))
            failed += res.failed
            if res.interrupted:
                break
        if not (p.waiting or length_check(p.exp, args.scale)):
            break
        # a stage has ended (trained now, finished earlier or linked to another table's twin runs): the picks add the
        # rows' other seeds, the verdicts the length check; stop once a plan adds no cell
        planned = {c.name for c in p.cells}
        p = plan_again()
        if not (new := [c for c in p.cells if c.name not in planned]):
            break
        if (t := _checked(p, args, new)) is None:
            return 2
        pending = [c for c in t.pending if c.name not in attempted]
    code = report(args.full_plan() if args.only_rows else p, args.scale, seeds, failed)
    if res is not None and res.interrupted:
        print(f"[reproduce] stopped: {len(res.failed)} cell(s) interrupted or failed, {len(res.not_started)} not "
              "started. Finished cells are kept; rerun the same command to finish the missing ones (interrupted "
              "cells resume from their checkpoint).")
        return 3
    return code


def _say_made(p: Plan) -> None:
    if made := p.exp.get("made_with"):
        print(f"[reproduce] {' '.join(made['overrides'])} changes {', '.join(made['methods'])}: the table is written "
              f"as {p.exp['output_stem']}.md, beside the default one")


def _run(args: argparse.Namespace, exp: dict, seeds: list[int]) -> int:
    def plan_now(read_records: bool = True, full: bool = False) -> Plan:
        """A plan of the cells to train (`full`: also the other rows' picks and variants, which the table reads)."""
        return plan(exp, args.scale, seeds, list(args.overrides), args.launcher, args.only_rows, read_records,
                    full=full or args.only_rows is None)

    args.full_plan = lambda: plan_now(full=True)
    # --force retrains: stage 1 of an lr grid runs again before anything picks (with --report-only it only means
    # "write the table anyway", and the picks are read from the runs as always)
    retrain = args.force and not args.report_only
    restoring = not retrain and not args.status
    p = with_kept(plan_now, args.scale, args.dry_run) if restoring else plan_now(read_records=not retrain)
    if args.status:  # queued / running / failed / finished per cell (launch.status_lines)
        from .launch import status_lines

        print(f"[reproduce] {p.exp['table']} at scale {args.scale}: {len(p.cells)} cells")
        print("\n".join(status_lines(p.cells)))
        return 0
    if args.report_only:
        _say_made(p)
        return report(args.full_plan() if args.only_rows else p, args.scale, seeds, [], force=args.force)
    if (t := _checked(p, args, p.cells)) is None:
        return 2
    _say_made(p)
    if p.cells[0].cfg.launcher.name in SUBMITIT_LAUNCHERS:
        return _submit(p, args, t, seeds)
    return _local(p, args, t, seeds, (lambda: with_kept(plan_now, args.scale)) if restoring else plan_now)


# --------------------------------------------------------------------------------------------- the table


def kept_root(p: Plan, scale: str) -> Path:
    """Where the table's finished runs are kept beside it (committed): results/<scale>/runs/."""
    return p.results_root / scale / "runs"


def restore_kept(p: Plan, scale: str, dry_run: bool = False) -> int:
    """Put back into the runs root the kept record of each planned cell whose run dir is absent (a fresh clone, a new
    machine): such a cell counts as finished, as it did where it ran. Never a cell being trained (its lock) or set
    aside by --refresh-stale (a `.stale-N` beside it), and never a pretraining run that a fine-tuning cell still to
    train would start from (records carry no weights). Returns how many were (or would be) restored."""
    kept = kept_root(p, scale)
    if not p.cells or not kept.is_dir():
        return 0

    def restorable(c: RunSpec) -> bool:
        rec = RunRecord(kept / c.name)
        own = RunRecord(c.run_dir)
        return rec.finished and not own.finished and not any(c.run_dir.parent.glob(f"{c.name}.stale-*")) and \
            not (c.run_dir.exists() and not (own.read_summary() or {}).get("restored_from"))

    todo = [c for c in p.cells if restorable(c)]
    if dry_run:
        if todo:
            print(f"[reproduce] {len(todo)} finished runs kept in {kept} would be restored into "
                  f"{p.cells[0].run_dir.parent} (they are listed below as cells to train)")
        return 0
    feeds = {c.name for c in p.cells if "_pretrain_" in c.name} if p.exp.get("pretrain") else set()
    n = sum(RunRecord(c.run_dir).restore_from(RunRecord(kept / c.name)) for c in todo if c.name not in feeds)
    for c in todo:  # a pretraining run: only once every fine-tuning cell that starts from it is finished
        users = [u for u in p.cells if needs(p.exp, u.name, scale) == c.name]
        if c.name in feeds and users and all(RunRecord(u.run_dir).finished for u in users):
            n += RunRecord(c.run_dir).restore_from(RunRecord(kept / c.name))
    if n:
        print(f"[reproduce] restored {n} finished runs from their kept records ({kept}) into "
              f"{p.cells[0].run_dir.parent}; they count as finished (no checkpoints: --force retrains them)")
    return n


def with_kept(make_plan, scale: str, dry_run: bool = False) -> Plan:
    """A plan after restoring the kept records of its cells, planned again until a restore adds nothing: restored
    runs decide lr picks and length checks, which add cells (a row's other seeds, the length runs) whose records may
    be kept too."""
    p = make_plan()
    while restore_kept(p, scale, dry_run):
        p = make_plan()
    return p


def keep_finished(p: Plan, scale: str) -> int:
    """Copy the records of the plan's finished cells (selection, reported and length runs) beside the table, so that
    committing results/<scale>/ keeps the evidence and a cut session loses no finished run."""
    root = kept_root(p, scale)
    return sum(RunRecord(c.run_dir).keep_in(root) for c in p.cells)


def _missing(md: str) -> int:
    return md.count("missing")


def report(p: Plan, scale: str, seeds: list[int], failed: list[str], force: bool = False) -> int:
    """Render the table from the runs there are (with the plan's variants and lr picks); 1 when cells failed. A table
    with more `missing` cells than the one already at its path (a fresh clone without runs) does not replace it: the
    old files are put back and the refusal says why (`force`: write it anyway)."""
    if n := keep_finished(p, scale):  # whether or not the table is written below: a finished run is evidence
        print(f"[reproduce] kept the records of {n} finished runs in {kept_root(p, scale)} (summary, config, metrics, "
              "patch report: commit them with the table)")
    out = p.results_root / scale
    stem = p.exp.get("output_stem", p.exp["table"])
    old = {f: f.read_bytes() for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".png")) if f.exists()}
    md_path, md = renderer_for(p.exp)(p.exp, scale, p.runs_root, p.results_root, seeds)
    before = old.get(md_path)
    if before is not None and not force and _missing(md) > _missing(before.decode(errors="replace")):
        for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".png")):
            if f not in old and f.exists():
                f.unlink()
        for f, data in old.items():
            f.write_bytes(data)
        print(f"[reproduce] kept {md_path}: the table from the runs under {p.runs_root} has more missing cells "
              f"({_missing(md)}) than the one there ({_missing(before.decode(errors='replace'))}); are the runs "
              "elsewhere (paths.runs, $CONDATTN_RUNS)? --force (FORCE=1) writes it anyway", file=sys.stderr)
        return 1
    print()
    print(md)
    print(f"[reproduce] wrote {md_path} (+ .csv, .png)")
    if failed:
        print(f"[reproduce] failed or interrupted cells: {', '.join(failed)}")
    return 1 if failed else 0


def rows_slug(rows: str) -> str:
    """'vit_*,listops' -> 'vit_+listops': the --rows patterns as a file-name part (glob characters dropped)."""
    return "+".join(re.sub(r"[^A-Za-z0-9_.-]", "", part) for part in rows.replace(",", " ").split()) or "rows"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.reproduce", description=__doc__.splitlines()[0])
    p.add_argument("experiment", help="experiments/tableN_*.yaml")
    p.add_argument("--scale", default="smoke", help="smoke | small | medium | paper")
    p.add_argument("--seeds", help='e.g. "0 1 2" or 0,1,2; default: the experiment\'s seeds for this scale')
    p.add_argument("--launcher", default="local", help=f"one of {', '.join(LAUNCHERS)}")
    p.add_argument("--dry-run", action="store_true",
                   help="validate every cell and print the jobs (and the exact sbatch script) without running")
    p.add_argument("--force", action="store_true", help="rerun finished cells from scratch")
    p.add_argument("--no-reuse", action="store_true", help="train every cell in its own run dir, even when a finished "
                   "run of another table has the same science config (by default it is linked and reused)")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table from existing runs")
    p.add_argument("--refresh-stale", action="store_true", help="retrain exactly the finished cells whose code "
                   "fingerprint (conditioning, model, task, engine) differs from HEAD's; the old runs are kept beside "
                   "them as <run>.stale-<n>")
    p.add_argument("--status", action="store_true", help="list each cell as queued, running, failed or finished (run "
                   "records, and squeue/sacct for SLURM jobs); trains nothing")
    p.add_argument("--rows", help='train only these rows, e.g. "listops" or "vit_*,listops_cet*" (shell globs); the '
                   "table is still written with every row, from the runs there are. Two processes of one command "
                   "already share its cells (each skips the cell the other trains); --rows splits them by hand")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell (e.g. impl.threads=2)")
    args = p.parse_intermixed_args(argv)

    try:
        exp = load_experiment(args.experiment)
    except (FileNotFoundError, ValueError) as e:
        print(f"[reproduce] {e}", file=sys.stderr)
        return 2
    if args.scale not in exp["scales"]:
        p.error(f"--scale {args.scale!r} is not defined in {args.experiment}; choose one of {list(exp['scales'])}")
    if args.launcher not in LAUNCHERS:
        p.error(f"--launcher {args.launcher!r} is not available; choose one of {list(LAUNCHERS)}")
    seeds = list(exp["scales"][args.scale]["seeds"])
    try:
        seeds = [int(x) for x in args.seeds.replace(",", " ").split()] if args.seeds else seeds
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: give integers, e.g. --seeds \"0 1 2\"")
    try:
        args.only_rows = select_rows(exp, args.scale, args.rows.replace(",", " ").split()) if args.rows else None
    except ValueError as e:
        p.error(str(e))
    if args.rows:  # a part of the table: written beside the full one (table9_readings.rows-vit_.md), never over it
        exp = {**exp, "output_stem": f"{exp['table']}.rows-{rows_slug(args.rows)}"}
    if not args.status and (early := early_problems(list(args.overrides))):  # before the plan reads or writes a run
        print("[reproduce] refused before starting any job: " + "; ".join(early), file=sys.stderr)
        return 2
    try:
        return _run(args, exp, seeds)
    except ConfigError as e:
        msg = str(e)
        print(f"[reproduce] refused before starting any job:{'' if msg.startswith(chr(10)) else ' '}{msg}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
