"""Table 3 (GLUE after crammed-BERT pretraining): the papers' table, then ours, per task the MEDIAN over fine-tuning
seeds (cramming's protocol), the average over the tasks, and what each method's pretraining run reached.

Used as experiments/table3_glue.yaml's `renderer` (a `write_table(plan)`, as reporting.tables.write_table).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ..experiment import Experiment
from ..runs import RunId, RunRecord
from ..table.result import Pick, table_result
from .floors import load as load_floors
from .protocol import grid_text, lr_text
from .tables import METHOD_LABELS, plot_curves, protocol_lines, provenance_line, save_outputs

if TYPE_CHECKING:
    from ..table.planned import Plan

SECOND = {"mnli": ("mnli_mm", "final_test_score", "MNLI-mm")}  # a row whose runs also report a second dev split


def _columns(exp: Experiment, scale: str, cells: dict) -> list[tuple[str, str, dict[str, list[float]]]]:
    """(column key, label, method -> values × 100 per finished seed)."""
    cols = []
    for row in exp.rows_at(scale):
        label = (exp.rows[row].label or row)
        cols.append((row, label, {m: cells[(row, m)].values for m in exp.methods}))
        if row in SECOND:
            key, metric, label2 = SECOND[row]
            vals = {m: [100 * float(s["metrics"][metric]) for s in cells[(row, m)].summaries if metric in s["metrics"]]
                    for m in exp.methods}
            cols.append((key, label2, vals))
    return cols


def _pretrain_line(plan: Plan, method: str) -> str:
    run = RunId(plan.exp.table, "pretrain", method, plan.scale, plan.exp.pretrain.seed)
    record = RunRecord.of(plan.runs_root, run, plan.variants)
    name, s = record.dir.name, record.summary
    if s is None:
        return f"| {METHOD_LABELS.get(method, method)} | {name} | missing | | | | |"
    b = s.get("budget") or {}
    budget = f"{b.get('hours')} h" if b.get("hours") else "none (task.steps)"
    return (f"| {METHOD_LABELS.get(method, method)} | {name} | {s['steps']} | {s.get('train_tokens_per_s', '–')} | "
            f"{budget} | {s['metrics'].get('final_val_loss', float('nan')):.4f} | {s['train_time_s']:.0f} s |")


LR_FIELDS = ["lr_multiplier", "lr_value", "lr_at_bound", "lr_bound_binding", "lr_flat", "lr_weak_pick",
             "lr_selection_seeds"]


def _lr_fields(pick: Pick | None) -> dict:
    """The pick's typed fields (the result's; empty for the average column)."""
    if pick is None:
        return {k: None for k in LR_FIELDS}
    return {"lr_multiplier": pick.multiplier, "lr_value": pick.lr, "lr_at_bound": pick.at_bound,
            "lr_bound_binding": pick.mark.value == "bound binding", "lr_flat": pick.flat,
            "lr_weak_pick": pick.mark.value == "weak pick", "lr_selection_seeds": pick.selection_seeds}


def write_table(plan: Plan) -> tuple[Path, str]:
    exp, scale = plan.exp, plan.scale
    result, cells, _ = table_result(plan, load_floors(plan.results_root, scale, exp.table))
    cols = _columns(exp, scale, cells)
    methods = exp.methods

    pcols = exp.paper_columns
    lines = [f"# {exp.table}: {exp.title}", "",
             f"## The papers' numbers ({exp.paper_provenance or 'see the experiment file'})", "",
             "| | " + " | ".join(pcols) + " |", "|---|" + "---|" * len(pcols)]
    for key, label in (("cet_baseline", "paper CET: baseline"), ("cet", "paper CET: CET"),
                       ("sca_baseline", "paper SCA: baseline"), ("sca", "paper SCA: SCA")):
        vals = exp.paper.get(key)
        if vals:
            lines.append(f"| {label} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in vals) + " |")

    metric = exp.row_metric(scale)
    split = ("the held-out test score" if metric.startswith(("final_test_", "test_")) else "the dev score")
    lines += ["", f"## Ours: median over fine-tuning seeds of {split} × 100 ({metric}"
              f"{'; MNLI-mm: final_test_score' if 'mnli' in exp.rows_at(scale) else ''}), n = finished seeds", "",
              "| method | " + " | ".join(label for _, label, _ in cols) + " | average |",
              "|---|" + "---|" * (len(cols) + 1)]
    csv_rows = []
    for m in methods:
        medians = [statistics.median(v[m]) if v[m] else None for _, _, v in cols]
        avg = statistics.fmean(medians) if medians and all(x is not None for x in medians) else None
        texts = [f"{x:.1f} (n={len(v[m])})" if x is not None else "missing" for x, (_, _, v) in zip(medians, cols)]
        avg_text = "–" if avg is None else f"{avg:.1f}"
        lines.append(f"| {METHOD_LABELS.get(m, m)} | " + " | ".join(texts) + f" | {avg_text} |")
        for x, (key, label, v) in zip(medians, cols):
            arm = result.arm(key, m) if key in exp.rows else None
            fam = result.family_of(key, m) if key in exp.rows else None
            csv_rows.append({"table": exp.table, "scale": scale, "column": key, "label": label, "method": m,
                             "n": len(v[m]), "median": x, "values": list(v[m]),
                             "lr": lr_text(arm.pick) if arm else "", "lr_grid_scores": grid_text(arm.pick) if arm
                             else "", "pretraining_runs": 1 if exp.pretrain else None,
                             **_lr_fields(arm.pick if arm else None),
                             "plateau": fam.plateau is not None if fam else None,
                             "converged_2x": fam.converged if fam else None})
        csv_rows.append({"table": exp.table, "scale": scale, "column": "average", "label": "average", "method": m,
                         "n": None, "median": avg, "values": [], "lr": "", "lr_grid_scores": "",
                         "pretraining_runs": None, **_lr_fields(None), "plateau": None, "converged_2x": None})

    if exp.pretrain:
        lines += ["", "Pretraining (one run per method; every fine-tuning run of that method starts from its final "
                  "weights):", "",
                  "| method | run | steps | tokens/s | budget | final MLM val loss | training time |",
                  "|---|---|---|---|---|---|---|"]
        lines += [_pretrain_line(plan, m) for m in methods]
    lines += protocol_lines(plan, result, 1)
    lines += ["", provenance_line(result.provenance)]  # the scale's note follows (save_outputs: notes.table_notes)
    return save_outputs(plan, "\n".join(lines) + "\n", csv_rows,
                        lambda png: plot_curves(exp, scale, cells, png), "validation curves",
                        ["table", "scale", "column", "label", "method", "n", "median", "values", "lr", "lr_grid_scores",
                         "pretraining_runs", *LR_FIELDS, "plateau", "converged_2x"], result=result)
