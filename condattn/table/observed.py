"""What a plan's runs measured: one `TableCell` per row × method (the metric of each finished seed, at 1× and at the
length check's 2×), and the validation curves behind steps-to-target and the baseline's last-quarter figure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..runs import RunId, RunRecord
from ..stats import last_quarter_change, median_steps, steps_to_target
from .planned import Plan


@dataclass
class TableCell:
    """One cell of a table: a row × method, with the metric of each finished seed's run (× the table's multiplier)."""

    row: str
    method: str
    seeds: list[int]
    values: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # seeds without a finished summary
    summaries: list[dict] = field(default_factory=list)

    def by_seed(self) -> dict[int, float]:
        return dict(zip([sd for sd in self.seeds if sd not in self.missing], self.values))


def _fill(plan: Plan, cell: TableCell, ids: list[RunId], variants) -> TableCell:
    metric = plan.exp.row_metric(plan.scale, cell.row)
    for i in ids:
        s = RunRecord.of(plan.runs_root, i, variants).summary
        if s is None or metric not in s["metrics"]:
            cell.missing.append(i.seed)
            continue
        cell.values.append(plan.exp.multiplier * float(s["metrics"][metric]))
        cell.steps.append(int(s["steps"]))
        cell.wall.append(float(s["wall_time_s"]))
        cell.summaries.append(s)
    return cell


def collect(plan: Plan) -> dict[tuple[str, str], TableCell]:
    """{(row, method): TableCell} of the plan's reported runs."""
    exp, scale = plan.exp, plan.scale
    cells = {}
    for row in exp.rows_at(scale):
        own = exp.row_seeds(scale, row, list(plan.seeds))
        for method in exp.methods_of(row):
            ids = [RunId(exp.table, row, method, scale, seed) for seed in own]
            cells[(row, method)] = _fill(plan, TableCell(row, method, own), ids, plan.variants)
    return cells


def longer_cell(plan: Plan, row: str, method: str, seeds: list[int]) -> TableCell | None:
    """The runs at factor × steps (the length check) of a row × method: the seeds whose longer run is planned
    (`plan.longer`, by the name of the run at 1×); None when it has none."""
    ids = [i for i in (RunId(plan.exp.table, row, method, plan.scale, sd) for sd in seeds) if i.name in plan.longer]
    return _fill(plan, TableCell(row, method, [i.seed for i in ids]), ids, plan.longer) if ids else None


def longer(plan: Plan, cells: dict[tuple[str, str], TableCell]) -> dict[tuple[str, str], TableCell]:
    """{(row, method): the cell's runs at factor × steps} for the cells that have them."""
    out = {}
    for (row, method), c in cells.items():
        if (cell := longer_cell(plan, row, method, c.seeds)) is not None:
            out[(row, method)] = cell
    return out


def missing_runs(cells: dict) -> int:
    """How many planned runs of these cells have no finished summary (the overwrite rule compares it)."""
    return sum(len(c.missing) for c in cells.values())


def curve(summary: dict, key: str, multiplier: float = 1.0, split: str = "val") -> list[tuple[int, float]]:
    """(step, value × multiplier) of every `split` row of a run's metrics.jsonl that has `key`."""
    rows = RunRecord(summary["run_dir"]).metrics_rows(split) if summary.get("run_dir") else []
    return [(int(r["step"]), multiplier * float(r[key])) for r in rows if r.get(key) is not None]


@dataclass(frozen=True)
class Target:
    """The baseline's mean validation value at half its training (the steps-to-target target), its final mean, and
    its last-quarter figures: the metric's gain (better is positive) and the validation loss's change in % (a fall is
    positive), means over seeds. A figure only: convergence is the length check's test."""

    value: float | None
    gain: float | None
    loss_fall: float | None
    final: float | None = None


GAIN_UNDER = 0.5  # points of the metric over the last quarter
LOSS_FALL_UNDER = 1.0  # % of the validation loss over the last quarter


def heuristic_holds(t: Target) -> bool | None:
    """The last-quarter heuristic: gain under 0.5 points, or the loss moving by under 1 % either way (a rising loss
    is overfitting, never a sign of convergence); None without a figure."""
    checks = [t.gain < GAIN_UNDER if t.gain is not None else None,
              abs(t.loss_fall) < LOSS_FALL_UNDER if t.loss_fall is not None else None]
    known = [c for c in checks if c is not None]
    return any(known) if known else None


def baseline_target(summaries: list[dict], key: str, multiplier: float, higher_is_better: bool = True) -> Target:
    """The target and the last-quarter figures from the baseline's validation curves (the last evaluation at or before
    half its steps: a level every row that learns reaches, never its own final mean)."""
    halves, finals, gains, falls = [], [], [], []
    sign = 1.0 if higher_is_better else -1.0
    for s in summaries:
        c = curve(s, key, multiplier)
        total = int(s.get("steps") or (c[-1][0] if c else 0))
        if half := [v for st, v in c if 0 < st <= total / 2]:
            halves.append(half[-1])
        if c:
            finals.append(c[-1][1])
        if (g := last_quarter_change(c, total)) is not None:
            gains.append(sign * g)
        loss = curve(s, "loss")
        if (d := last_quarter_change(loss, total)) is not None:
            start = [v for st, v in loss if st <= 0.75 * total][-1]
            falls.append(-100.0 * d / start if start else 0.0)

    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    return Target(mean(halves), mean(gains) if higher_is_better else None, mean(falls), mean(finals))


def steps_to(summaries: list[dict], target: float | None, key: str, multiplier: float,
             higher_is_better: bool = True) -> tuple[float | None, int, list[int | None]]:
    """(median over seeds of the first evaluated step reaching the target, None when the median run never does; the
    last evaluated step; the per-seed steps)."""
    if target is None or not summaries:
        return None, 0, []
    steps, last = [], 0
    for s in summaries:
        c = curve(s, key, multiplier)
        last = max(last, c[-1][0] if c else 0)
        steps.append(steps_to_target(c, target, higher_is_better) if c else None)
    return median_steps(steps), last, steps


def plateau_step(steps: list[int | None], total: int) -> float | None:
    """The baseline's median step to its final level when that is in the first half of training, else None."""
    med = median_steps(steps) if steps else None
    return None if med is None or not total or med > total / 2 else med


def last_quarter_gain(summaries: list[dict]) -> float | None:
    """Mean over runs of the validation top-1 gained over the last quarter of training (points); None when no run
    has a curve (tables 6 and 8 print it as a figure)."""
    gains = [g for s in summaries
             if (g := last_quarter_change(curve(s, "acc", 100.0), int(s.get("steps") or 0))) is not None]
    return statistics.fmean(gains) if gains else None
