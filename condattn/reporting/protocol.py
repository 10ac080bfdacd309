"""The fair protocol's columns for any table renderer (table 9 uses them; tables 1/4/5 can): each row's lr pick from
`reproduce`'s lr grid (`Plan.picks`), the minimum detectable effect, steps-to-target from the validation curves
(metrics.jsonl) and the baseline's convergence figure over the last quarter of training."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runs import RunRecord
from .evidence import pick_strength, pooled_sd
from .stats import (
    ALPHA,
    MDE_FORMULA,
    Verdict,
    benjamini_hochberg,
    diff_ci,
    fmt_num,
    holm,
    last_quarter_change,
    mde,
    median_steps,
    permutation_p,
    steps_to_target,
    welch_p,
)

if TYPE_CHECKING:
    from ..table.planned import Plan

CONVERGED_GAIN = 0.5  # points of the metric (its table units) over the last quarter of training
CONVERGED_LOSS_FALL = 1.0  # % of the validation loss over the last quarter


def curve(summary: dict, key: str, multiplier: float = 1.0, split: str = "val") -> list[tuple[int, float]]:
    """(step, value × multiplier) of every `split` row of a run's metrics.jsonl that has `key`."""
    rows = RunRecord(summary["run_dir"]).metrics_rows(split) if summary.get("run_dir") else []
    return [(int(r["step"]), multiplier * float(r[key])) for r in rows if r.get(key) is not None]


def lr_text(plan: Plan, row: str) -> str:
    """The lr of the pick named `row` (an `Experiment.pick_key`) as picked: "×1 (1e-03)", "×8 (8e-03, bound)" (the
    pick sits at the declared bound of the grid's extension, so the row's best lr may lie beyond it; "bound binding"
    when it still beats its inner neighbour), "×2 (2e-03, weak pick)" (its lead over its better neighbour is under one
    standard error of the selection seeds' scores: evidence.pick_strength), "×1 (1e-03, flat)" (every
    lr of the grid, grown each way to the bound, scored the same), "1e-03 (grid unfinished)", or "–" without a
    grid."""
    p = plan.lr_pick(row)
    if not p:
        return "–"
    if p["pick"] is None:
        return f"{p['base_lr']:.0e} (grid unfinished)"
    f = lr_facts(plan, row)
    marks = ["flat"] if f["lr_flat"] else [x for x, on in (("bound binding", f["lr_bound_binding"]),
                                                            ("bound", f["lr_at_bound"] and not f["lr_bound_binding"]),
                                                            ("weak pick", f["lr_weak_pick"])) if on]
    mark = "".join(f", {x}" for x in marks)
    return f"×{p['pick']:g} ({p['lr']:.0e}{mark})"


def lr_facts(plan: Plan, row: str) -> dict:
    """The pick named `row` (an `Experiment.pick_key`) as typed fields for the CSV/JSON rows: `lr_multiplier` and
    `lr_value` (None without a grid or with it unfinished), `lr_at_bound` (the pick sits at the declared bound),
    `lr_bound_binding` (and still beats its inner neighbour), `lr_flat` (every lr scored the same), `lr_weak_pick` (its
    lead is under one standard error: evidence.pick_strength), `lr_selection_seeds` (the most selection seeds any grid
    value has)."""
    p = plan.lr_pick(row) or {}
    scores = p.get("scores") or {}
    out = {"lr_multiplier": None, "lr_value": None, "lr_at_bound": bool(p.get("at_bound")), "lr_bound_binding": False,
           "lr_flat": False, "lr_weak_pick": False,
           "lr_selection_seeds": max((len(by_seed) for by_seed in scores.values()), default=0)}
    if not p or p.get("pick") is None:
        return out
    strength = pick_strength({float(m): list(by_seed.values()) for m, by_seed in scores.items()},
                             p["pick"], plan.exp.higher_is_better_for(), bool(p.get("at_bound")))
    flat = bool(p.get("flat"))
    return {**out, "lr_multiplier": float(p["pick"]), "lr_value": float(p["lr"]), "lr_flat": flat,
            "lr_bound_binding": not flat and strength == "bound binding",
            "lr_weak_pick": not flat and strength == "weak pick"}


def typed_fields(plan: Plan, key: str, t: Verdict | None, lt: Verdict | None, summaries: list[dict]) -> dict:
    """The typed facts of one csv/json row that findings reads (never the printed text): the lr pick (`lr_facts`),
    the verdict as a word and the MDE it names, at 1× (`outcome`, `mde`) and at 2× steps (`outcome_2x`, `mde_2x`; ""
    without a length check), and how many commits made its runs."""
    return {**lr_facts(plan, key), "outcome": t.outcome if t else "", "mde": t.mde_printed if t else None,
            "outcome_2x": lt.outcome if lt else "", "mde_2x": lt.mde_printed if lt else None,
            "n_commits": len({s.get("commit", "") for s in summaries} - {""})}


def family_facts(facts: dict, family: str) -> dict:
    """A family's `plateau` (the baseline reaches its final level in the first half of training) and `converged_2x`
    (the convergence test at 2× steps; None: not judged) from protocol_lines' `facts`."""
    f = facts.get(family) or {}
    return {"plateau": bool(f.get("plateau")), "converged_2x": f.get("converged_2x")}


def grid_text(plan: Plan, row: str) -> str:
    """"×0.5: 96.1 (96.0 96.2), ×1: …" — each grid value's mean validation score and its selection seeds' scores in
    the pick named `row` (an `Experiment.pick_key`; pending: not finished; failed), for the CSV."""
    p = plan.lr_pick(row)
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
    """The baseline's mean validation value at half its training (the steps-to-target target) and its last-quarter
    figure (a figure only: convergence is judged by the baseline's run at 2× its steps, `length_line`)."""

    value: float | None
    gain: float | None  # mean over seeds of the metric's gain over the last quarter (sign: better is positive)
    loss_fall: float | None  # mean over seeds of the validation loss's fall over the last quarter, in %
    final: float | None = None  # the baseline's final mean validation value (the plateau line measures against it)

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
        verdict = "holds" if self.converged else "does not hold"
        return (f"Baseline's last quarter (a figure, not the convergence test: under a cosine schedule a small "
                f"last-quarter gain is forced at any length): {', '.join(parts)} (mean over seeds); the heuristic "
                f"({' or '.join(rule)}) {verdict}.")


def length_text(is_baseline: bool, long_cell, long_test: Verdict | None, test: Verdict | None, digits: int = 2) -> str:
    """The "Δ at 2× steps" column: the baseline's value at 2×, or a row's Δ with its interval and n, saying where the
    verdict there differs from the one at 1×; "–" where the row has no length check. Runs at 2× that are planned but
    not finished read "missing", as in any cell (`TableCell.text`), so a table written mid-check never replaces a
    complete one."""
    if long_cell is None:
        return "–"
    if is_baseline or not long_cell.values:
        return long_cell.text()
    gaps = f", missing seeds {long_cell.missing}" if long_cell.missing else ""
    if long_test is None or long_test.ci is None:
        return f"– (n={len(long_cell.values)}{gaps})"
    same = test is None or long_test.word.split(" (")[0] == test.word.split(" (")[0]  # the word, not its MDE
    change = "" if same else f"; verdict there: {long_test.word}"
    return f"{long_test.ci.text(digits)} (n={len(long_cell.values)}{gaps}{change})"


def length_convergence(name: str, base_cell, long_cell, mde_05: float | None, higher: bool,
                       unit: str = "points", digits: int = 2) -> str:
    """The convergence test: the baseline's gain at 2× its steps over the same seeds at 1×, against its MDE at α = 0.05
    (cells: TableCell-like, `seeds`, `missing`, `values` in seed order)."""
    if base_cell is None or long_cell is None:
        return (f"Convergence ({name}): not tested yet: the baseline has no run at 2× its steps (the length check "
                "runs once the baseline and the primary rows have finished).")

    def by_seed(c) -> dict[int, float]:
        return dict(zip([sd for sd in c.seeds if sd not in c.missing], c.values))

    one, two = by_seed(base_cell), by_seed(long_cell)
    paired = sorted(set(one) & set(two))  # the same seeds on both sides, whatever failed on either
    sign = 1.0 if higher else -1.0  # a gain is an improvement: a lower loss for a loss
    gain = sign * statistics.fmean(two[sd] - one[sd] for sd in paired) if len(paired) >= 2 else None
    if gain is None or mde_05 is None:
        return f"Convergence ({name}): not tested (fewer than 2 seeds finished at both lengths, or no MDE)."
    ok = gain < mde_05
    units = f" {unit}" if unit else ""
    return (f"Convergence ({name}): at 2× its steps the baseline gains {gain:+.{digits}f}{units} over the same "
            f"{len(paired)} seeds at 1×, {'under' if ok else 'NOT under'} its MDE {fmt_num(mde_05)}: "
            f"{'converged' if ok else 'still learning; verdicts at 1× steps may change with length'}.")


def baseline_target(summaries: list[dict], key: str, multiplier: float, higher_is_better: bool = True) -> Target:
    """The steps-to-target target and the convergence figure from the baseline's runs' validation curves. The target
    is the baseline's mean validation value at half its training (the last evaluation at or before half its steps),
    a level every row that learns reaches: never its own final mean, which half of its own seeds miss."""
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
    return Target(statistics.fmean(halves) if halves else None, statistics.fmean(gains) if gains else None,
                  statistics.fmean(falls) if falls else None, statistics.fmean(finals) if finals else None)


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


def plateau_step(steps: list[int | None], total: int) -> float | None:
    """The baseline's median step to its final level when that is in the first half of training (a plateau), else
    None (`plateau_text` says it in words; the CSV/JSON's `plateau` is whether it is not None)."""
    med = median_steps(steps) if steps else None
    return None if med is None or not total or med > total / 2 else med


def plateau_text(steps: list[int | None], total: int) -> str:
    """A line when the baseline got to its own final level in the first half of training (median over seeds): its
    convergence figure then holds because it plateaued early, not because it learned the task, and the table says
    so; "" otherwise. `steps`: the baseline's per-seed steps to its final mean validation level (`Target.final`, not
    the half-training target, which half its seeds reach by half by construction); `total`: its last evaluated step."""
    med = plateau_step(steps, total)
    if med is None:
        return ""
    return (f"Plateau: the baseline reaches its final validation level by step {med:g} of {total} (median over seeds), "
            "in the first half of training: its convergence figure reads an early plateau, so this task's readings "
            "compare methods on that plateau rather than on a learned task (the table prints its floors).")


def verdicts(base: list[float], arms: list[tuple[str, list[float], str]], higher_is_better: bool = True,
             pooled: bool = False) -> dict[str, Verdict]:
    """Each arm's test against the baseline values of its task: `arms` are (key, values, hypothesis) of the task's
    other rows. The primary arms form one family, Holm-corrected; the exploratory arms get Benjamini–Hochberg q. The
    MDE (baseline std, or with `pooled` the pooled std of the baseline and the arm; n = the smaller arm) at α = 0.05
    and at 0.05/m, m the arm's family size. The length check's tests (5 seeds a side, where the baseline's spread
    alone is poorly measured) use `pooled`."""
    raw = {k: welch_p(base, v) for k, v, _ in arms}
    base_sd = statistics.stdev(base) if len(base) > 1 else None
    out = {}
    for hyp, correct, name in (("primary", holm, "holm"), ("exploratory", benjamini_hochberg, "bh")):
        fam = [(k, v) for k, v, h in arms if h == hyp]
        # the family is every declared row: one without a test yet counts as p = 1, so the others are never
        # corrected for fewer comparisons than were declared
        adjusted = correct([1.0 if raw[k] is None else raw[k] for k, _ in fam])
        adjusted = [None if raw[k] is None else a for (k, _), a in zip(fam, adjusted)]
        m = max(len(fam), 1)
        for (k, v), adj in zip(fam, adjusted):
            n = min(len(v), len(base))
            sd = pooled_sd(base, v) if pooled else base_sd
            out[k] = Verdict(diff_ci(base, v), raw[k], adj, permutation_p(base, v), name,
                             mde(sd, n) if sd is not None else None,
                             mde(sd, n, alpha=ALPHA / m) if sd is not None else None, higher_is_better)
    return out


def verdict_line(found: list[tuple[str, Verdict]]) -> str:
    """The table's closing sentence, from the adjusted p alone (never from an interval)."""
    said = {w: [k for k, v in found if v.word == w] for w in ("better", "worse")}
    if not any(v.p is not None for _, v in found):
        return "With fewer than 2 seeds per row there is no test: this table cannot say which reading is better."
    parts = [f"{w} than the baseline: {'; '.join(ks)}" for w, ks in said.items() if ks]
    return ("Verdicts (adjusted p < 0.05; Holm over each task's primary rows, Benjamini–Hochberg q over its "
            "exploratory rows): " + (". ".join(parts) if parts else "no row differs from its baseline") + ".")


FOOTER = ("Protocol: each row's peak lr is picked by the mean validation score of the selection seeds (never reported, "
          "never a test score; each seed's grid scores are in the CSV) over a log2 grid of multiples of the row's "
          "optim.lr, grown one step while the pick sits at an edge, up to the declared bound ('bound': the pick sits "
          "there, so the row's best lr may lie beyond it); a grid on which every lr scores the same grows one step "
          "each way, up to the bound, and if it stays so the pick is the lr nearest ×1, marked 'flat' (the pick "
          "carries no information: the row scored the same, e.g. chance, at every lr tried; a failed lr is left "
          "out and ends its side); the baseline follows the same rule. Then every reported seed runs at the pick. "
          "Tests per row against its task's baseline: Welch's p, adjusted by Holm over the "
          "task's primary rows (declared in the experiment file before running) or as a Benjamini–Hochberg q over "
          "its exploratory rows, and an exact permutation p; the verdict is 'better' or 'worse' only when the "
          "adjusted p < 0.05, else 'no difference detected' with the MDE at the corrected α. "
          f"{MDE_FORMULA}, s the baseline's std over its seeds (at 2× steps, 5 seeds a side: the pooled std of both "
          "arms), n seeds per arm: a true difference smaller than the MDE is missed more often than 1 time in 5. "
          "Reach: the MDE as a relative fall in error (100 − accuracy; for a loss, in the loss above 0) at our "
          "baseline, beside each paper's claimed relative fall (their numbers); a paper-sized effect here is the "
          "claim's relative fall at our baseline, and its seeds per arm n = ⌈2(z_{0.975} + z_{0.8})² sd² / effect²⌉ "
          "(sd pooled over the baseline and the row). A pick marked 'weak pick' leads its better neighbour by less "
          "than one standard error of the selection seeds' scores; 'bound binding': the pick sits at the bound and "
          "still beats its inner neighbour (growing the grid needs training). Steps to target: the first evaluated "
          "step at which a run's validation metric reaches the baseline's mean validation metric at half its "
          "training, median over seeds "
          "('> N': the median run never reached it by its last evaluation N).")
