"""The fair protocol's columns for any table renderer (table 9 uses them; tables 1/4/5 can): each row's lr pick from
`reproduce`'s lr grid (`exp["lr_picks"]`), the minimum detectable effect, steps-to-target from the validation curves
(metrics.jsonl) and the baseline's convergence figure over the last quarter of training."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..runs import RunRecord
from .stats import MDE_FORMULA, last_quarter_change, mde, median_steps, steps_to_target

CONVERGED_GAIN = 0.5  # points of the metric (its table units) over the last quarter of training
CONVERGED_LOSS_FALL = 1.0  # % of the validation loss over the last quarter


def curve(summary: dict, key: str, multiplier: float = 1.0, split: str = "val") -> list[tuple[int, float]]:
    """(step, value × multiplier) of every `split` row of a run's metrics.jsonl that has `key`."""
    rows = RunRecord(summary["run_dir"]).metrics_rows(split) if summary.get("run_dir") else []
    return [(int(r["step"]), multiplier * float(r[key])) for r in rows if r.get(key) is not None]


def pick_key(exp: dict, row: str, method: str) -> str:
    """The key of a cell group's lr pick in `exp["lr_picks"]`: the row, when it trains one method (table 9's readings),
    else "<row>/<method>" (tables 1, 3, 4, 5: each method of a row picks its own lr)."""
    own = exp["rows"][row].get("method")
    return row if own is not None or len(exp["methods"]) == 1 else f"{row}/{method}"


def lr_text(exp: dict, row: str) -> str:
    """The lr of the pick named `row` (a `pick_key`) as picked: "×1 (1e-03)", "×8 (8e-03, bound)" (the pick sits at
    the declared bound of the grid's extension, so the row's best lr may lie beyond it), "1e-03 (grid unfinished)",
    or "–" without a grid."""
    p = (exp.get("lr_picks") or {}).get(row)
    if not p:
        return "–"
    if p["pick"] is None:
        return f"{p['base_lr']:.0e} (grid unfinished)"
    return f"×{p['pick']:g} ({p['lr']:.0e}{', bound' if p.get('at_bound') else ''})"


def grid_text(exp: dict, row: str) -> str:
    """"×0.5: 96.1 (96.0 96.2), ×1: …" — each grid value's mean validation score and its selection seeds' scores in
    the pick named `row` (a `pick_key`; pending: not finished; failed), for the CSV."""
    p = (exp.get("lr_picks") or {}).get(row)
    if not p:
        return ""

    def one(s):
        return "pending" if s is None else ("failed" if math.isnan(s) else f"{s:.4f}")

    def per_seed(by_seed: dict) -> str:
        return " ".join(f"s{seed}={one(v)}" for seed, v in by_seed.items())

    return ", ".join(f"×{m:g}: {one(p['means'].get(m))} ({per_seed(by_seed)})" for m, by_seed in
                     sorted(p["scores"].items()))


@dataclass
class Target:
    """The baseline's final mean validation value (the steps-to-target target) and its convergence figure."""

    value: float | None
    gain: float | None  # mean over seeds of the metric's gain over the last quarter (sign: better is positive)
    loss_fall: float | None  # mean over seeds of the validation loss's fall over the last quarter, in %

    @property
    def converged(self) -> bool | None:
        """The criterion: gain < 0.5 points, or the loss falls by < 1%; None without a figure."""
        checks = [x for x in (self.gain is not None and self.gain < CONVERGED_GAIN,
                              self.loss_fall is not None and self.loss_fall < CONVERGED_LOSS_FALL)]
        return any(checks) if self.gain is not None or self.loss_fall is not None else None

    def text(self, unit: str = "points") -> str:
        if self.gain is None and self.loss_fall is None:
            return "Baseline convergence: no validation curve to measure it on."
        parts, rule = [], []
        if self.gain is not None:
            parts.append(f"its validation metric gains {self.gain:+.2f} {unit}")
            rule.append(f"gain < {CONVERGED_GAIN:g} {unit}")
        if self.loss_fall is not None:
            parts.append(f"the validation loss falls {self.loss_fall:.1f} %")
            rule.append(f"loss fall < {CONVERGED_LOSS_FALL:g} %")
        verdict = "holds" if self.converged else "does NOT hold: the baseline is still learning"
        return (f"Baseline convergence: over the last quarter of training {', '.join(parts)} (mean over seeds); the "
                f"criterion ({' or '.join(rule)}) {verdict}.")


def baseline_target(summaries: list[dict], key: str, multiplier: float, higher_is_better: bool = True) -> Target:
    """The target and the convergence figure from the baseline's runs' validation curves."""
    finals, gains, falls = [], [], []
    sign = 1.0 if higher_is_better else -1.0
    for s in summaries:
        c = curve(s, key, multiplier)
        if c:
            finals.append(c[-1][1])
        total = int(s.get("steps") or (c[-1][0] if c else 0))
        if (g := last_quarter_change(c, total)) is not None:
            gains.append(sign * g)
        loss = curve(s, "loss")
        if (d := last_quarter_change(loss, total)) is not None:
            start = [v for st, v in loss if st <= 0.75 * total][-1]
            falls.append(-100.0 * d / start if start else 0.0)
    return Target(statistics.fmean(finals) if finals else None, statistics.fmean(gains) if gains else None,
                  statistics.fmean(falls) if falls else None)


def steps_column(summaries: list[dict], target: float | None, key: str, multiplier: float,
                 higher_is_better: bool = True) -> tuple[str, list[int | None]]:
    """("1200", per-seed steps) — the median over seeds of the first evaluated step reaching the target; "> N" (N the
    last evaluated step) when the median run never reaches it; "–" without a target or curves."""
    if target is None or not summaries:
        return "–", []
    steps, last = [], 0
    for s in summaries:
        c = curve(s, key, multiplier)
        last = max(last, c[-1][0] if c else 0)
        steps.append(steps_to_target(c, target, higher_is_better) if c else None)
    med = median_steps(steps)
    return (f"> {last}" if med is None else f"{med:g}"), steps


def plateau_text(steps: list[int | None], total: int) -> str:
    """A line when the baseline got to its own final level in the first half of training (median over seeds): its
    convergence figure then holds because it plateaued early, not because it learned the task, and the table says
    so; "" otherwise. `steps`: the baseline's per-seed steps to its target; `total`: its last evaluated step."""
    med = median_steps(steps) if steps else None
    if med is None or not total or med > total / 2:
        return ""
    return (f"Plateau: the baseline reaches its final validation level by step {med:g} of {total} (median over seeds), "
            "in the first half of training: its convergence figure reads an early plateau, so this task's readings "
            "compare methods on that plateau rather than on a learned task (the table prints its floors).")


def mde_text(base_values: list[float], n: int) -> tuple[str, float | None]:
    """The minimum detectable effect for n seeds per arm from the baseline's spread ("–" under 2 seeds)."""
    if len(base_values) < 2 or n < 2:
        return "–", None
    m = mde(statistics.stdev(base_values), n)
    return (f"{m:.2f}" if m is not None else "–"), m


FOOTER = ("Protocol: each row's peak lr is picked from the scale's lr grid (multiples of the row's optim.lr) by its "
          "first seed's validation score (never a test score; the grid's scores are in the CSV), then every seed runs "
          "at the pick ('grid edge': the pick is an end of the grid, so the row's best lr may lie beyond it). "
          f"{MDE_FORMULA}, s the baseline's std over its seeds, n seeds per arm: a true difference "
          "smaller than the MDE is missed more often than 1 time in 5. Steps to target: the first evaluated step at "
          "which a run's validation metric reaches the baseline's final mean validation metric, median over seeds "
          "('> N': the median run never reached it by its last evaluation N).")
