"""The fair lr protocol: each row picks its lr on selection seeds over a log2 grid grown at an edge up to a bound."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..experiment import Experiment
from ..launch import ConfigError, RunSpec
from ..runs import RunRecord, variant_of
from .cells import Part
from .compose import Composer, named, reseeded
from .store import Records

TIE_NEAREST = "nearest ×1"  # a tie on the grid's mean score goes to the multiplier nearest ×1 (in log2 steps)
TIE_LOWER = "the lower lr"  # then, between two as near ×1 (×1/2 and ×2), to the lower lr


def lr_grid(exp: Experiment, scale: str) -> list[float]:
    """The scale's starting `lr_grid` (validated when the file was parsed): log2-spaced multipliers of each row's
    optim.lr ([] without one)."""
    return sorted(exp.at(scale).lr_grid)


def lr_bound(exp: Experiment, scale: str) -> tuple[float, float]:
    """The declared bound of the grid's extension (`lr_bound: [lo, hi]`, default ×1/8 … ×8): while a pick sits at an
    edge of the grid, the grid grows one log2 step that way, never past the bound."""
    return exp.at(scale).lr_bound


def selection_seeds(exp: Experiment, scale: str, reported: list[int] | None = None) -> list[int]:
    """The seeds that pick each row's lr (`selection_seeds`, at least 2): never reported, disjoint from the
    reported seeds (the scale's, checked when the file was parsed, and `reported`: the ones this command reports,
    --seeds); ConfigError naming what is wrong."""
    if problem := exp.at(scale).problem(exp.table, scale, reported):
        raise ConfigError(problem)
    return list(exp.at(scale).selection_seeds)


def selection_key(exp: Experiment, row: str, scale: str | None = None) -> str:
    """The validation metric a row's lr grid picks by, never a test metric: the row's (or the experiment's)
    `select_metric`, else the validation twin of the row's metric: test_<k> (scored at the best validation
    checkpoint, LRA) -> val_<k> (the best validation value), final_test_<k> -> final_val_<k>, and a validation
    metric (final_val_<k>: ViT's final validation top-1) itself. The row's metric at `scale` is the one its table
    reports (`Experiment.row_metric`)."""
    metric = exp.row_metric(scale, row)
    key = exp.rows[row].select_metric or exp.select_metric
    if key is None:
        for test, val in (("final_test_", "final_val_"), ("test_", "val_")):
            if metric.startswith(test):
                key = val + metric[len(test):]
                break
        else:
            key = metric if metric.startswith(("val_", "final_val_")) else None
    if not key or "test" in key:
        raise ConfigError(f"row {row!r} of {exp.table}: no validation metric to pick its lr by (its metric is "
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
        """The multiplier with the best finite mean score, once every run of the grid has ended; None before. A tie
        (the same mean, exactly) goes to the multiplier nearest ×1 in log2 steps, and between two as near (×1/2 and
        ×2) to the lower lr: `tie_break` names which rule decided."""
        means = {m: self.mean(m) for m in self.lrs}
        if any(v is None for v in means.values()):
            return None
        done = [m for m, v in means.items() if v is not None and math.isfinite(v)]
        sign = 1.0 if higher_is_better else -1.0
        return max(done, key=lambda m: (sign * means[m], -abs(math.log(m)), -m), default=None)  # type: ignore[operator]

    def tie_break(self) -> tuple[tuple[float, ...], str]:
        """The multipliers whose mean equals the pick's exactly, and the rule that chose among them: "nearest ×1",
        or "the lower lr" when one of them is as near ×1 as the pick; ((), "") without a tie, a pick, or on a flat
        grid (a flat grid is its own mark)."""
        if self.pick is None or self.flat():
            return (), ""
        at = self.mean(self.pick)
        tied = tuple(sorted(m for m in self.lrs if m != self.pick and self.mean(m) == at))
        if not tied:
            return (), ""
        near = any(math.isclose(abs(math.log(m)), abs(math.log(self.pick))) for m in tied)
        return tied, TIE_LOWER if near else TIE_NEAREST

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



def lr_variant(base_lr: float, m: float) -> tuple[tuple[str, ...], str]:
    """The protocol's overrides and words of multiplier `m` (`compose.named`): ×1 is the row's own cell."""
    return ((), "") if m == 1 else ((lr_override(base_lr * m),), variant_of(lr=m))



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



def grid_row(comp: Composer, group: list[Part], grid: list[float], extra: list[str], exp: Experiment, scale: str,
              read_records: bool, renamed: Mapping[str, str],
              records: Records) -> tuple[list[tuple[Part, RunSpec]], LrPick | None, dict[str, str]]:
    """One row's cells under an lr grid. Stage 1: every selection seed at every multiplier of the grid; while the best
    mean score sits at an edge of the grid, the grid grows one log2 step that way (up to the declared bound) and the new
    multiplier's runs are planned; a flat grid (every lr the same score) grows one step each way. Stage 2, once the pick
    is final: the row's reported seeds at the pick (selection runs are never reported). Returns the cells, the pick
    and the variants of the reported runs ({readable name: variant}). `renamed`: the pretraining runs' variant names,
    which the cells' model.init_from follows (table 3)."""
    first = group[0]
    try:
        base_lr = float(comp.base([*first.own, *extra]).optim.lr)
    except ConfigError as e:
        comp.errors.setdefault(str(e), []).append(first.name)
        return [], None, {}
    table = exp.table
    sel = [reseeded(first, s, table, scale) for s in selection_seeds(exp, scale, [p.seed for p in group])]
    pick = LrPick(first.row, selection_key(exp, first.row, scale), base_lr, {}, [p.seed for p in sel],
                  lr_bound(exp, scale))
    out: list[tuple[Part, RunSpec]] = []
    higher = exp.higher_is_better_for(first.row)
    todo = list(grid)
    while todo:
        for m in todo:
            pick.lrs[m] = base_lr * m
            pick.scores[m] = {}
            for part in sel:
                spec, _ = named(comp, part, extra, renamed, *lr_variant(base_lr, m))
                if spec is None:
                    return out, None, {}
                out.append((part, spec))
                pick.scores[m][part.seed] = grid_score(records.of(spec.name, spec.cfg, spec.run_dir), pick.key) \
                    if read_records else None
        best = pick.best(higher)
        todo = [] if best is None else pick.next_steps(best)
        if best is not None and not todo:
            pick.pick = best
    shown = {}
    if pick.pick is not None:
        for part in group:
            spec, v = named(comp, part, extra, renamed, *lr_variant(base_lr, pick.pick))
            if spec is not None:
                out.append((part, spec))
                shown[part.name] = v
    return out, pick, shown

