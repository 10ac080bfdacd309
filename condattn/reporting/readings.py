"""Table 9: readings of SCA and CET, each task's rows beside its baseline, with step-0 saturation diagnostics.

Rows are the experiment's rows (experiments/table9_readings.yaml), each one reading (a method with its options) on
one task (`task`), named in words by `reading`. Per row: the final metric, mean ± std over seeds (the row's own
`metric:`, else the experiment's); its difference to the same task's baseline row (`baseline_reading`) with a 95%
Welch interval; and, from each run's summary.json["diagnostics"]["step0"], the attention entropy as a share of
uniform attention, the max attention probability, the share of queries whose attention argmax is themselves
(means over layers) and ‖∇W_Q‖ (mean over layers). The CSV adds the class token's self-attention, the spread of the
final pooled feature across the batch and the embedding's gradient norm. The closing line names the readings whose
interval lies above zero.

    python -m condattn.reporting.readings experiments/table9_readings.yaml --scale smoke [--seeds "0 1 2"]
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from . import protocol
from .floors import SCALES as FLOOR_SCALES
from .floors import load as load_floors
from .metric import row_metric
from .stats import diff_ci
from .tables import (
    TableCell,
    collect,
    multiplier,
    provenance_line,
    renderer_cli,
    rows_for,
    save_outputs,
    table_start,
)

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


def row_cells(exp: dict, scale: str, runs_root: str | Path, seeds: list[int]) -> dict[str, TableCell]:
    """One TableCell per row (its method, its metric)."""
    out = {}
    for row in rows_for(exp, scale):
        spec = exp["rows"][row]
        sub = {**exp, "rows": {row: spec},
               "scales": {scale: {"seeds": seeds}}}
        (cell,) = collect(sub, scale, runs_root, seeds).values()
        out[row] = cell
    return out


def table_rows(exp: dict, scale: str, runs_root: str | Path, seeds: list[int]) -> tuple[list[dict], dict]:
    cells = row_cells(exp, scale, runs_root, seeds)
    base_reading = exp.get("baseline_reading", "baseline")
    base = {exp["rows"][r]["task"]: r for r in cells if r == f"{exp['rows'][r]['task']}_{base_reading}"}
    key, higher = (exp.get("curve") or {}).get("key", "acc"), bool(exp.get("higher_is_better", True))
    targets = {task: protocol.baseline_target(cells[b].summaries, key, multiplier(exp), higher)
               for task, b in base.items()}
    out = []
    for row, c in cells.items():
        spec = exp["rows"][row]
        d0 = [s.get("diagnostics", {}).get("step0", {}) for s in c.summaries]
        b = base.get(spec["task"])
        ci = diff_ci(cells[b].values, c.values) if b and b != row else None
        target = targets.get(spec["task"])
        n_arm = min(len(c.values), len(cells[b].values)) if b else 0
        out.append({
            "lr": protocol.lr_text(exp, row), "lr_grid": protocol.grid_text(exp, row),
            "mde": protocol.mde_text(cells[b].values if b else [], n_arm),
            "steps": protocol.steps_column(c.summaries, target.value if target else None, key, multiplier(exp),
                                           higher),
            "target": target,
            "row": row, "task": spec["task"], "reading": spec.get("reading", row), "method": c.method,
            "metric": row_metric(exp, scale, row), "cell": c, "ci": ci, "is_baseline": row == b,
            "step0": {k: _mean([f(d) for d in d0]) for k, f in STEP0.items()},
            "extra": {k: _mean([f(d) for d in d0]) for k, f in EXTRA.items()},
        })
    return out, cells


def render(exp: dict, scale: str, rows: list[dict], cells: dict,
           floors: dict | None = None) -> tuple[str, list[dict]]:
    """`floors`: {task: cached floors entry} (reporting/floors.py), printed as rows under each task's readings."""
    head = ["reading", "final accuracy (%)", "Δ vs baseline [95% CI]", "lr (pick)", "MDE (80% power)",
            "steps to baseline's final val", *(f"step 0: {h}" for h in STEP0)]
    intro = ("Each row is one reading of a method (experiments/table9_readings.yaml names its options). Final "
             "accuracy: mean ± std over seeds of each task's summary key, named under its heading (final_*: at "
             "the end of training; test_acc: test accuracy at the best validation checkpoint, as LRA). Δ: "
             "difference of the means to the same task's baseline with a 95% Welch interval (needs ≥ 2 seeds per "
             "row). Step-0 columns, measured at initialisation on the fixed diagnostics batch and after the first "
             "backward, are means over layers: entropy as a share of uniform attention (1 = uniform, 0 = one-hot), "
             "max attention probability, the share of (query, head) pairs whose attention argmax is the query "
             "itself, and ‖∇W_Q‖_F.")
    lines = table_start(exp, intro, head)[:2] + [intro]
    csv_rows = []
    winners = []
    for task in dict.fromkeys(r["task"] for r in rows):
        metric = next(x["metric"] for x in rows if x["task"] == task)
        lines += ["", f"**{task}** (`{metric}`)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (x for x in rows if x["task"] == task):
            c, ci = r["cell"], r["ci"]
            acc = c.text()
            delta = "(baseline)" if r["is_baseline"] else (ci.text() if ci else "–")
            cols = [r["reading"], acc, delta, r["lr"], r["mde"][0], r["steps"][0]]
            cols += [_fmt(r["step0"][k], sci=k.startswith("‖")) for k in STEP0]
            lines.append("| " + " | ".join(cols) + " |")
            if ci and ci.low > 0:
                winners.append(f"{task}: {r['reading']} ({ci.text()})")
            mean_std = statistics.fmean(c.values) if c.values else None
            row = {"table": exp["table"], "scale": scale, "row": r["row"], "task": task, "reading": r["reading"],
                   "method": r["method"], "metric": r["metric"], "n": len(c.values),
                   "values": " ".join(f"{v:.4f}" for v in c.values),
                   "mean": f"{mean_std:.4f}" if mean_std is not None else "",
                   "std": f"{statistics.stdev(c.values):.4f}" if len(c.values) > 1 else "",
                   "missing_seeds": " ".join(map(str, c.missing)),
                   "diff_vs_baseline": f"{ci.diff:.4f}" if ci else "",
                   "diff_ci95_low": f"{ci.low:.4f}" if ci else "", "diff_ci95_high": f"{ci.high:.4f}" if ci else "",
                   "lr": r["lr"], "lr_grid_scores": r["lr_grid"],
                   "select_metric": ((exp.get("lr_picks") or {}).get(r["row"]) or {}).get("key", ""),
                   "mde_80": f"{r['mde'][1]:.4f}" if r["mde"][1] is not None else "",
                   "steps_to_target_median": r["steps"][0],
                   "steps_to_target": " ".join("never" if x is None else str(x) for x in r["steps"][1]),
                   "target": f"{r['target'].value:.4f}" if r["target"] and r["target"].value is not None else "",
                   **_convergence_csv(r),
                   "wall_time_s": " ".join(f"{w:.1f}" for w in c.wall),
                   "commit": " ".join(sorted({s.get("commit", "") for s in c.summaries}))}
            for k, st in {**r["step0"], **r["extra"]}.items():
                row[f"step0_{k}"] = f"{st[0]:.6g}" if st else ""
            csv_rows.append(row)
        for f in ((floors or {}).get(task) or {}).get("floors", []):  # same split, a classical model: not a method
            lines.append(f"| {f['label']} | {100 * f['value']:.2f} ({f['split']}) | – |" + " – |" * (len(head) - 3))
        base = next((x for x in rows if x["task"] == task and x["is_baseline"]), None)
        if base and base["target"]:
            lines += ["", base["target"].text()]
            total = max((int(s.get("steps") or 0) for s in base["cell"].summaries), default=0)
            if plateau := protocol.plateau_text(base["steps"][1], total):
                lines += ["", plateau]
    n_seeds = max((len(r["cell"].values) for r in rows), default=0)
    if n_seeds < 2:
        verdict = "With fewer than 2 seeds per row there is no interval: this table cannot say which reading is better."
    elif winners:
        verdict = "Readings above the baseline beyond their 95% interval: " + "; ".join(winners) + "."
    else:
        verdict = "No reading beats its task's baseline beyond its 95% interval."
    lines += ["", verdict, "", protocol.FOOTER, "", cost_line(exp, scale, rows), "",
              provenance_line(exp, scale, cells)]
    return "\n".join(lines) + "\n", csv_rows


def cost_line(exp: dict, scale: str, rows: list[dict]) -> str:
    """The measured training time of the runs shown and, at the CPU scales, what the whole table costs at those
    per-task medians: every row runs its seeds plus the lr grid's other multipliers on seed 0, on two processes of
    one thread (2 cores). A task with no finished run yet makes the projection unknown."""
    walls = [w for r in rows for w in r["cell"].wall]
    if not walls:
        return ""
    medians = {t: statistics.median(ws) for t in dict.fromkeys(r["task"] for r in rows)
               if (ws := [w for r in rows if r["task"] == t for w in r["cell"].wall])}
    per_task = ", ".join(f"{t} {m:.0f} s" for t, m in medians.items())
    line = (f"Training time of the runs shown: {len(walls)} runs, {sum(walls) / 3600:.2f} h of run wall time summed "
            f"(median per run: {per_task}).")
    if scale not in ("smoke", "small"):
        return line
    grid_extra = max(len((exp["scales"].get(scale) or {}).get("lr_grid") or []) - 1, 0)
    per_row = [len(r["cell"].values) + len(r["cell"].missing) + grid_extra for r in rows]
    unmeasured = sorted({r["task"] for r in rows} - set(medians))
    whole = (f"unknown until {', '.join(unmeasured)} has a finished run" if unmeasured else
             f"{sum(medians[r['task']] * k for r, k in zip(rows, per_row)) / 2 / 3600:.1f} h")
    return (f"{line} The whole table, {len(rows)} rows × {max(per_row)} runs (seeds + the lr grid's other "
            f"multipliers), at these medians on two processes of one thread: {whole}.")


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


def write_table(exp: dict, scale: str, runs_root: str | Path, results_root: str | Path,
                seeds: list[int] | None = None) -> tuple[Path, str]:
    """Same signature and outputs as condattn.reporting.write_table: results/<scale>/<table>.{md,csv,png}."""
    seeds = list(seeds if seeds is not None else exp["scales"][scale]["seeds"])
    rows, cells = table_rows(exp, scale, runs_root, seeds)
    floors = load_floors(results_root, scale, exp["table"]) if scale in FLOOR_SCALES else {}
    md, csv_rows = render(exp, scale, rows, cells, floors)
    return save_outputs(exp, scale, results_root, md, csv_rows,
                        lambda png: plot(rows, png, f"{exp['table']}, scale={scale}"),
                        "final accuracy per reading, beside the baseline", floors=False)


def main(argv: list[str] | None = None) -> int:
    return renderer_cli(argv, "python -m condattn.reporting.readings", __doc__, write_table, "readings")


if __name__ == "__main__":
    sys.exit(main())
