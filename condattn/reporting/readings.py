"""Table 9: readings of SCA and CET, each task's rows beside its baseline, with step-0 saturation diagnostics.

Rows are the experiment's rows (experiments/table9_readings.yaml), each one reading (a method with its options) on
one task (`task`), named in words by `reading`. Per row: the final metric, mean ± std over seeds (the row's own
`metric:`, else the experiment's); its difference to the same task's baseline row (`baseline_reading`) with a 95%
Welch interval; and, from each run's summary.json["diagnostics"]["step0"], the attention entropy as a share of
uniform attention, the max attention probability, the share of queries whose attention argmax is themselves
(means over layers) and ‖∇W_Q‖ (mean over layers). The CSV adds the class token's self-attention, the spread of the
final pooled feature across the batch and the embedding's gradient norm. The closing line names the readings whose
interval lies above zero.

    python -m condattn.reproduce experiments/table9_readings.yaml --scale smoke --report-only
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ..experiment import Experiment
from . import protocol
from .floors import SCALES as FLOOR_SCALES
from .floors import load as load_floors
from .protocol import family_facts, typed_fields
from .reach import readings_evidence
from .stats import Verdict, fmt_num, fmt_p
from .tables import (
    METHOD_LABELS,
    TableCell,
    collect,
    longer_cell,
    provenance_line,
    save_outputs,
    table_start,
    trained,
    trained_so_far,
)

if TYPE_CHECKING:
    from ..table.planned import Plan

# (column header, step-0 key or a function of the step-0 dict) in table order
STEP0 = {
    "entropy / uniform": lambda d: _ratio(d.get("entropy/mean"), d.get("entropy_uniform/mean")),
    "max attention": lambda d: d.get("maxprob/mean"),
    "self-argmax share": lambda d: d.get("self_argmax/mean"),
    "‖∇W_Q‖": lambda d: d.get("gradnorm_wq/mean"),
}
EXTRA = {  # CSV only
    "cls_self": lambda d: d.get("cls_self/mean"),
    "feature_spread": lambda d: d.get("feature_spread"),
    "gradnorm_embed": lambda d: d.get("gradnorm_embed"),
    "gradnorm_wk": lambda d: d.get("gradnorm_wk/mean"),
    "entropy_l0_share": lambda d: _ratio(d.get("entropy/l0"), d.get("entropy_uniform/l0")),
}



def _ratio(a, b):
    return None if a is None or not b else a / b


def _mean(values: list) -> tuple[float, float] | None:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _fmt(st: tuple[float, float] | None, sci: bool = False) -> str:
    if st is None:
        return "–"
    return f"{st[0]:.2e}" if sci else f"{st[0]:.3f}"


def row_cells(plan: Plan) -> dict[str, TableCell]:
    """One TableCell per row (its method, its metric)."""
    return {row: cell for (row, _), cell in collect(plan).items()}


def longer_cells(plan: Plan) -> dict[str, TableCell]:
    """The runs at factor × steps (reproduce's length check) of each row that has them, {row: TableCell}."""
    out = {}
    for row in plan.exp.rows_at(plan.scale):
        (method,) = plan.exp.methods_of(row)
        if (cell := longer_cell(plan, row, method, list(plan.seeds))) is not None:
            out[row] = cell
    return out


def table_rows(plan: Plan) -> tuple[list[dict], dict]:
    exp, scale = plan.exp, plan.scale
    cells = row_cells(plan)
    long = longer_cells(plan)
    fams = exp.families(scale)
    base = {exp.rows[fam[0][0]].task: fam[0][0] for fam in fams.values()}
    key, higher = exp.curve.get("key", "acc"), exp.higher_is_better_for()
    targets = {task: protocol.baseline_target(cells[b].summaries, key, exp.multiplier, higher)
               for task, b in base.items()}
    tests: dict[str, Verdict] = {}
    long_tests: dict[str, Verdict] = {}
    for fam in fams.values():
        b = fam[0][0]
        arms = [(r, cells[r].values, exp.hypothesis(r)) for r, _ in fam[1:]]
        tests.update(protocol.verdicts(cells[b].values, arms, higher))
        if b in long:  # the family as declared: a row without runs at 2× counts as p = 1
            arms = [(r, long[r].values if r in long else [], exp.hypothesis(r)) for r, _ in fam[1:]]
            long_tests.update(protocol.verdicts(long[b].values, arms, higher, pooled=True))
    out = []
    for row, c in cells.items():
        spec = exp.rows[row]
        d0 = [s.get("diagnostics", {}).get("step0", {}) for s in c.summaries]
        b = base.get(spec.task)
        target = targets.get(spec.task)
        made = plan.made_with
        out.append({
            "lr": protocol.lr_text(plan, row), "lr_grid": protocol.grid_text(plan, row),
            "test": tests.get(row), "long": long_tests.get(row), "long_cell": long.get(row),
            "hypothesis": "baseline" if row == b else exp.hypothesis(row),
            "steps": protocol.steps_column(c.summaries, target.value if target else None, key, exp.multiplier,
                                           higher),
            "target": target,
            "row": row, "task": spec.task, "method": c.method,
            "reading": (spec.reading or row) + (f" [{' '.join(made.overrides)}]" if made and c.method in made.methods
                                                else ""),
            "metric": exp.row_metric(scale, row), "cell": c, "ci": tests[row].ci if row in tests else None,
            "is_baseline": row == b,
            "step0": {k: _mean([f(d) for d in d0]) for k, f in STEP0.items()},
            "extra": {k: _mean([f(d) for d in d0]) for k, f in EXTRA.items()},
        })
    return out, cells


HEAD = ["reading", "hypothesis", "final accuracy (%)", "Δ vs baseline [95% CI]", "p: Welch / adjusted / permutation",
        "verdict", "Δ at 2× steps", "lr (pick)", "MDE: α 0.05 / corrected", "steps to baseline's half-training val"]


def _p_text(t: Verdict | None) -> str:
    if t is None or t.p is None:
        return "–"
    adj = f"{fmt_p(t.p_adj)}{' (q)' if t.correction == 'bh' else ''}"
    return f"{fmt_p(t.p)} / {adj} / {fmt_p(t.p_perm)}"


def _long_text(r: dict) -> str:
    return protocol.length_text(r["is_baseline"], r["long_cell"], r["long"], r["test"])


def convergence_line(exp: Experiment, rows: list[dict], task: str, facts: dict | None = None) -> str:
    """The task's reach line (its MDE beside the papers' claims) and its convergence line (the baseline's gain at 2×
    steps, same seeds, against the effect the table tests), one paragraph apart (`facts`: gets `converged_2x`)."""
    return "\n\n".join(readings_evidence(exp, rows, task, METHOD_LABELS, facts))


def _csv_row(plan: Plan, r: dict) -> dict:
    exp, scale = plan.exp, plan.scale
    c, t, lt, lc = r["cell"], r["test"], r["long"], r["long_cell"]
    pick = plan.lr_pick(r["row"]) or {}
    ci = r["ci"]
    mean = statistics.fmean(c.values) if c.values else None
    row = {"table": exp.table, "scale": scale, "row": r["row"], "task": r["task"], "reading": r["reading"],
           "hypothesis": r["hypothesis"], "method": r["method"], "metric": r["metric"], "n": len(c.values),
           "seeds": " ".join(str(sd) for sd in c.seeds if sd not in c.missing),
           "values": " ".join(f"{v:.4f}" for v in c.values),
           "mean": f"{mean:.4f}" if mean is not None else "",
           "std": f"{statistics.stdev(c.values):.4f}" if len(c.values) > 1 else "",
           "missing_seeds": " ".join(map(str, c.missing)),
           "diff_vs_baseline": f"{ci.diff:.4f}" if ci else "",
           "diff_ci95_low": f"{ci.low:.4f}" if ci else "", "diff_ci95_high": f"{ci.high:.4f}" if ci else "",
           "p_welch": f"{t.p:.6g}" if t and t.p is not None else "",
           "p_adjusted": f"{t.p_adj:.6g}" if t and t.p_adj is not None else "",
           "correction": t.correction if t else "",
           "p_permutation": f"{t.p_perm:.6g}" if t and t.p_perm is not None else "",
           "verdict": t.word if t else "",
           "mde_05": f"{t.mde:.4f}" if t and t.mde is not None else "",
           "mde_corrected": f"{t.mde_corrected:.4f}" if t and t.mde_corrected is not None else "",
           "n_2x": len(lc.values) if lc else "", "values_2x": " ".join(f"{v:.4f}" for v in lc.values) if lc else "",
           "diff_2x": f"{lt.ci.diff:.4f}" if lt and lt.ci else "",
           "diff_2x_ci95_low": f"{lt.ci.low:.4f}" if lt and lt.ci else "",
           "diff_2x_ci95_high": f"{lt.ci.high:.4f}" if lt and lt.ci else "",
           "p_adjusted_2x": f"{lt.p_adj:.6g}" if lt and lt.p_adj is not None else "",
           "verdict_2x": lt.word if lt else "",
           "lr": r["lr"], "lr_grid_scores": r["lr_grid"],
           "lr_at_bound": str(bool(pick.get("at_bound"))).lower(),
           "select_metric": pick.get("key", ""),
           "steps_to_target_median": r["steps"][0],
           "steps_to_target": " ".join("never" if x is None else str(x) for x in r["steps"][1]),
           "target": f"{r['target'].value:.4f}" if r["target"] and r["target"].value is not None else "",
           **_convergence_csv(r),
           "wall_time_s": " ".join(f"{w:.1f}" for w in c.wall),
           "commit": " ".join(sorted({s.get("commit", "") for s in c.summaries})),
           "code": " ".join(sorted({code_text(s) for s in c.summaries})),
           **typed_fields(plan, r["row"], t, lt, c.summaries)}  # lr_at_bound keeps its place, typed
    for k, st in {**r["step0"], **r["extra"]}.items():
        row[f"step0_{k}"] = f"{st[0]:.6g}" if st else ""
    return row


def render(plan: Plan, rows: list[dict], cells: dict,
           floors: dict | None = None, done: list[dict] | None = None) -> tuple[str, list[dict]]:
    """`floors`: {task: cached floors entry} (reporting/floors.py), printed as rows under each task's readings;
    `done`: the summaries of every run the table trained (the cost line)."""
    exp, scale = plan.exp, plan.scale
    head = [*HEAD, *(f"step 0: {h}" for h in STEP0)]
    intro = ("Each row is one reading of a method (experiments/table9_readings.yaml names its options and declares it "
             "primary or exploratory before running). Final accuracy: mean ± std over the reported seeds of each "
             "task's summary key, named under its heading (final_*: at the end of training; test_acc: test accuracy "
             "at the best validation checkpoint, as LRA). Δ: difference of the means to the same task's baseline with "
             "a 95% Welch interval. p: Welch's two-sided p, then adjusted (Holm over the task's primary rows; "
             "for an exploratory row a Benjamini–Hochberg q over the task's exploratory rows), then an exact "
             "permutation p. The verdict follows the adjusted p alone. Δ at 2× steps: the same comparison at twice the "
             "training length (the baseline and the primary rows with a verdict). Step-0 columns, measured at "
             "initialisation on the fixed diagnostics batch and after the first backward, are means over layers: "
             "entropy as a share of uniform attention (1 = uniform, 0 = one-hot), max attention probability, the "
             "share of (query, head) pairs whose attention argmax is the query itself, and ‖∇W_Q‖_F.")
    lines = table_start(exp, intro, head)[:2] + [intro]
    csv_rows, facts = [], {}
    for task in dict.fromkeys(r["task"] for r in rows):
        metric = next(x["metric"] for x in rows if x["task"] == task)
        lines += ["", f"**{task}** (`{metric}`)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (x for x in rows if x["task"] == task):
            t = r["test"]
            delta = "(baseline)" if r["is_baseline"] else (r["ci"].text() if r["ci"] else "–")
            mdes = f"{fmt_num(t.mde)} / {fmt_num(t.mde_corrected)}" if t and t.mde is not None else "–"
            cols = [r["reading"], r["hypothesis"], r["cell"].text(), delta, _p_text(t),
                    "–" if r["is_baseline"] or t is None else t.word + (" (exploratory)" if t.correction == "bh"
                                                                          and t.word != "–" else ""),
                    _long_text(r), r["lr"], mdes, r["steps"][0]]
            cols += [_fmt(r["step0"][k], sci=k.startswith("‖")) for k in STEP0]
            lines.append("| " + " | ".join(cols) + " |")
            csv_rows.append(_csv_row(plan, r))
        for f in ((floors or {}).get(task) or {}).get("floors", []):  # same split, a classical model: not a method
            fit = f", fitted in {f['seconds']:.1f} s" if f.get("seconds") is not None else ""
            lines.append(f"| {f['label']} | – | {100 * f['value']:.2f} ({f['split']}{fit}) | – |"
                         + " – |" * (len(head) - 4))
        base = next((x for x in rows if x["task"] == task and x["is_baseline"]), None)
        facts[task] = {"converged_2x": None, "plateau": False}
        lines += ["", convergence_line(exp, rows, task, facts[task])]
        if base and base["target"]:
            lines += ["", base["target"].text()]
            total = max((int(s.get("steps") or 0) for s in base["cell"].summaries), default=0)
            to_final = protocol.steps_column(base["cell"].summaries, base["target"].final,
                                             exp.curve.get("key", "acc"), exp.multiplier,
                                             exp.higher_is_better_for())[1]
            facts[task]["plateau"] = protocol.plateau_step(to_final, total) is not None
            if plateau := protocol.plateau_text(to_final, total):
                lines += ["", plateau]
    found = [(f"{r['task']}: {r['reading']}" + (" (exploratory)" if r["hypothesis"] == "exploratory" else ""),
              r["test"]) for r in rows if r["test"] is not None]
    lines += ["", protocol.verdict_line(found), "", protocol.FOOTER, "", cost_line(exp, scale, rows, done), "",
              code_line(rows), "", provenance_line(exp, scale, cells)]
    return "\n".join(lines) + "\n", [{**r, **family_facts(facts, r["task"])} for r in csv_rows]


def code_text(summary: dict) -> str:
    """A run's code fingerprint as one token: 'conditioning=ab12…,model=…' ('unrecorded' before fingerprints)."""
    code = summary.get("code")
    return ",".join(f"{k}={v}" for k, v in sorted(code.items())) if code else "unrecorded"


def code_line(rows: list[dict]) -> str:
    """The commits the runs come from, and the readings whose runs ran different code (engine/provenance.py)."""
    sums = [s for r in rows for s in r["cell"].summaries]
    if not sums:
        return ""
    commits: dict[str, int] = {}
    for s in sums:
        commits[s.get("commit", "unknown")] = commits.get(s.get("commit", "unknown"), 0) + 1
    mixed = []
    for r in rows:
        codes = [s.get("code") or {} for s in r["cell"].summaries]
        parts = sorted({k for c in codes for k in c if len({(x or {}).get(k) for x in codes}) > 1})
        if any(not c for c in codes) and len({bool(c) for c in codes}) > 1:
            parts.append("unrecorded")
        if parts:
            mixed.append(f"{r['task']}: {r['reading']} ({', '.join(parts)})")
    text = (f"Code: the runs come from commits {', '.join(f'{k} ({n} runs)' for k, n in sorted(commits.items()))}; "
            "each run records a fingerprint of the code that can change its result (conditioning, model, task, "
            "engine; the CSV's `code` column). ")
    return text + (f"Readings whose runs ran different code: {'; '.join(mixed)}." if mixed else
                   "Within every reading its runs ran the same code.")


def cost_line(exp: Experiment, scale: str, rows: list[dict], done: list[dict] | None = None) -> str:
    """The measured training time of the runs shown, and of every run the table has trained so far (`done`:
    `trained()`), and, at the CPU scales, what the whole table costs at the per-task medians: every row runs its
    reported seeds plus its selection seeds at each multiplier of the starting lr grid (an extension of the grid costs
    more), and the length check its runs at factor × steps, on two processes of one thread (2 cores). A task with no
    finished run yet makes the projection unknown."""
    walls = [w for r in rows for w in r["cell"].wall]
    if not walls:
        return ""
    so_far = trained_so_far(done, exp.table)
    medians = {t: statistics.median(ws) for t in dict.fromkeys(r["task"] for r in rows)
               if (ws := [w for r in rows if r["task"] == t for w in r["cell"].wall])}
    per_task = ", ".join(f"{t} {m:.0f} s" for t, m in medians.items())
    line = (f"Training time of the runs shown: {len(walls)} runs, {sum(walls) / 3600:.2f} h of run wall time summed "
            f"(median per run: {per_task}).")
    line += so_far
    if scale not in ("smoke", "small"):
        return line
    at = exp.at(scale)
    selection = len(at.lr_grid) * len(at.selection_seeds)
    length = at.length_check
    per_row = [len(r["cell"].values) + len(r["cell"].missing) + selection for r in rows]
    longer = {r["task"]: 0 for r in rows}
    for r in rows:
        if length and (r["is_baseline"] or (r["test"] and r["test"].word in ("better", "worse")
                                            and r["hypothesis"] == "primary")):
            longer[r["task"]] += length.factor * length.seeds
    unmeasured = sorted({r["task"] for r in rows} - set(medians))
    total = (sum(medians[r["task"]] * k for r, k in zip(rows, per_row)) +
             sum(medians[t] * k for t, k in longer.items() if t in medians)) if not unmeasured else 0.0
    whole = (f"unknown until {', '.join(unmeasured)} has a finished run" if unmeasured else f"{total / 2 / 3600:.1f} h")
    return (f"{line} The whole table: {sum(per_row)} runs (reported seeds, plus {selection} selection runs per row "
            f"on the starting grid){f' and {sum(longer.values())} run-lengths of the length check' if length else ''}"
            f", at these medians on two processes of one thread: {whole}.")


def _convergence_csv(r: dict) -> dict:
    t = r["target"] if r["is_baseline"] else None
    return {"last_quarter_gain": f"{t.gain:.4f}" if t and t.gain is not None else "",
            "last_quarter_loss_fall_pct": f"{t.loss_fall:.3f}" if t and t.loss_fall is not None else "",
            "converged": "" if t is None or t.converged is None else str(t.converged).lower()}


def plot(rows: list[dict], out: Path, title: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if not any(r["cell"].values for r in rows):
        return None
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 0.45 * max(len(rows) // len(tasks), 4) + 1.5),
                             squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rs = [r for r in rows if r["task"] == task]
        ys = list(range(len(rs)))[::-1]
        for y, r in zip(ys, rs):
            v = r["cell"].values
            if v:
                m = statistics.fmean(v)
                s = statistics.stdev(v) if len(v) > 1 else 0.0
                color = "grey" if r["is_baseline"] else ("C2" if r["ci"] and r["ci"].low > 0 else "C0")
                ax.barh(y, m, xerr=s, color=color, alpha=0.8, capsize=3)
                ax.plot(v, [y] * len(v), "k.", ms=4)
            if r["is_baseline"] and v:
                ax.axvline(statistics.fmean(v), color="grey", ls=":")
        ax.set_yticks(ys)
        ax.set_yticklabels([r["reading"] for r in rs], fontsize=7)
        ax.set_xlabel("final accuracy (%)")
        ax.set_title(task, fontsize=10)
    fig.suptitle(f"{title} (ours, measured; dots = seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_table(plan: Plan) -> tuple[Path, str]:
    """The renderer of table 9 (`write_table(plan)`, as condattn.reporting.write_table): results/<scale>/<table>.*"""
    exp, scale = plan.exp, plan.scale
    rows, cells = table_rows(plan)
    floors = load_floors(plan.results_root, scale, exp.table) if scale in FLOOR_SCALES else {}
    md, csv_rows = render(plan, rows, cells, floors, trained(plan))
    return save_outputs(plan, md, csv_rows, lambda png: plot(rows, png, f"{exp.table}, scale={scale}"),
                        "final accuracy per reading, beside the baseline", floors=False)
