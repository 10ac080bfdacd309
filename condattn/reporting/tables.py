"""Collect the summaries of one table's runs and write `results/<scale>/<table>.{md,csv,png}`."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..conditioning.spec import METHODS, method_spec
from ..experiment import Experiment
from ..runs import RunRecord
from ..table.observed import TableCell, collect, longer, longer_cell, missing_runs  # noqa: F401 (renderers' cells)
from ..table.provenance import Data, Provenance, Spent, Walls
from ..table.report import out_dir as table_dir
from ..table.result import Arm, Family, TableResult, plain, table_result
from .floors import floor_table
from .floors import load as load_floors
from .fmt import fmt_values, test_word
from .notes import patch_notes, table_notes, tokenizer_notes
from .protocol import FOOTER, family_notes, grid_text, lr_text, protocol_rows, verdict_line

if TYPE_CHECKING:
    from ..table.planned import Plan

METHOD_LABELS = {m: method_spec(m).table_label for m in METHODS}  # each method's `short` (conditioning/spec.py)


def paper_methods() -> list[str]:
    """The two papers' methods (registered with a claim and its keys, not a rival), by their paper's key."""
    return sorted((m for m in METHODS if method_spec(m).paper_key and not method_spec(m).rival),
                  key=lambda m: method_spec(m).paper_key)


def method_label(plan: Plan, method: str, plain: bool = False) -> str:
    """The method's label, with the science overrides that made its runs ("SCA [conditioning.lam=5]")."""
    label = METHOD_LABELS.get(method, method)
    made = plan.made_with
    return label if plain or made is None or method not in made.methods else f"{label} [{' '.join(made.overrides)}]"


def paper_columns(exp: Experiment) -> dict[str, str]:
    """The papers' columns of a table: the SCA and CET papers', then any `paper_columns:` (key: label) it adds."""
    cols = {}
    for m in paper_methods():
        spec = method_spec(m)
        cols[spec.paper_baseline_key] = f"paper {spec.claim}: baseline"
        cols[spec.paper_key] = f"paper {spec.claim}: {spec.table_label}"
    return {**cols, **exp.paper_columns}


def _paper(exp: Experiment, row: str, key: str) -> str:
    v = exp.paper.get(exp.paper_row(row), {}).get(key)
    return "–" if v is None else f"{v:.{exp.paper_digits}f}"


DATA = {
    Data.NONE: "no finished runs yet",
    Data.STAND_IN: "offline stand-in data (not comparable with the papers)",
    Data.REDUCED: ("real data at reduced size (medium scale: it tests the sign of an effect, not the papers' absolute "
                   "values; the papers' numbers are shown for orientation)"),
    Data.PAPERS: "the papers' datasets",
}


def provenance_line(p: Provenance) -> str:
    """The "Ours: scale=…; written …" line under a table, formatted from its provenance (table/provenance.py)."""
    commits = [c for c, _ in p.commits] or ["none"]
    threads = ["unknown" if t is None else str(t) for t in p.threads] or ["none"]
    shared = "".join(f", {n} of them made for {t} (the same science config, reused: engine/twins.py)"
                     for t, n in p.reused)
    when = datetime.fromisoformat(p.written_at).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Ours: scale={p.scale}, {DATA[p.data]}, seeds {list(p.seeds)}, commit {', '.join(commits)}{commit_notes(p)}, "
        f"hardware {', '.join(p.hardware or ['none'])}, "
        f"torch threads {', '.join(threads)}, {p.runs} finished runs{shared}{device_hours(p)}"
        f"{validation(p)}; "
        f"written {when}."
    )


def commit_notes(p: Provenance) -> str:
    """What the commits of a table's runs do not say alone: runs started from code that is not on main (uncommitted
    changes, a branch), and runs whose recorded commit never landed but whose code is a landed commit's."""
    notes = [f"{n} runs from {state}" for state, n in p.commit_states]
    notes += [f"{n} runs recorded as {rec}, a commit that never landed, whose code fingerprint is {real}'s"
              for rec, real, n in p.aliased]
    if p.other_code_runs:  # engine/provenance.other_code: the rule STALE=1 applies
        notes.append(f"{p.other_code_runs} of the {p.code_checked} runs trained for it made by code other than the "
                     "code it was rendered with, which STALE=1 retrains")
    return f" ({'; '.join(notes)})" if notes else ""


def validation(p: Provenance) -> str:
    """'; validation of text: held-out 0.1 of train (seed 0)' for rows whose release has no validation split (the
    reader records how it made one, `data.val_source`); '' when every row validated on its release's own split."""
    return "".join(f"; validation of {', '.join(rows)}: {how} (data.val_source)" for how, rows in p.validation)


def device_hours(p: Provenance) -> str:
    """", N GPU-hours used" over the finished runs (wall time × processes of the runs on CUDA devices), "" if none."""
    return f", {p.gpu_hours:.1f} GPU-hours used ({p.gpu_runs} runs on GPUs)" if p.gpu_runs else ""


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


def training_time_line(walls: Walls, median: str | None = None) -> str:
    """The cost line of a table: the measured wall time of the runs shown (`median` replaces the overall median per
    run, e.g. one per row)."""
    median = median or f"median per run {walls.median_s:.0f} s"
    return (f"Training time of the runs shown: {walls.runs} runs, {walls.sum_s / 3600:.2f} h of run wall time summed "
            f"({median}), {walls.sum_s / 2 / 3600:.2f} h on two processes of one thread.")


def trained_so_far(spent: Spent | None, pretrain: bool = False) -> str:
    """" Trained so far for this table: …" — what every run the table's plan trained cost (`Provenance.spent`), or ""
    without them; runs another table made (reused, engine/twins.py) are counted apart."""
    if spent is None:
        return ""
    kinds = f"{'pretraining, ' if pretrain else ''}selection, reported and length runs"
    more = (f"; {sum(n for _, n in spent.reused)} more reused from {', '.join(t for t, _ in spent.reused)}"
            if spent.reused else "")
    return (f" Trained so far for this table: {spent.runs} runs ({kinds}), {spent.wall_s / 3600:.2f} h of run wall "
            f"time summed, {spent.wall_s / 2 / 3600:.1f} h on two processes{more}.")


def arm_fields(result: TableResult, f: Family, a: Arm) -> dict:
    """The typed fields of one arm for the CSV/JSON rows (numbers as numbers, lists as lists): its values and test at 1×
    and 2×, the lr pick and its marks, the paper's numbers beside it (its own paper's baseline), its verdict's basis
    and its family's convergence. Read off the result: nothing is computed here."""
    t, t2, pick, v2 = a.test, a.test2, a.pick, a.at2
    claim = a.claim
    return {
        "table": result.table, "scale": result.scale, "row": a.row, "method": a.method, "label": a.label,
        "hypothesis": a.hypothesis, "metric": a.metric or result.metric, "n": a.at1.n, "mean": a.at1.mean,
        "std": a.at1.std,
        "values": list(a.at1.values), "seeds": list(a.at1.seeds), "missing_seeds": list(a.at1.missing),
        "paper_claim": claim.who if claim else "", "paper_value": claim.value if claim else None,
        "paper_baseline": claim.baseline if claim else None, "rival": a.rival,
        "diff_vs_baseline": t.diff if t else None, "diff_ci95_low": t.low if t else None,
        "diff_ci95_high": t.high if t else None, "ci_method": t.ci_method if t else "",
        "p_welch": t.p if t else None, "p_adjusted": t.p_adj if t else None, "correction": t.correction if t else "",
        "p_permutation": t.p_perm if t else None, "verdict": test_word(t) if t else "",
        "outcome": t.outcome.value if t else "", "mde": t.mde_printed if t else None,
        "mde_05": t.mde if t else None, "mde_corrected": t.mde_corrected if t else None,
        "alpha_corrected": t.alpha_corrected if t else None,
        "lr": lr_text(pick), "lr_grid_scores": grid_text(pick),
        "lr_multiplier": pick.multiplier if pick else None, "lr_value": pick.lr if pick else None,
        "lr_at_bound": bool(pick and pick.at_bound), "lr_flat": bool(pick and pick.flat),
        "lr_bound_binding": bool(pick and pick.mark.value == "bound binding"),
        "lr_weak_pick": bool(pick and pick.mark.value == "weak pick"),
        "lr_pick_lead": pick.lead if pick else None, "lr_pick_se": pick.se if pick else None,
        "lr_selection_seeds": pick.selection_seeds if pick else 0,
        "lr_tied": list(pick.tied) if pick else [], "lr_tie_break": pick.tie_break if pick else "",
        "n_2x": v2.n if v2 else None, "values_2x": list(v2.values) if v2 else [],
        "diff_2x": t2.diff if t2 else None, "diff_2x_ci95_low": t2.low if t2 else None,
        "diff_2x_ci95_high": t2.high if t2 else None, "p_adjusted_2x": t2.p_adj if t2 else None,
        "verdict_2x": test_word(t2) if t2 else "", "outcome_2x": t2.outcome.value if t2 else "",
        "mde_2x": t2.mde_printed if t2 else None,
        "delta_1x": a.trend.at1 if a.trend else None, "delta_2x": a.trend.at2 if a.trend else None,
        "basis": a.basis.value if a is not f.baseline else "",
        "steps_to_target_median": a.steps_median,
        "plateau": f.plateau is not None, "converged_2x": f.converged,
        "convergence": f.state.value if f.state else "",
        "commit": " ".join(a.commits), "n_commits": len(set(a.commits) - {""}),
    }


def render(plan: Plan, result: TableResult, cells: dict[tuple, TableCell]) -> tuple[str, list[dict]]:
    """Markdown text and CSV rows of the plan's table from its result."""
    exp, scale = plan.exp, plan.scale
    methods = exp.methods
    head = ["row", *paper_columns(exp).values()]
    head += [f"ours: {method_label(plan, m)}" for m in methods] + ["steps", "wall time / run"]
    lines = table_start(exp, f"Papers' numbers ({exp.paper_provenance or 'see experiments yaml'}) beside ours "
                             f"(mean ± std over seeds of {exp.row_metric(scale)}{_times(exp)})."
                             f"{_direction(exp)}", head)
    walls = dict(result.provenance.walls_by)  # by family: one per row here
    for row in exp.rows_at(scale):
        ours = [cells[(row, m)] for m in methods]
        steps = sorted({s for c in ours for s in c.steps})
        cols = [row, *(_paper(exp, row, key) for key in paper_columns(exp))]
        cols += [fmt_values(result.arm(row, m).at1) if result.arm(row, m) else "missing" for m in methods]
        cols += [",".join(map(str, steps)) or "–", f"{walls[row].mean_s:.0f} s" if row in walls else "–"]
        lines.append("| " + " | ".join(cols) + " |")
    csv_rows = [{**arm_fields(result, f, a), "steps": [int(x) for x in cells[(a.row, a.method)].steps],
                 "wall_time_s": list(cells[(a.row, a.method)].wall)}
                for f in result.families for a in (f.baseline, *f.arms)]
    lines += protocol_lines(plan, result, 2 if exp.multiplier == 100 else 3)
    sums = [s for c in cells.values() for s in c.summaries]
    lines += tokenizer_notes(sums) + patch_notes(sums) + ["", provenance_line(result.provenance)]
    return "\n".join(lines) + "\n", csv_rows


def protocol_lines(plan: Plan, result: TableResult, digits: int = 2) -> list[str]:
    """The fair protocol's block under a table whose scale has an lr grid (tables 1, 3, 4, 5 at small), formatted
    from its result (reporting/protocol.py); [] without an lr grid."""
    exp, scale = plan.exp, plan.scale
    if not exp.at(scale).lr_grid:
        return []
    head = ["row", "method", f"{exp.row_metric(scale)} (mean ± std)", "Δ vs baseline [95% CI]",
            "p: Welch / Holm / permutation", "verdict", "Δ at 2× steps", "lr (pick)", "MDE: α 0.05 / corrected",
            "steps to baseline's half-training val"]
    lines = ["", f"**The protocol** (each method picks its lr; {'higher' if exp.higher_is_better_for() else 'lower'} "
                 "is better; every method is a primary hypothesis, one family per row)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows, found = protocol_rows(result, lambda a: METHOD_LABELS.get(a.method, a.method), digits, bool(exp.pretrain))
    unit = "points" if exp.multiplier == 100 else ""
    notes = [n for f in result.families for n in family_notes(f, scale, unit, digits)]
    if exp.pretrain:
        notes.append("The lr grid covers fine-tuning only; each method has one pretraining run, shared by all its "
                     "fine-tuning seeds, so a method is one unit of evidence here and its difference to the baseline "
                     "is not tested (the interval over fine-tuning seeds would understate the method's variance). A "
                     "test needs one pretraining run per reported seed.")
    prov = result.provenance
    cost = ["", training_time_line(prov.walls) + trained_so_far(prov.spent, bool(exp.pretrain))] \
        if prov.walls.runs else []
    return [*lines, *rows, "", *[x for n in notes for x in (n, "")], verdict_line(found), "", FOOTER, *cost]


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
                 fieldnames: list[str] | None = None, floors: bool = True,
                 result: TableResult | None = None, provenance: Provenance | None = None) -> tuple[Path, str]:
    """Write results/<scale>/<table>.{md,csv,png}: `plot(png_path)` draws the figure (None: nothing to draw), which
    the Markdown then embeds under `caption`. Returns (md path, md text). Every table renderer ends here. `floors`:
    print the cached floors of a smoke/small table (reporting/floors.py) under it (False: the renderer has). The JSON
    holds the rows and (`result`) the table's TableResult, numbers as numbers, or (`provenance`, a table without one)
    its provenance, and `missing_runs`: the planned runs without a finished summary, which decides whether a rerender
    may replace a committed table (table/report.py)."""
    exp, scale = plan.exp, plan.scale
    out_dir = table_dir(plan)  # results/<scale>/, or results/exploratory/<scale>/ for a table made with overrides
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
    w.writerows([{k: _csv(v) for k, v in r.items()} for r in csv_rows])
    missing = result.missing_runs if result is not None else missing_runs(collect(plan))
    doc = json.dumps(plain({"table": exp.table, "scale": scale, "stem": stem,
                            "made_with": asdict(made) if made else None, "missing_runs": missing,
                            "columns": w.fieldnames, "rows": csv_rows,
                            "result": result.as_json() if result is not None else None,
                            **({"provenance": asdict(provenance)} if provenance is not None and result is None
                               else {})}), indent=1, default=str)
    texts = {out_dir / f"{stem}.csv": buf.getvalue(), out_dir / f"{stem}.json": doc + "\n"}
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


def _csv(v) -> object:
    """A CSV cell: booleans as true/false, lists space-separated, None empty."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    return "" if v is None else v


WRITTEN = re.compile(r"written \d{4}-\d\d-\d\d \d\d:\d\d UTC")
WRITTEN_AT = re.compile(r'"written_at": "[^"]*"')  # the provenance's write time in the JSON


def unchanged(md_path: Path, md: str, texts: dict[Path, str]) -> bool:
    """Whether a table's files already hold these values: equal but for their write time."""
    def same(path: Path, text: str, strip=lambda t: WRITTEN_AT.sub("written_at", t)) -> bool:
        return path.is_file() and strip(path.read_bytes().decode(errors="replace")) == strip(text)

    return same(md_path, md, lambda t: WRITTEN.sub("written", t)) and all(same(p, t) for p, t in texts.items())


def write_table(plan: Plan) -> tuple[Path, str]:
    """The generic renderer: every renderer's entry takes the plan and returns (md path, md text)."""
    result, cells, _ = table_result(plan, load_floors(plan.results_root, plan.scale, plan.exp.table))
    md, csv_rows = render(plan, result, cells)
    return save_outputs(plan, md, csv_rows, lambda png: plot_curves(plan.exp, plan.scale, cells, png),
                        "validation curves", result=result)


def renderer_for(exp: Experiment):
    """The experiment's `renderer: module:function` (a `write_table(plan)`), or the generic write_table."""
    if not exp.renderer:
        return write_table
    import importlib

    module, _, fn = exp.renderer.partition(":")
    return getattr(importlib.import_module(module), fn or "write_table")


