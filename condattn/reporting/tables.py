"""Collect the summaries of one table's runs and write `results/<scale>/<table>.{md,csv,png}`."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ..conditioning.spec import METHODS, method_spec
from ..engine.twins import made_elsewhere
from ..experiment import Experiment
from ..runs import RunId, RunRecord
from .floors import floor_table
from .floors import load as load_floors
from .notes import patch_notes, table_notes, tokenizer_notes
from .protocol import (
    FOOTER,
    Target,
    baseline_target,
    family_facts,
    grid_text,
    length_text,
    lr_text,
    plateau_step,
    plateau_text,
    steps_column,
    typed_fields,
    verdict_line,
    verdicts,
)
from .reach import table_evidence
from .stats import fmt_n, fmt_num, fmt_p, mean_std

if TYPE_CHECKING:
    from ..table.planned import Plan

METHOD_LABELS = {m: method_spec(m).table_label for m in METHODS}  # each method's `short` (conditioning/spec.py)
# method -> key of the papers' numbers (ci_*: the conditioned-initialisation paper's)
PAPER_KEYS = {"embedded": "cet", "spectral": "sca", "conditioned_init": "ci_conditioned", "mimetic_init": "ci_mimetic"}
PAPER_COLUMNS = {"cet_baseline": "paper CET: baseline", "cet": "paper CET: CET", "sca_baseline": "paper SCA: baseline",
                 "sca": "paper SCA: SCA"}


def method_label(plan: Plan, method: str, plain: bool = False) -> str:
    """The method's label, with the science overrides that made its runs ("SCA [conditioning.lam=5]")."""
    label = METHOD_LABELS.get(method, method)
    made = plan.made_with
    return label if plain or made is None or method not in made.methods else f"{label} [{' '.join(made.overrides)}]"


def paper_columns(exp: Experiment) -> dict[str, str]:
    """The papers' columns of a table: the SCA and CET papers', then any `paper_columns:` (key: label) it adds."""
    return {**PAPER_COLUMNS, **exp.paper_columns}


@dataclass
class TableCell:
    """One cell of a rendered table: a row × method, with the metric of each finished seed's run."""

    row: str
    method: str
    seeds: list[int]
    values: list[float] = field(default_factory=list)  # metric × exp.multiplier (default 100) per finished seed
    steps: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # seeds without a finished summary
    summaries: list[dict] = field(default_factory=list)

    def text(self) -> str:
        if not self.values:
            return "missing"
        return fmt_n(self.values) + (f", missing seeds {self.missing}" if self.missing else "")


def collect(plan: Plan) -> dict[tuple, TableCell]:
    """{(row, method): TableCell} of the plan's reported runs."""
    exp, scale, seeds = plan.exp, plan.scale, list(plan.seeds)
    cells = {}
    for row in exp.rows_at(scale):
        metric = exp.row_metric(scale, row)
        own = exp.row_seeds(scale, row, seeds)
        for method in exp.methods_of(row):
            cell = TableCell(row, method, own)
            for seed in own:
                s = RunRecord.of(plan.runs_root, RunId(exp.table, row, method, scale, seed), plan.variants).summary
                if s is None or metric not in s["metrics"]:
                    cell.missing.append(seed)
                    continue
                cell.values.append(exp.multiplier * float(s["metrics"][metric]))
                cell.steps.append(int(s["steps"]))
                cell.wall.append(float(s["wall_time_s"]))
                cell.summaries.append(s)
            cells[(row, method)] = cell
    return cells


def longer_cell(plan: Plan, row: str, method: str, seeds: list[int]) -> TableCell | None:
    """The runs at factor × steps (reproduce's length check) of a row × method: the seeds whose longer run is planned
    (`plan.longer`, by the name of the run at 1×); None when it has none."""
    exp, scale = plan.exp, plan.scale
    variants = plan.longer
    ids = [i for i in (RunId(exp.table, row, method, scale, sd) for sd in seeds) if i.name in variants]
    if not ids:
        return None
    metric, cell = exp.row_metric(scale, row), TableCell(row, method, [i.seed for i in ids])
    for i in ids:
        s = RunRecord.of(plan.runs_root, i, variants).summary
        if s is None or metric not in s["metrics"]:
            cell.missing.append(i.seed)
            continue
        cell.values.append(exp.multiplier * float(s["metrics"][metric]))
        cell.steps.append(int(s["steps"]))
        cell.wall.append(float(s["wall_time_s"]))
        cell.summaries.append(s)
    return cell


def longer(plan: Plan, cells: dict[tuple, TableCell]) -> dict[tuple, TableCell]:
    """{(row, method): the cell's runs at factor × steps} for the cells that have them."""
    out = {}
    for (row, method), c in cells.items():
        if (cell := longer_cell(plan, row, method, c.seeds)) is not None:
            out[(row, method)] = cell
    return out


def _paper(exp: Experiment, row: str, key: str) -> str:
    v = exp.paper.get(exp.paper_row(row), {}).get(key)
    return "–" if v is None else f"{v:.{exp.paper_digits}f}"


def provenance_line(exp: Experiment, scale: str, cells: dict[tuple, TableCell]) -> str:
    sums = [s for c in cells.values() for s in c.summaries]
    commits = sorted({s.get("commit", "unknown") for s in sums}) or ["none"]
    hardware = sorted({s.get("hardware_line", "unknown") for s in sums}) or ["none"]
    threads = sorted({str((s.get("hardware") or {}).get("torch_threads", "unknown")) for s in sums}) or ["none"]
    seeds = sorted({seed for c in cells.values() for seed in c.seeds})
    stand_in = any(s.get("data", {}).get("stand_in") for s in sums)
    if not sums:
        data = "no finished runs yet"
    elif stand_in:
        data = "offline stand-in data (not comparable with the papers)"
    elif scale == "medium":
        data = ("real data at reduced size (medium scale: it tests the sign of an effect, not the papers' absolute "
                "values; the papers' numbers are shown for orientation)")
    else:
        data = "the papers' datasets"
    shared = "".join(f", {n} of them made for {t} (the same science config, reused: engine/twins.py)"
                     for t, n in sorted(made_elsewhere(sums, exp.table).items()))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Ours: scale={scale}, {data}, seeds {seeds}, commit {', '.join(commits)}{commit_notes(sums)}, "
        f"hardware {', '.join(hardware)}, "
        f"torch threads {', '.join(threads)}, {len(sums)} finished runs{shared}{device_hours(sums)}"
        f"{validation(cells)}; "
        f"written {when}."
    )


def commit_notes(sums: list[dict]) -> str:
    """What the commits of a table's runs do not say alone: runs started from code that is not on main (uncommitted
    changes, a branch), and runs whose recorded commit never landed but whose code is a landed commit's."""
    notes = []
    states: dict[str, int] = {}
    for s in sums:
        if s.get("commit_state") not in (None, "on main"):
            states[s["commit_state"]] = states.get(s["commit_state"], 0) + 1
    notes += [f"{n} runs from {state}" for state, n in sorted(states.items())]
    aliased: dict[tuple[str, str], int] = {}
    for s in sums:
        if s.get("commit_recorded"):
            aliased[(s["commit_recorded"], s["commit"])] = aliased.get((s["commit_recorded"], s["commit"]), 0) + 1
    notes += [f"{n} runs recorded as {rec}, a commit that never landed, whose code fingerprint is {real}'s"
              for (rec, real), n in sorted(aliased.items())]
    return f" ({'; '.join(notes)})" if notes else ""


def validation(cells: dict[tuple, TableCell]) -> str:
    """'; validation of text: held-out 0.1 of train (seed 0)' for rows whose release has no validation split (the
    reader records how it made one, `data.val_source`); '' when every row validated on its release's own split."""
    by_how: dict[str, list[str]] = {}
    for key, cell in cells.items():  # (row, method) here; table 9's renderer keys its cells by row
        row = key[0] if isinstance(key, tuple) else key
        for s in cell.summaries:
            how = (s.get("data") or {}).get("validation")
            if how and row not in by_how.setdefault(how, []):
                by_how[how].append(row)
    return "".join(f"; validation of {', '.join(rows)}: {how} (data.val_source)"
                   for how, rows in sorted(by_how.items()))


def device_hours(summaries: list[dict]) -> str:
    """", N GPU-hours used" over the finished runs (wall time × processes of the runs on CUDA devices), "" if none."""
    hours = sum(float(s.get("wall_time_s") or 0) * int((s.get("hardware") or {}).get("num_processes") or 1)
                for s in summaries if (s.get("hardware") or {}).get("device_type") == "cuda") / 3600
    gpu_runs = [s for s in summaries if (s.get("hardware") or {}).get("device_type") == "cuda"]
    return f", {hours:.1f} GPU-hours used ({len(gpu_runs)} runs on GPUs)" if gpu_runs else ""


def _times(exp: Experiment) -> str:
    m = exp.multiplier
    return "" if m == 1 else f" × {m:g}"


def _direction(exp: Experiment) -> str:
    """A note when lower is better (`higher_is_better: false`, e.g. a loss); nothing for the usual accuracies."""
    return "" if exp.higher_is_better_for() else " Lower is better."


def table_start(exp: Experiment, intro: str, head: list[str]) -> list[str]:
    """The Markdown lines every table renderer starts with: title, what the numbers are, the column header."""
    return [f"# {exp.table}: {exp.title}", "", intro, "", "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head)]


def training_time_line(walls: list[float], median: str | None = None) -> str:
    """The cost line of a table: the measured wall time of the runs shown (`median` replaces the overall median per
    run, e.g. one per row)."""
    median = median or f"median per run {statistics.median(walls):.0f} s"
    return (f"Training time of the runs shown: {len(walls)} runs, {sum(walls) / 3600:.2f} h of run wall time summed "
            f"({median}), {sum(walls) / 2 / 3600:.2f} h on two processes of one thread.")


def trained(plan: Plan) -> list[dict]:
    """The summaries of every finished run the table's plan trains (`plan.planned`: selection, reported and length
    runs, grid extensions included)."""
    return [s for name in plan.planned if (s := RunRecord(plan.runs_root / plan.scale / name).summary) is not None]


def trained_so_far(done: list[dict] | None, table: str | None = None, pretrain: bool = False) -> str:
    """" Trained so far for this table: …" — what every run the table's plan trained cost (`done`: `trained()`), or ""
    without them; runs another table made (`table`: this one's name; reused, engine/twins.py) are counted apart."""
    if not done:
        return ""
    reused = made_elsewhere(done, table) if table else {}
    own = [s for s in done if not (table and made_elsewhere([s], table))]
    spent = sum(float(s.get("wall_time_s") or 0.0) for s in own)
    kinds = f"{'pretraining, ' if pretrain else ''}selection, reported and length runs"
    more = f"; {sum(reused.values())} more reused from {', '.join(sorted(reused))}" if reused else ""
    return (f" Trained so far for this table: {len(own)} runs ({kinds}), {spent / 3600:.2f} h of run wall time "
            f"summed, {spent / 2 / 3600:.1f} h on two processes{more}.")


def render(plan: Plan, cells: dict[tuple, TableCell], floors: dict | None = None,
           long: dict[tuple, TableCell] | None = None, done: list[dict] | None = None) -> tuple[str, list[dict]]:
    """Markdown text and CSV rows for the plan's table (`floors`: the cached floors, {row: entry}; `long`: the cells'
    runs at 2× steps, {(row, method): TableCell}; `done`: every run the table's plan trained, `trained()`)."""
    exp, scale = plan.exp, plan.scale
    methods = exp.methods
    head = ["row", *paper_columns(exp).values()]
    head += [f"ours: {method_label(plan, m)}" for m in methods] + ["steps", "wall time / run"]
    lines = table_start(exp, f"Papers' numbers ({exp.paper_provenance or 'see experiments yaml'}) beside ours "
                             f"(mean ± std over seeds of {exp.row_metric(scale)}{_times(exp)})."
                             f"{_direction(exp)}", head)
    csv_rows = []
    base = methods[0]  # the baseline column: CIs of every other method's difference to it
    for row in exp.rows_at(scale):
        ours = [cells[(row, m)] for m in methods]
        steps = sorted({s for c in ours for s in c.steps})
        walls = [w for c in ours for w in c.wall]
        cols = [row, *(_paper(exp, row, key) for key in paper_columns(exp))]
        cols += [c.text() for c in ours]
        cols += [",".join(map(str, steps)) or "–", f"{mean_std(walls)[0]:.0f} s" if walls else "–"]
        lines.append("| " + " | ".join(cols) + " |")
        tests = verdicts(cells[(row, base)].values, [(c.method, c.values, "primary") for c in ours[1:]],
                         exp.higher_is_better_for(row))
        long_tests = length_verdicts(exp, row, [c.method for c in ours], long or {})
        for c in ours:
            lc, lt = (long or {}).get((row, c.method)), long_tests.get(c.method)
            pk = PAPER_KEYS.get(c.method)
            ms = mean_std(c.values) if c.values else None
            t = tests.get(c.method)
            ci = t.ci if t else None
            csv_rows.append({
                "table": exp.table, "row": row, "method": c.method, "label": METHOD_LABELS.get(c.method, c.method),
                "scale": scale, "metric": exp.row_metric(scale, row), "n": len(c.values),
                "mean": f"{ms[0]:.4f}" if ms else "",
                "std": f"{ms[1]:.4f}" if len(c.values) > 1 else "",
                "values": " ".join(f"{v:.4f}" for v in c.values), "missing_seeds": " ".join(map(str, c.missing)),
                "steps": " ".join(map(str, c.steps)), "wall_time_s": " ".join(f"{w:.1f}" for w in c.wall),
                "paper_value": exp.paper.get(exp.paper_row(row), {}).get(pk, "") if pk else "",
                "paper_baseline": exp.paper.get(exp.paper_row(row), {}).get("cet_baseline", ""),
                "commit": " ".join(sorted({s.get("commit", "") for s in c.summaries})),
                "diff_vs_baseline": f"{ci.diff:.4f}" if ci else "",
                "diff_ci95_low": f"{ci.low:.4f}" if ci else "",
                "diff_ci95_high": f"{ci.high:.4f}" if ci else "",
                "ci_method": ci.method if ci else "",
                "hypothesis": "baseline" if c.method == base else "primary",
                "p_welch": f"{t.p:.6g}" if t and t.p is not None else "",
                "p_adjusted": f"{t.p_adj:.6g}" if t and t.p_adj is not None else "",
                "p_permutation": f"{t.p_perm:.6g}" if t and t.p_perm is not None else "",
                "verdict": t.word if t else "",
                "mde_05": f"{t.mde:.4f}" if t and t.mde is not None else "",
                "mde_corrected": f"{t.mde_corrected:.4f}" if t and t.mde_corrected is not None else "",
                "lr": lr_text(plan, exp.pick_key(row, c.method)),
                "lr_grid_scores": grid_text(plan, exp.pick_key(row, c.method)),
                "n_2x": len(lc.values) if lc else "",
                "values_2x": " ".join(f"{v:.4f}" for v in lc.values) if lc else "",
                "diff_2x": f"{lt.ci.diff:.4f}" if lt and lt.ci else "",
                "diff_2x_ci95_low": f"{lt.ci.low:.4f}" if lt and lt.ci else "",
                "diff_2x_ci95_high": f"{lt.ci.high:.4f}" if lt and lt.ci else "",
                "p_adjusted_2x": f"{lt.p_adj:.6g}" if lt and lt.p_adj is not None else "",
                "verdict_2x": lt.word if lt else "",
                **typed_fields(plan, exp.pick_key(row, c.method), t, lt, c.summaries),
            })
    facts: dict[str, dict] = {}
    lines += protocol_lines(plan, cells, METHOD_LABELS, 2 if exp.multiplier == 100 else 3, floors, long, done,
                            facts)
    csv_rows = [{**r, **family_facts(facts, r["row"])} for r in csv_rows]
    lines += tokenizer_notes([s for c in cells.values() for s in c.summaries])
    lines += patch_notes([s for c in cells.values() for s in c.summaries])
    lines += ["", provenance_line(exp, scale, cells)]
    return "\n".join(lines) + "\n", csv_rows


def floor_verdict(row: str, base: list[float], entry: dict | None, mult: float, higher: bool, digits: int = 2) -> str:
    """"<row>: the baseline (96.02) beats every floor (the best: MLP … 94.20)", or names the best floor it is below
    and by how much; "" without floors or baseline runs."""
    floors = (entry or {}).get("floors") or []
    if not floors or not base:
        return ""
    mean = statistics.fmean(base)
    best = (max if higher else min)(floors, key=lambda f: f["value"])
    value = mult * float(best["value"])
    label = best["label"].removeprefix("floor: ")
    if (mean > value) if higher else (mean < value):
        return (f"{row}: the baseline ({mean:.{digits}f}) beats every floor (the best: {label}, {value:.{digits}f} on "
                f"{best['split']}).")
    return (f"{row}: the baseline ({mean:.{digits}f}) does NOT beat its floors: the best, {label}, reaches "
            f"{value:.{digits}f} on {best['split']}, a gap of {abs(value - mean):.{digits}f} in its favour.")


def length_verdicts(exp: Experiment, row: str, methods: list[str], long: dict[tuple, TableCell]) -> dict:
    """The row's tests at 2× steps (the methods with runs there against the baseline's), {method: Verdict}."""
    if (row, methods[0]) not in long or exp.pretrain:
        return {}
    # the family as declared: a method without runs at 2× counts as p = 1 (Holm never corrects for fewer)
    return verdicts(long[(row, methods[0])].values,
                    [(m, long[(row, m)].values if (row, m) in long else [], "primary") for m in methods[1:]],
                    exp.higher_is_better_for(row), pooled=True)


def protocol_lines(plan: Plan, cells: dict, labels: dict[str, str], digits: int = 2,
                   floors: dict | None = None, long: dict[tuple, TableCell] | None = None,
                   done: list[dict] | None = None, facts: dict | None = None) -> list[str]:
    """The fair protocol's block under a table whose scale has an lr grid (tables 1, 3, 4, 5 at small): per row, one
    line per method with its held-out metric (mean ± std), Δ to the row's baseline (the first method) with its 95%
    interval, the lr it picked, the MDE and steps-to-target; then the baseline's convergence figure (and the plateau
    line), the baseline against its floors (`floors`: {row: cached entry}), a verdict, the protocol's footer and the
    cost line (the runs shown, and `done`: every run the plan trained). `cells`: {(row, method): TableCell}; [] without
    an lr grid. `facts` (a dict) gets {row: {"plateau": bool, "converged_2x": bool | None}} (`family_facts`)."""
    exp, scale = plan.exp, plan.scale
    facts = {} if facts is None else facts
    if not exp.at(scale).lr_grid:
        return []
    key = exp.curve.get("key", "acc")
    higher = exp.higher_is_better_for()
    mult = exp.multiplier
    head = ["row", "method", f"{exp.row_metric(scale)} (mean ± std)", "Δ vs baseline [95% CI]",
            "p: Welch / Holm / permutation", "verdict", "Δ at 2× steps", "lr (pick)", "MDE: α 0.05 / corrected",
            "steps to baseline's half-training val"]
    lines = ["", f"**The protocol** (each method picks its lr; {'higher' if higher else 'lower'} is better; every "
                 "method is a primary hypothesis, one family per row)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes, found = [], []
    for row in exp.rows_at(scale):
        methods = [m for (r, m) in cells if r == row]
        if not methods:
            continue
        base = cells[(row, methods[0])]
        target = baseline_target(base.summaries, key, mult, higher)
        if not higher:  # a loss (table 5), not a percentage: "0.5 points" does not apply, the loss-fall criterion does
            target = Target(target.value, None, target.loss_fall, target.final)
        # one pretraining run per method (table 3): every fine-tuning seed shares it, so the method is one unit and
        # no test over fine-tuning seeds can speak for it; the rows are printed, untested
        tests = {} if exp.pretrain else verdicts(
            base.values, [(m, cells[(row, m)].values, "primary") for m in methods[1:]], higher)
        long_tests = length_verdicts(exp, row, methods, long or {})
        for m in methods:
            c, t = cells[(row, m)], tests.get(m)
            steps = steps_column(c.summaries, target.value, key, mult, higher)
            ms = fmt_n(c.values, digits) if c.values else "missing"
            delta = "(baseline)" if m == methods[0] else (t.ci.text(digits) if t and t.ci else "–")
            p = "–" if t is None or t.p is None else f"{fmt_p(t.p)} / {fmt_p(t.p_adj)} / {fmt_p(t.p_perm)}"
            mdes = "–" if t is None or t.mde is None else f"{fmt_num(t.mde)} / {fmt_num(t.mde_corrected)}"
            lr = lr_text(plan, exp.pick_key(row, m))
            word = t.word if t else ("not tested (one pretraining run: n = 1 unit)"
                                     if exp.pretrain and m != methods[0] else "–")
            at2 = length_text(m == methods[0], (long or {}).get((row, m)), long_tests.get(m), t, digits)
            lines.append(f"| {row} | {labels.get(m, m)} | {ms} | {delta} | {p} | {word} | {at2} | {lr} | {mdes} | "
                         f"{steps[0]} |")
            if t is not None:
                found.append((f"{row} {labels.get(m, m)}", t))
        facts[row] = {"converged_2x": None}
        notes += [f"{row}: {target.text()}",
                  *table_evidence(exp, scale, row, methods, cells, tests, long, labels, digits, facts[row])]
        entry, metric = (floors or {}).get(row), exp.row_metric(scale, row)
        if entry and entry.get("metric") != metric:  # cached for another metric (split): not this table's floors
            notes.append(f"{row}: its cached floors are for {entry.get('metric')}, not {metric}: rerun `python -m "
                         f"condattn.floors --scale {scale}`.")
        elif verdict := floor_verdict(row, base.values, entry, mult, higher, digits):
            notes.append(verdict)
        total = max((int(s.get("steps") or 0) for s in base.summaries), default=0)
        to_final = steps_column(base.summaries, target.final, key, mult, higher)[1]
        facts[row]["plateau"] = plateau_step(to_final, total) is not None
        if plateau := plateau_text(to_final, total):
            notes.append(f"{row}: {plateau}")
    if exp.pretrain:
        notes.append("The lr grid covers fine-tuning only; each method has one pretraining run, shared by all its "
                     "fine-tuning seeds, so a method is one unit of evidence here and its difference to the baseline "
                     "is not tested (the interval over fine-tuning seeds would understate the method's variance). A "
                     "test needs one pretraining run per reported seed.")
    walls = [w for c in cells.values() for w in c.wall]
    cost = ["", training_time_line(walls) + trained_so_far(done, exp.table, bool(exp.pretrain))] if walls \
        else []
    return [*lines, "", *[x for n in notes for x in (n, "")], verdict_line(found), "", FOOTER, *cost]


def plot_curves(exp: Experiment, scale: str, cells: dict[tuple, TableCell], out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split, key = exp.curve.get("split", "val"), exp.curve.get("key", "acc")
    rows = exp.rows_at(scale)
    ncols = min(3, len(rows))
    nrows = -(-len(rows) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.set_visible(False)
    drew = False
    for ax, row in zip(axes.flat, rows):
        for m in exp.methods:
            for i, s in enumerate(cells[(row, m)].summaries):
                pts = [(r["step"], exp.multiplier * r[key]) for r in RunRecord(s["run_dir"]).metrics_rows(split)
                       if key in r]
                if pts:
                    x, y = zip(*pts)
                    ax.plot(x, y, color=f"C{exp.methods.index(m)}", alpha=0.8,
                            label=METHOD_LABELS.get(m, m) if i == 0 else None)
                    drew = True
        ax.set_title(f"{row} ({scale})")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"{split} {key}" + (" (%)" if exp.multiplier == 100 else ""))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not drew:
        plt.close(fig)
        return None
    fig.suptitle(f"{exp.table}: {split} {key}, one line per seed (ours, measured)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def save_outputs(plan: Plan, md: str, csv_rows: list[dict],
                 plot: Callable[[Path], Path | None], caption: str,
                 fieldnames: list[str] | None = None, floors: bool = True) -> tuple[Path, str]:
    """Write results/<scale>/<table>.{md,csv,png}: `plot(png_path)` draws the figure (None: nothing to draw), which
    the Markdown then embeds under `caption`. Returns (md path, md text). Every table renderer ends here. `floors`:
    print the cached floors of a smoke/small table (reporting/floors.py) under it (False: the renderer has)."""
    exp, scale = plan.exp, plan.scale
    out_dir = plan.results_root / scale
    out_dir.mkdir(parents=True, exist_ok=True)
    block = floor_table(exp.table, scale, plan.results_root, exp.multiplier) if floors else ""
    if block:
        md = md.rstrip("\n") + "\n\n" + block + "\n"
    notes = table_notes(exp, scale, exp.rows_at(scale))
    if notes:
        md = md.rstrip("\n") + "\n" + "\n".join(notes) + "\n"
    if made := plan.made_with:  # reproduce with science overrides: the table says what made it
        title, _, rest = md.partition("\n")
        md = (f"{title}\n\n**Made with** `{' '.join(made.overrides)}`, which changes "
              f"{', '.join(method_label(plan, m, plain=True) for m in made.methods)}: the papers' numbers beside "
              "ours are for the papers' own configuration (SCA: λ = 10 fixed; CET after positions), not this one."
              f"\n{rest}")
        csv_rows = [{**r, "overrides": " ".join(made.overrides)} for r in csv_rows]
        fieldnames = [*fieldnames, "overrides"] if fieldnames else None
    stem = plan.output_stem  # reproduce --rows: `<table>.rows-<patterns>`, beside the full table
    md_path, png_path = out_dir / f"{stem}.md", out_dir / f"{stem}.png"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fieldnames or (list(csv_rows[0]) if csv_rows else ["table"]))
    w.writeheader()
    w.writerows([{k: str(v).lower() if isinstance(v, bool) else v for k, v in r.items()} for r in csv_rows])
    result = json.dumps({"table": exp.table, "scale": scale, "stem": stem, "made_with": asdict(made) if made else None,
                         "columns": w.fieldnames, "rows": csv_rows}, indent=1, default=str) + "\n"
    texts = {out_dir / f"{stem}.csv": buf.getvalue(), out_dir / f"{stem}.json": result}
    tmp = out_dir / f".{stem}.tmp.png"  # drawn aside: it replaces the figure only with new values
    png = plot(tmp)
    if png is not None:
        md += f"\n![{caption}]({png_path.name})\n"
    if unchanged(md_path, md, texts):  # the same values: the files (and their write time) stay as they are
        tmp.unlink(missing_ok=True)
        return md_path, md_path.read_text()
    if png is not None:
        tmp.replace(png_path)
    md_path.write_text(md)
    for path, text in texts.items():
        path.write_bytes(text.encode())  # bytes: the csv's \r\n line ends as the csv module writes them
    return md_path, md


WRITTEN = re.compile(r"written \d{4}-\d\d-\d\d \d\d:\d\d UTC")


def unchanged(md_path: Path, md: str, texts: dict[Path, str]) -> bool:
    """Whether a table's files already hold these values: the md equal but for its write time, every other text
    equal."""
    def same(path: Path, text: str, strip=lambda t: t) -> bool:
        return path.is_file() and strip(path.read_bytes().decode(errors="replace")) == strip(text)

    return same(md_path, md, lambda t: WRITTEN.sub("written", t)) and all(same(p, t) for p, t in texts.items())


def write_table(plan: Plan) -> tuple[Path, str]:
    """The generic renderer: every renderer's entry takes the plan and returns (md path, md text)."""
    cells = collect(plan)
    md, csv_rows = render(plan, cells, load_floors(plan.results_root, plan.scale, plan.exp.table), longer(plan, cells),
                          trained(plan))
    return save_outputs(plan, md, csv_rows, lambda png: plot_curves(plan.exp, plan.scale, cells, png),
                        "validation curves")


def renderer_for(exp: Experiment):
    """The experiment's `renderer: module:function` (a `write_table(plan)`), or the generic write_table."""
    if not exp.renderer:
        return write_table
    import importlib

    module, _, fn = exp.renderer.partition(":")
    return getattr(importlib.import_module(module), fn or "write_table")


