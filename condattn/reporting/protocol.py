"""The fair protocol's block under a table, formatted from its `TableResult`: per family one line per method (its
held-out metric, Δ to the baseline with its interval, p's, verdict, Δ at 2×, the lr pick with its mark, the MDE,
steps-to-target), then the family's lines (last-quarter figure, reach, convergence, noise floor, floors, plateau), the
verdict line, the footer and the cost line. Formatting only."""

from __future__ import annotations

from ..table.result import Arm, Family, Mark, Outcome, Pick, TableResult
from .fmt import MDE_FORMULA, fmt_ci, fmt_num, fmt_p, fmt_values, test_word, verdict_text
from .reach import convergence_text, noise_text, reach_text


def lr_text(pick: Pick | None) -> str:
    """"×1 (1e-03)", "×8 (8e-03, bound binding)", "×2 (2e-03, weak pick)", "×1 (1e-03, flat)", "1e-03 (grid
    unfinished)", or "–" without a grid."""
    if pick is None:
        return "–"
    if pick.multiplier is None:
        return f"{pick.base_lr:.0e} (grid unfinished)"
    marks = ["flat"] if pick.flat else [
        *(["bound binding"] if pick.mark == Mark.BINDING else ["bound"] if pick.at_bound else []),
        *(["weak pick"] if pick.mark == Mark.WEAK else []), *([tie_text(pick)] if pick.tied else [])]
    return f"×{pick.multiplier:g} ({pick.lr:.0e}{''.join(f', {m}' for m in marks)})"


def tie_text(pick: Pick) -> str:
    """"tied with ×0.5, picked: nearest ×1" for a pick whose mean score another multiplier equals exactly."""
    return f"tied with {', '.join(f'×{m:g}' for m in pick.tied)}, picked: {pick.tie_break}"


def pick_marks(pick: Pick | None) -> list[str]:
    """The marks an lr pick prints, as findings names them."""
    if pick is None or pick.multiplier is None:
        return ["lr grid unfinished"] if pick is not None else []
    if pick.flat:
        return ["lr grid flat (the same score at every lr)"]
    out = ["lr pick at the bound, and it still beats its inner neighbour (bound binding)"] \
        if pick.mark == Mark.BINDING else ["lr pick at the bound"] if pick.at_bound else []
    if pick.mark == Mark.WEAK:
        out.append(f"weak lr pick (its lead {pick.lead:.3g} over its neighbour is under the standard error "
                   f"{pick.se:.3g} of the selection means)")
    if pick.tied:
        out.append(f"lr pick tied with {', '.join(f'×{m:g}' for m in pick.tied)} (the same mean validation score); "
                   f"the tie-break picked ×{pick.multiplier:g}: {pick.tie_break}")
    return out


def grid_text(pick: Pick | None) -> str:
    """"×0.5: 0.9540 (s100=0.9520 s101=0.9560), ×1: …" for the CSV (pending: not finished; failed)."""
    if pick is None:
        return ""

    def one(s):
        return "pending" if s is None else ("failed" if s != s else f"{s:.4f}")

    means = dict(pick.means)
    return ", ".join(f"×{m:g}: {one(means.get(m))} ({' '.join(f's{sd}={one(v)}' for sd, v in by_seed)})"
                     for m, by_seed in pick.scores)


def length_text(a: Arm, is_baseline: bool, digits: int = 2) -> str:
    """The "Δ at 2× steps" column: the baseline's value at 2×, or a row's Δ there with its interval and n, saying
    where the verdict differs from the one at 1×; "–" without a length check; "missing" for planned runs not
    finished."""
    v = a.at2
    if v is None:
        return "–"
    if is_baseline or not v.n:
        return fmt_values(v, digits)
    gaps = f", missing seeds {list(v.missing)}" if v.missing else ""
    t2 = a.test2
    if t2 is None or t2.diff is None:
        return f"– (n={v.n}{gaps})"
    change = "" if a.test is None or t2.outcome == a.test.outcome else f"; verdict there: {test_word(t2)}"
    return f"{fmt_ci(t2.diff, t2.low, t2.high, digits)} (n={v.n}{gaps}{change})"


def target_text(f: Family, unit: str = "points") -> str:
    t = f.target
    if t.gain is None and t.loss_fall is None:
        return "Baseline's last quarter: no validation curve to measure it on."
    parts, rule = [], []
    if t.gain is not None:
        parts.append(f"its validation metric gains {t.gain:+.2f} {unit}")
        rule.append(f"gain < 0.5 {unit}")
    if t.loss_fall is not None:
        parts.append(f"the validation loss {'falls' if t.loss_fall >= 0 else 'rises'} {abs(t.loss_fall):.1f} %")
        rule.append("the loss moving < 1 % either way")
    return (f"Baseline's last quarter (a figure, not the convergence test: under a cosine schedule a small "
            f"last-quarter gain is forced at any length): {', '.join(parts)} (mean over seeds); the heuristic "
            f"({' or '.join(rule)}) {'holds' if f.heuristic else 'does not hold'}.")


def plateau_text(f: Family) -> str:
    if f.plateau is None:
        return ""
    return (f"Plateau: the baseline reaches its final validation level by step {f.plateau:g} of {f.plateau_total} "
            "(median over seeds), in the first half of training: its convergence figure reads an early plateau, so "
            "this task's readings compare methods on that plateau rather than on a learned task (the table prints "
            "its floors).")


def floor_text(f: Family, scale: str, digits: int = 2) -> str:
    if f.floor_metric_mismatch:
        return (f"its cached floors are for {f.floor_metric_mismatch}, not this table's metric: rerun `python -m "
                f"condattn.floors --scale {scale}`.")
    fl, mean = f.floor, f.baseline.at1.mean
    if fl is None or mean is None:
        return ""
    if fl.beats:
        return (f"the baseline ({mean:.{digits}f}) beats every floor (the best: {fl.label}, {fl.value:.{digits}f} on "
                f"{fl.split}).")
    return (f"the baseline ({mean:.{digits}f}) does NOT beat its floors: the best, {fl.label}, reaches "
            f"{fl.value:.{digits}f} on {fl.split}, a gap of {fl.gap:.{digits}f} in its favour.")


def family_notes(f: Family, scale: str, unit: str, digits: int) -> list[str]:
    """The lines under a family: last quarter, reach, convergence, noise floor, floors, plateau."""
    out = [f"{f.name}: {target_text(f, unit or 'points')}"]
    if f.untested:
        out.append(f"Reach ({f.name}): not tested (one pretraining run per method): this table rules out no effect "
                   "size and its rows print no interval.")
    else:
        out += [reach_text(f, digits), *([convergence_text(f, unit, digits)] if f.length_check else []),
                noise_text(f, digits)]
    if floor := floor_text(f, scale, digits):
        out.append(f"{f.name}: {floor}")
    if plateau := plateau_text(f):
        out.append(f"{f.name}: {plateau}")
    return out


def verdict_line(found: list[tuple[str, Arm]]) -> str:
    """The table's closing sentence, from the adjusted p alone, each verdict with its basis."""
    if not any(a.test is not None and a.test.p is not None for _, a in found):
        return "With fewer than 2 seeds per row there is no test: this table cannot say which reading is better."
    parts = []
    for w in (Outcome.BETTER, Outcome.WORSE):
        names = [f"{name}{'' if a.basis.value == 'no length check' else f' ({a.basis.value})'}"
                 for name, a in found if a.test is not None and a.test.outcome == w]
        if names:
            parts.append(f"{w.value} than the baseline: {'; '.join(names)}")
    return ("Verdicts (adjusted p < 0.05; Holm over each task's primary rows, Benjamini–Hochberg q over its "
            "exploratory rows): " + (". ".join(parts) if parts else "no row differs from its baseline") + ".")


def protocol_rows(result: TableResult, labels, digits: int, pretrain: bool) -> tuple[list[str], list]:
    """One Markdown row per arm of every family, and the (name, arm) list the verdict line reads."""
    lines, found = [], []
    for f in result.families:
        for a in (f.baseline, *f.arms):
            is_base, t = a is f.baseline, a.test
            delta = "(baseline)" if is_base else (fmt_ci(t.diff, t.low, t.high, digits) if t else "–")
            p = "–" if t is None or t.p is None else f"{fmt_p(t.p)} / {fmt_p(t.p_adj)} / {fmt_p(t.p_perm)}"
            mdes = "–" if t is None or t.mde is None else f"{fmt_num(t.mde)} / {fmt_num(t.mde_corrected)}"
            word = test_word(t) if t else ("not tested (one pretraining run: n = 1 unit)" if pretrain and not is_base
                                           else "–")
            steps = "–" if not a.steps else (f"> {a.steps_last}" if a.steps_median is None else f"{a.steps_median:g}")
            lines.append(f"| {a.row} | {labels(a)} | {fmt_values(a.at1, digits)} | {delta} | {p} | {word} | "
                         f"{length_text(a, is_base, digits)} | {lr_text(a.pick)} | {mdes} | {steps} |")
            if t is not None:
                found.append((f"{a.row} {labels(a)}", a))
    return lines, found


FOOTER = ("Protocol: each row's peak lr is picked by the mean validation score of the selection seeds (never reported, "
          "never a test score; each seed's grid scores are in the CSV) over a log2 grid of multiples of the row's "
          "optim.lr, grown one step while the pick sits at an edge, up to the declared bound ('bound': the pick sits "
          "there, so the row's best lr may lie beyond it); a grid on which every lr scores the same grows one step "
          "each way, up to the bound, and if it stays so the pick is the lr nearest ×1, marked 'flat'; a tie on the "
          "mean score goes to the lr nearest ×1, then to the lower lr, and the pick names it ('tied with'); the "
          "baseline follows the same rule. Then every reported seed runs at the pick. Tests per row against its task's "
          "baseline: Welch's p, adjusted by Holm over the task's primary rows (declared in the experiment file before "
          "running) or as a Benjamini–Hochberg q over its exploratory rows, and an exact permutation p; the verdict is "
          "'better' or 'worse' only when the adjusted p < 0.05, else 'no difference detected' with the MDE at the "
          f"corrected α. {MDE_FORMULA}, s the baseline's std over its seeds (at 2× steps, 5 seeds a side: the pooled "
          "std of both arms), n seeds per arm. Reach: the MDE as a relative fall in error (100 − accuracy; for a loss, "
          "in the loss above 0) at our baseline, beside each paper's claimed relative fall against its own baseline; "
          "a paper-sized effect here is the claim's relative fall at our baseline, and its seeds per arm the smallest "
          "n with (t_{1−α/2,2n−2} + t_{0.8,2n−2}) · σ · √(2/n) ≤ effect, at the baseline's σ and the family's "
          "corrected α. Convergence: the baseline's paired gain at 2× its steps, an equivalence test against the "
          "smallest paper-sized effect here (a family without a paper's number: the table's smallest claim at its "
          "baseline) (converged when the one-sided 95 % upper bound is under it), with its power; a verdict is 'at "
          "convergence' only when the baseline converged and the row's Δ moved from 1× to 2× by less than its MDE, "
          "else 'at a budget'. Noise floor: the baseline against itself on two halves of its reported seeds (no new "
          "runs), through the same test and correction: the split is one more arm of the family, Holm over it and "
          "the primary arms with their own p. 'weak pick': the pick leads its better neighbour by less "
          "than the standard error of the difference of the two selection means (σ pooled over the grid's selection "
          "seeds and the reported runs at the pick); 'bound binding': the pick sits at the bound and still beats its "
          "inner neighbour. Steps to target: the first evaluated step at which a run's validation metric reaches the "
          "baseline's mean validation metric at half its training, median over seeds ('> N': the median run never "
          "reached it by its last evaluation N).")


__all__ = ["FOOTER", "family_notes", "grid_text", "length_text", "lr_text", "pick_marks", "plateau_text",
           "protocol_rows", "target_text", "tie_text", "verdict_line", "verdict_text"]
