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

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ..experiment import Experiment
from ..table.provenance import CellCode, Provenance
from ..table.result import Outcome, TableResult, Test, table_result
from ..table.step0 import Step0
from .floors import SCALES as FLOOR_SCALES
from .floors import fit_time, length
from .floors import load as load_floors
from .fmt import fmt_ci, fmt_num, fmt_p, fmt_values, test_word
from .protocol import FOOTER, family_notes, length_text, lr_text, verdict_line
from .tables import arm_fields, provenance_line, save_outputs, table_start, trained_so_far

if TYPE_CHECKING:
    from ..table.planned import Plan

# (column header, step-0 quantity of table/step0.py) in table order
STEP0 = {"entropy / uniform": "entropy_share", "max attention": "maxprob", "self-argmax share": "self_argmax",
         "‖∇W_Q‖": "gradnorm_wq"}
EXTRA = ["cls_self", "feature_spread", "gradnorm_embed", "gradnorm_wk", "entropy_l0_share"]  # CSV only


def _fmt(st: Step0 | None, sci: bool = False) -> str:
    """A step-0 mean, with its n when fewer runs recorded it than the row has ("0.512 (n=3)")."""
    if st is None or st.mean is None:
        return "–"
    return (f"{st.mean:.2e}" if sci else f"{st.mean:.3f}") + (f" (n={st.n})" if st.n < st.of else "")


def table_rows(plan: Plan, floors: dict | None = None) -> tuple[list[dict], dict, TableResult]:
    """One dict per reading, in family order (its arm and family in the result, its cell, its step-0 diagnostics),
    the cells by (row, method), and the result."""
    exp = plan.exp
    result, cells, _ = table_result(plan, floors)
    made = plan.made_with
    out = []
    for f in result.families:
        for a in (f.baseline, *f.arms):
            c = cells[(a.row, a.method)]
            got = {st.key: st for st in a.step0}
            out.append({
                "arm": a, "family": f, "cell": c, "row": a.row, "task": exp.rows[a.row].task, "method": a.method,
                "reading": a.reading + (f" [{' '.join(made.overrides)}]" if made and a.method in made.methods else ""),
                "hypothesis": a.hypothesis, "is_baseline": a is f.baseline, "test": a.test,
                "metric": exp.row_metric(plan.scale, a.row),
                "step0": {k: got.get(key) for k, key in STEP0.items()}, "extra": {k: got.get(k) for k in EXTRA},
            })
    return out, cells, result


INTRO = ("Each row is one reading of a method (experiments/table9_readings.yaml names its options and declares it "
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

HEAD = ["reading", "hypothesis", "final accuracy (%)", "Δ vs baseline [95% CI]", "p: Welch / adjusted / permutation",
        "verdict", "Δ at 2× steps", "lr (pick)", "MDE: α 0.05 / corrected", "steps to baseline's half-training val"]


def _p_text(t: Test | None) -> str:
    if t is None or t.p is None:
        return "–"
    adj = f"{fmt_p(t.p_adj)}{' (q)' if t.correction == 'bh' else ''}"
    return f"{fmt_p(t.p)} / {adj} / {fmt_p(t.p_perm)}"


def _csv_row(plan: Plan, result: TableResult, r: dict) -> dict:
    a, f, c = r["arm"], r["family"], r["cell"]
    code = next((cc.codes for cc in result.provenance.code if (cc.row, cc.method) == (a.row, a.method)), ())
    row = {**arm_fields(result, f, a), "task": r["task"], "reading": r["reading"],
           "select_metric": a.pick.key if a.pick else "",
           "steps_to_target": [None if x is None else int(x) for x in a.steps],
           "target": f.target.value if r["is_baseline"] else None,
           "last_quarter_gain": f.target.gain if r["is_baseline"] else None,
           "last_quarter_loss_fall_pct": f.target.loss_fall if r["is_baseline"] else None,
           "wall_time_s": list(c.wall), "code": " ".join(code)}
    for k, st in {**r["step0"], **r["extra"]}.items():
        row[f"step0_{k}"] = st.mean if st else None
    return row


def render(plan: Plan, rows: list[dict], result: TableResult, floors: dict | None = None) -> tuple[str, list[dict]]:
    """`floors`: {task: cached floors entry} (reporting/floors.py), printed as rows under each task's readings."""
    exp, scale = plan.exp, plan.scale
    head = [*HEAD, *(f"step 0: {h}" for h in STEP0)]
    lines = table_start(exp, INTRO, head)[:2] + [INTRO]
    csv_rows = []
    for f in result.families:
        task = f.name
        fam_rows = [r for r in rows if r["family"] is f]
        lines += ["", f"**{task}** (`{fam_rows[0]['metric']}`)", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for r in fam_rows:
            a, t = r["arm"], r["test"]
            delta = "(baseline)" if r["is_baseline"] else (fmt_ci(t.diff, t.low, t.high) if t else "–")
            mdes = f"{fmt_num(t.mde)} / {fmt_num(t.mde_corrected)}" if t and t.mde is not None else "–"
            word = "–" if r["is_baseline"] or t is None else test_word(t) + (
                " (exploratory)" if t.correction == "bh" and t.outcome != Outcome.UNTESTED else "")
            steps = "–" if not a.steps else (f"> {a.steps_last}" if a.steps_median is None else f"{a.steps_median:g}")
            cols = [r["reading"], r["hypothesis"], fmt_values(a.at1), delta, _p_text(t), word,
                    length_text(a, r["is_baseline"]), lr_text(a.pick), mdes, steps]
            cols += [_fmt(r["step0"][k], sci=k.startswith("‖")) for k in STEP0]
            lines.append("| " + " | ".join(cols) + " |")
            csv_rows.append(_csv_row(plan, result, r))
        for fl in ((floors or {}).get(task) or {}).get("floors", []):  # same split, a classical model: not a method
            fit = f", fitted in {fit_time(fl)}" if fl.get("seconds") is not None else ""
            fit += "" if length(fl) == "–" else f"; {length(fl)}"
            lines.append(f"| {fl['label']} | – | {100 * fl['value']:.2f} ({fl['split']}{fit}) | – |"
                         + " – |" * (len(head) - 4))
        lines += [x for n in family_notes(f, scale, "points", 2) for x in ("", n)]
    found = [(f"{r['task']}: {r['reading']}" + (" (exploratory)" if r["hypothesis"] == "exploratory" else ""),
              r["arm"]) for r in rows if r["test"] is not None]
    prov = result.provenance
    lines += ["", verdict_line(found), "", FOOTER, "", cost_line(exp, scale, rows, prov), "",
              code_line(prov, rows), "", provenance_line(prov)]
    return "\n".join(lines) + "\n", csv_rows


def code_line(prov: Provenance, rows: list[dict]) -> str:
    """The commits the runs come from, and the readings whose runs ran different code (engine/provenance.py), from the
    table's provenance (`rows`: the readings, for their names)."""
    if not prov.runs:
        return ""
    code = {(cc.row, cc.method): cc for cc in prov.code}
    cells = [(r, cc) for r in rows if (cc := code.get((r["row"], r["method"])))]
    mixed = [f"{r['task']}: {r['reading']} ({', '.join(cc.mixed)})" for r, cc in cells if cc.mixed]
    shown = [f"{r['task']}: {r['reading']}" for r, cc in cells if len(cc.codes) > 1 and not cc.mixed]
    text = (f"Code: the runs come from commits {', '.join(f'{k} ({n} runs)' for k, n in prov.commits)}; "
            "each run records a fingerprint of the code that can change its result (conditioning, model, task, "
            "engine; the CSV's `code` column). ")
    if mixed:
        text += f"Readings whose runs ran different code: {'; '.join(mixed)}."
    else:
        text += "Within every reading its runs ran the same code" + (", or code shown to compute the same." if shown
                                                                     else ".")
    if shown:
        text += (" Readings whose runs ran code of different fingerprints shown to compute the same (a smoke cell of "
                 "the method trained at both commits, every metric bit-identical: results/code_equivalence.json): "
                 f"{'; '.join(shown)}.")
    return text + " " + current_text(prov, [(f"{r['task']}: {r['reading']}", cc) for r, cc in cells])


def current_text(prov: Provenance, cells: list[tuple[str, CellCode]]) -> str:
    """Whether the runs ran the code the table was rendered with, by the rule STALE=1 applies (the same fingerprints
    and the same code-equivalence record: engine/provenance.other_code), formatted from the provenance."""
    rule = ("by the rule `STALE=1` applies (the runs' fingerprints against this code's, fingerprints shown to compute "
            "the same counting as the same: results/code_equivalence.json)")
    if not prov.other_code_runs:
        return (f"Against the code this table was rendered with, {rule}: every one of the {prov.code_checked} runs it "
                "trained (selection, reported and length runs) is current; STALE=1 retrains none.")
    other = [f"{name} ({', '.join(cc.other)}; {cc.other_runs} runs shown)" for name, cc in cells if cc.other_runs]
    parts = sorted({p for _, cc in cells for p in cc.other})
    if other and len(other) == sum(bool(cc.codes) for _, cc in cells):  # every reading with runs: one clause
        said = (f"every reading's runs shown were ({', '.join(parts)} differ; `make code-equivalence SINCE=<their "
                "commit>` records whether this code computes the same)")
    elif other:
        said = f"readings whose runs shown were made by other code: {'; '.join(other)}"
    else:
        said = "no run shown is among them (they are selection or length runs)"
    return (f"Against the code this table was rendered with, {rule}: {prov.other_code_runs} of the "
            f"{prov.code_checked} runs it trained (selection, reported and length runs) were made by other code, "
            f"and STALE=1 retrains exactly these; {said}."
            + (" Every other run is current." if prov.other_code_runs < prov.code_checked else ""))


def cost_line(exp: Experiment, scale: str, rows: list[dict], prov: Provenance) -> str:
    """The measured training time of the runs shown, and of every run the table has trained so far (`prov.spent`),
    and, at the CPU scales, what the whole table costs at the per-task medians (`prov.walls_by`: one family per task):
    every row runs its reported seeds plus its selection seeds at each multiplier of the starting lr grid (an extension
    of the grid costs more), and the length check its runs at factor × steps, on two processes of one thread (2 cores).
    A task with no finished run yet makes the projection unknown."""
    if not prov.walls.runs:
        return ""
    medians = {t: w.median_s for t, w in prov.walls_by}
    per_task = ", ".join(f"{t} {m:.0f} s" for t, m in medians.items())
    line = (f"Training time of the runs shown: {prov.walls.runs} runs, {prov.walls.sum_s / 3600:.2f} h of run wall "
            f"time summed (median per run: {per_task}).")
    line += trained_so_far(prov.spent)
    if scale not in ("smoke", "small"):
        return line
    at = exp.at(scale)
    selection = len(at.lr_grid) * len(at.selection_seeds)
    length = at.length_check
    per_row = [len(r["cell"].values) + len(r["cell"].missing) + selection for r in rows]
    longer = {r["task"]: 0 for r in rows}
    for r in rows:
        if length and (r["is_baseline"] or (r["test"] and r["test"].outcome in (Outcome.BETTER, Outcome.WORSE)
                                            and r["hypothesis"] == "primary")):
            longer[r["task"]] += length.factor * length.seeds
    unmeasured = sorted({r["task"] for r in rows} - set(medians))
    total = (sum(medians[r["task"]] * k for r, k in zip(rows, per_row)) +
             sum(medians[t] * k for t, k in longer.items() if t in medians)) if not unmeasured else 0.0
    whole = (f"unknown until {', '.join(unmeasured)} has a finished run" if unmeasured else f"{total / 2 / 3600:.1f} h")
    return (f"{line} The whole table: {sum(per_row)} runs (reported seeds, plus {selection} selection runs per row "
            f"on the starting grid){f' and {sum(longer.values())} run-lengths of the length check' if length else ''}"
            f", at these medians on two processes of one thread: {whole}.")


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
                t = r["test"]
                color = "grey" if r["is_baseline"] else ("C2" if t and t.low is not None and t.low > 0 else "C0")
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
    floors = load_floors(plan.results_root, scale, exp.table) if scale in FLOOR_SCALES else {}
    rows, _, result = table_rows(plan, floors)
    md, csv_rows = render(plan, rows, result, floors)
    return save_outputs(plan, md, csv_rows, lambda png: plot(rows, png, f"{exp.table}, scale={scale}"),
                        "final accuracy per reading, beside the baseline", floors=False, result=result)
