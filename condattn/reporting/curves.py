"""Table 6, the papers' condition-number figures: diagnostics over training, baseline vs SCA vs CET.

Reads the "diag" rows of each finished run's `metrics.jsonl` (the trainer's `run_diagnostics`: step 0, every
`diagnostics.every` steps and the end of training; keys of condattn.diagnostics.collect.flat_metrics, plus
`kappa_jacobian/l0` from condattn.diagnostics.jacobian_diagnostics) and writes `results/<scale>/<table>.{md,csv,png}`:
- the figure: one row per model (the experiment's rows), panels κ(X) of the first block's input, κ(W_Q/W_K/W_V)
  mean over layers, the same for layer 0, attention entropy (mean over layers) and κ(J) of layer 0; one colour per
  method, its mean over seeds drawn bold, each seed faint;
- the Markdown table: step-0 and final values per model × method, mean ± std over finished seeds, with the papers'
  qualitative claims quoted and labelled as theirs, and runs that are missing or failed listed (never dropped);
  under it each row's final task metric per method (a method at chance has the κ values of an untrained model),
  the cost line and each row's baseline last-quarter figure;
- the CSV: one row per (model, method, quantity, stage), plus one `stage=final` row per (model, method) with the
  task metric and its `chance` (100 / classes, when the runs' config says how many classes).

A `write_table(plan)` as condattn.reporting.write_table, so an experiment selects it with
`renderer: condattn.reporting.curves:write_table`. Rebuild from existing runs:
    python -m condattn.reproduce experiments/table6_condition_numbers.yaml --scale smoke --report-only
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..conditioning.spec import METHODS, method_spec
from ..experiment import Experiment
from ..runs import RunId, RunRecord
from ..table.provenance import Provenance, provenance
from ..table.result import Values
from .ablation import last_quarter_gain
from .fmt import fmt_values
from .tables import METHOD_LABELS, TableCell, collect, provenance_line, save_outputs, training_time_line

if TYPE_CHECKING:
    from ..table.planned import Plan

# (flat diagnostics key, label) in table order; the figure draws a subset (PANELS)
QUANTITIES = [
    ("kappa_x/b0", "κ(X), embedded tokens (first block input)"),
    ("kappa_wq/mean", "κ(W_Q), mean over layers"),
    ("kappa_wk/mean", "κ(W_K), mean over layers"),
    ("kappa_wv/mean", "κ(W_V), mean over layers"),
    ("kappa_wq/l0", "κ(W_Q), layer 0"),
    ("kappa_wk/l0", "κ(W_K), layer 0"),
    ("kappa_wv/l0", "κ(W_V), layer 0"),
    ("sigma_min_wq/mean", "σ_min(W_Q), mean over layers"),
    ("sigma_min_wk/mean", "σ_min(W_K), mean over layers"),
    ("sigma_min_wv/mean", "σ_min(W_V), mean over layers"),
    ("entropy/mean", "attention entropy (nats), mean over layers"),
    ("kappa_attn/l0", "κ(attention output), layer 0"),
    ("kappa_attn/mean", "κ(attention output), mean over layers"),
    ("kappa_jacobian/l0", "κ(J), attention Jacobian of layer 0 (head 0)"),
]
LABELS = dict(QUANTITIES)


def claim_checks() -> list[tuple[str, str, str]]:
    """The papers' claims, checkable on the final values: (method, diagnostics key, "lower" | "higher": what the
    papers say the method does to it), read from each registered method (MethodSpec.diagnostics_claimed)."""
    return [(m, key, way) for m in METHODS for key, way in method_spec(m).diagnostics_claimed.items()]


ROLE_STYLES = {"q": "-", "k": "--", "v": ":"}
# (panel title, keys drawn in it, log-scale y)
PANELS = [
    ("κ(X), first block input", ["kappa_x/b0"], True),
    ("κ(W_Q) ─  κ(W_K) ‒‒  κ(W_V) ···, mean over layers", ["kappa_wq/mean", "kappa_wk/mean", "kappa_wv/mean"], True),
    ("κ(W_Q) ─  κ(W_K) ‒‒  κ(W_V) ···, layer 0", ["kappa_wq/l0", "kappa_wk/l0", "kappa_wv/l0"], True),
    ("attention entropy (nats), mean over layers", ["entropy/mean"], False),
    ("κ(J) of layer 0, head 0", ["kappa_jacobian/l0"], True),
]
JACOBIAN_INFO = ("kappa_jacobian_tokens/l0", "kappa_jacobian_tokens_total/l0", "kappa_jacobian_exact/l0",
                 "kappa_jacobian_converged/l0", "kappa_jacobian_xca/l0")
CSV_FIELDS = ["table", "scale", "row", "model", "method", "label", "quantity", "description", "stage", "steps", "n",
              "mean", "std", "values", "missing_seeds", "commit", "chance"]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def diag_series(run_dir: str | Path) -> dict[int, dict]:
    """{step: diag row} of one run; a later row of the same step wins (the end-of-training row repeats the last
    in-loop one when diagnostics.every divides the step count)."""
    return {int(r["step"]): r for r in RunRecord(run_dir).metrics_rows("diag")}


def curve(series: dict[int, dict], key: str) -> list[tuple[int, float]]:
    return [(s, float(r[key])) for s, r in sorted(series.items()) if _finite(r.get(key))]


def _stats(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _num(v: float, key: str) -> str:
    return f"{v:.3f}" if key.startswith("entropy") else f"{v:.3g}"


def _fmt(values: list[float], key: str) -> str:
    st = _stats(values)
    if st is None:
        return "not logged"
    return f"{_num(st[0], key)} ± {_num(st[1], key)}" if len(values) > 1 else _num(st[0], key)


def _run_state(runs_root: str | Path, run: RunId, variants: Mapping[str, str] | None = None) -> str:
    """Why a seed has no finished run: failed (with the error's first line), unfinished, or not run."""
    record = RunRecord.of(runs_root, run, variants)
    error = record.failure()
    if error is not None:
        return "failed: " + error.splitlines()[0][:160] if error else "failed"
    if record.finished:
        return "finished, but its summary lacks the experiment's metric"
    if record.dir.exists():
        return "unfinished (interrupted, running, or its summary is unreadable)"
    return "not run"


def cell_series(cell: TableCell) -> list[dict[int, dict]]:
    return [diag_series(s["run_dir"]) for s in cell.summaries]


def endpoints(series: list[dict[int, dict]], key: str) -> dict[str, list[float]]:
    """Per seed: the value at step 0 and at the last diagnostics step (the end of training)."""
    out: dict[str, list[float]] = {"step0": [], "final": []}
    for ser in series:
        pts = curve(ser, key)
        if pts and pts[0][0] == 0:
            out["step0"].append(pts[0][1])
        if pts:
            out["final"].append(pts[-1][1])
    return out


def _model_name(cell: TableCell) -> str:
    names = sorted({str(s.get("config", {}).get("model", {}).get("name", "?")) for s in cell.summaries})
    return ", ".join(names)


def _jacobian_note(series: list[dict[int, dict]]) -> str:
    rows = [r for ser in series for r in ser.values() if _finite(r.get("kappa_jacobian/l0"))]
    if not rows:
        return "κ(J) not logged (diagnostics.jacobian=false)"
    used = sorted({int(r.get(JACOBIAN_INFO[0], -1)) for r in rows})
    total = sorted({int(r.get(JACOBIAN_INFO[1], -1)) for r in rows})
    exact = {bool(r.get(JACOBIAN_INFO[2])) for r in rows}
    unconverged = sum(1 for r in rows if not r.get(JACOBIAN_INFO[3], 1))
    xca = {bool(r.get(JACOBIAN_INFO[4])) for r in rows}
    solver = " / ".join(sorted({"exact (jacrev + float64 SVD)" if e else "matrix-free (Lanczos on J Jᵀ)"
                                for e in exact}))
    formula = " / ".join(sorted({"XCA: softmax(τ q̂ᵀk̂) over channels" if x else "token softmax" for x in xca}))
    note = f"κ(J): {formula}, {solver}, on {'/'.join(map(str, used))} of {'/'.join(map(str, total))} tokens of sample 0"
    if unconverged:
        note += f"; {unconverged} of {len(rows)} values are Lanczos lower estimates (not converged)"
    return note


def table_data(plan: Plan) -> tuple[dict, dict]:
    """(cells, per (row, method): {"series": [...per finished seed], "missing": [(seed, why)], "model": str})."""
    cells = collect(plan)
    data = {}
    for (row, method), cell in cells.items():
        data[(row, method)] = {
            "series": cell_series(cell),
            "missing": [(seed, _run_state(plan.runs_root, RunId(plan.exp.table, row, method, plan.scale, seed),
                                              plan.variants))
                        for seed in cell.missing],
            "model": _model_name(cell),
        }
    return cells, data


def _metric_label(exp: Experiment, scale: str, row: str) -> str:
    """The task metric's name as the cells hold it (the row's summary key, times the table's multiplier)."""
    return f"{exp.row_metric(scale, row)} × {exp.multiplier:g}"


def _chance(cell: TableCell) -> float | None:
    """100 / classes of the cell's runs (the accuracy of a uniform guess), None when the summaries do not say."""
    for s in cell.summaries:
        cfg = s.get("config") or {}
        n = (cfg.get("model") or {}).get("num_classes") or (cfg.get("data") or {}).get("num_classes")
        if isinstance(n, int) and n > 1:
            return 100.0 / n
    return None


def _cell_text(c: TableCell) -> str:
    return fmt_values(Values(tuple(c.seeds), tuple(c.values), tuple(c.missing)))


def _metric_line(exp: Experiment, scale: str, row: str, methods: list[str], cells: dict) -> str:
    """The runs' task metric beside their κ: a method whose runs did not learn has κ values of an untrained model."""
    parts = [f"{METHOD_LABELS.get(m, m)} {_cell_text(cells[(row, m)])}" for m in methods]
    chance = next((c for m in methods if (c := _chance(cells[(row, m)])) is not None), None)
    return (f"{_metric_label(exp, scale, row)} at the end of these runs (mean ± std over seeds; a method near chance"
            + (f", {chance:.2f} here," if chance is not None else "")
            + f" has the κ values of a model that has not learned): {'; '.join(parts)}.")


def _claims(exp: Experiment) -> list[str]:
    claims = exp.paper_claims
    names = {"cet": "CET paper (Conditioned Embedded Tokens, ICCV 2025)",
             "sca": "SCA paper (Spectral Conditioning of Attention, NeurIPS 2025)"}
    lines = [f"The papers' claims ({exp.paper_provenance or 'see the experiment yaml'}), quoted; the papers plot "
             f"{' and '.join(exp.paper_models) or 'their models'}, we do not reproduce their numbers:", ""]
    lines += [f"- {names.get(k, k)}: \"{v}\"" for k, v in claims.items()]
    return lines


def _final_mean(data: dict, row: str, method: str, key: str) -> float | None:
    st = _stats(endpoints(data[(row, method)]["series"], key)["final"])
    return None if st is None else st[0]


def _comparisons(exp: Experiment, data: dict) -> list[str]:
    """Our final values beside each claim: a direction read off the means, not a statistical test."""
    base = exp.methods[0]
    lines = ["Ours beside the claims (final values, mean over finished seeds; a direction read off the means, not a "
             "significance test):", ""]
    for method, key, claim in claim_checks():
        if method not in exp.methods or method == base:
            continue
        parts = []
        for row in exp.rows:
            b, c = _final_mean(data, row, base, key), _final_mean(data, row, method, key)
            if b is None or c is None:
                parts.append(f"{row}: missing")
                continue
            got = "lower" if c < b else "higher" if c > b else "equal"
            parts.append(f"{row} {_num(b, key)} → {_num(c, key)} ({got}{'' if got == claim else ', not ' + claim})")
        lines.append(f"- {METHOD_LABELS.get(method, method)} vs {METHOD_LABELS.get(base, base)}, {LABELS[key]} "
                     f"(claimed {claim}): " + "; ".join(parts))
    return lines


def _cost_and_convergence(exp: Experiment, cells: dict, prov: Provenance) -> list[str]:
    """The cost line (the measured wall time of the runs shown, `prov`) and each row's baseline last-quarter gain (a
    figure)."""
    out = []
    if prov.walls.runs:  # one family per row here
        per_row = "; ".join(f"{row} {w.median_s:.0f} s" for row, w in prov.walls_by)
        out.append(training_time_line(prov.walls, f"median per run: {per_row}"))
    base = exp.methods[0]
    for row in exp.rows:
        cell = cells.get((row, base))
        gain = last_quarter_gain(cell.summaries) if cell else None
        if gain is not None:
            out.append(f"Convergence figure ({row}, {METHOD_LABELS.get(base, base)}): its validation top-1 gains "
                       f"{gain:+.2f} points over the last quarter of training (mean over seeds): the final κ values "
                       "are those of a model still gaining that much.")
    return out


def render(exp: Experiment, scale: str, cells: dict, data: dict, prov: Provenance) -> tuple[str, list[dict]]:
    methods = exp.methods
    lines = [f"# {exp.table}: {exp.title}", "", *_claims(exp), ""]
    lines += ["Ours: step 0 (initialisation) and final (end of training) values of the runs' diagnostics rows, mean ± "
              "std over finished seeds (one value when n = 1), on the fixed diagnostics batch (the first "
              "`diagnostics.batch_size` validation samples; κ(J) on sample 0). κ over nonzero singular values, "
              "effective weights (W + λI under SCA); \"mean over layers\" includes XCiT's class-attention layers.", ""]
    csv_rows = []
    for row in exp.rows:
        models = sorted({data[(row, m)]["model"] for m in methods if data[(row, m)]["series"]})
        steps = sorted({s for m in methods for s in cells[(row, m)].steps})
        lines += [f"## {row}: {', '.join(models) or 'no finished runs'}"
                  + (f", {','.join(map(str, steps))} steps" if steps else ""), ""]
        head = ["quantity"] + [f"{METHOD_LABELS.get(m, m)}: {stage}" for m in methods for stage in ("step 0", "final")]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        ends = {m: {key: endpoints(data[(row, m)]["series"], key) for key, _ in QUANTITIES} for m in methods}
        for key, label in QUANTITIES:
            cols = [label]
            for m in methods:
                for stage in ("step0", "final"):
                    cols.append(_fmt(ends[m][key][stage], key) if data[(row, m)]["series"] else "missing")
            lines.append("| " + " | ".join(cols) + " |")
        n = [f"{METHOD_LABELS.get(m, m)} n={len(data[(row, m)]['series'])}" for m in methods]
        lines += ["", f"Finished seeds: {', '.join(n)}. "
                  + _jacobian_note([s for m in methods for s in data[(row, m)]["series"]]) + "."]
        lines.append(_metric_line(exp, scale, row, methods, cells))
        missing = [(m, seed, why) for m in methods for seed, why in data[(row, m)]["missing"]]
        if missing:
            lines.append("Missing runs (not in the means): " + "; ".join(
                f"{METHOD_LABELS.get(m, m)} seed {seed}: {why}" for m, seed, why in missing) + ".")
        lines.append("")
        for m in methods:
            c = cells[(row, m)]
            commit = " ".join(sorted({s.get("commit", "") for s in c.summaries}))
            for key, label in QUANTITIES:
                for stage in ("step0", "final"):
                    vals = ends[m][key][stage]
                    st = _stats(vals)
                    csv_rows.append({
                        "table": exp.table, "scale": scale, "row": row, "model": data[(row, m)]["model"],
                        "method": m, "label": METHOD_LABELS.get(m, m), "quantity": key, "description": label,
                        "stage": stage, "steps": [int(x) for x in c.steps], "n": len(vals),
                        "mean": float(st[0]) if st else None,
                        "std": float(st[1]) if st and len(vals) > 1 else None,
                        "values": [float(v) for v in vals], "missing_seeds": [int(x) for x in c.missing],
                        "commit": commit,
                    })
            chance = _chance(c)
            csv_rows.append({  # the task metric, so that readers of the CSV (and the findings) see which runs learned
                "table": exp.table, "scale": scale, "row": row, "model": data[(row, m)]["model"], "method": m,
                "label": METHOD_LABELS.get(m, m), "quantity": exp.row_metric(scale, row),
                "description": _metric_label(exp, scale, row), "chance": None if chance is None else float(chance),
                "stage": "final", "steps": [int(x) for x in c.steps], "n": len(c.values),
                "mean": statistics.fmean(c.values) if c.values else None,
                "std": statistics.stdev(c.values) if len(c.values) > 1 else None,
                "values": [float(v) for v in c.values], "missing_seeds": [int(x) for x in c.missing],
                "commit": commit,
            })
    lines += [*_comparisons(exp, data), "", *_cost_and_convergence(exp, cells, prov), "", provenance_line(prov)]

    return "\n".join(lines) + "\n", csv_rows


def plot(exp: Experiment, scale: str, data: dict, out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, methods = list(exp.rows), exp.methods
    fig, axes = plt.subplots(len(rows), len(PANELS), figsize=(4.4 * len(PANELS), 3.4 * len(rows)), squeeze=False)
    drew = False
    for r, row in enumerate(rows):
        for p, (title, keys, log) in enumerate(PANELS):
            ax = axes[r, p]
            for mi, m in enumerate(methods):
                color = f"C{mi}"
                series = data[(row, m)]["series"]
                for key in keys:
                    style = ROLE_STYLES.get(key.split("/")[0][-1], "-") if len(keys) > 1 else "-"
                    curves = [curve(ser, key) for ser in series]
                    curves = [c for c in curves if c]
                    for c in curves if len(curves) > 1 else []:  # each seed, faint
                        ax.plot(*zip(*c), style, color=color, alpha=0.25, lw=0.8)
                    common = sorted(set.intersection(*(set(dict(c)) for c in curves))) if curves else []
                    if common:
                        mean = [statistics.fmean(dict(c)[s] for c in curves) for s in common]
                        ax.plot(common, mean, style, color=color, lw=1.8, marker="o", ms=2.5,
                                label=METHOD_LABELS.get(m, m) if key == keys[0] else None)
                        drew = True
                if not series and p == 0:
                    ax.plot([], [], color=color, label=f"{METHOD_LABELS.get(m, m)}: missing")
            if log and ax.has_data():
                ax.set_yscale("log")
            model = ", ".join(sorted({data[(row, m)]["model"] for m in methods if data[(row, m)]["series"]}))
            ax.set_title(f"{row} ({model or 'missing'}): {title}" if p == 0 else title, fontsize=8)
            ax.set_xlabel("optimizer step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if p == 0 and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    if not drew:
        plt.close(fig)
        return None
    n = max((len(data[k]["series"]) for k in data), default=0)
    fig.suptitle(f"{exp.table}, scale={scale}: ours, measured (mean over seeds bold"
                 f"{', each seed faint' if n > 1 else ''}); log y for κ", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_table(plan: Plan) -> tuple[Path, str]:
    """The renderer of table 6 (`write_table(plan)`, as condattn.reporting.write_table): results/<scale>/<table>.*"""
    cells, data = table_data(plan)
    prov = provenance(plan, cells)
    md, csv_rows = render(plan.exp, plan.scale, cells, data, prov)
    return save_outputs(plan, md, csv_rows, lambda png: plot(plan.exp, plan.scale, data, png),
                        "condition numbers over training", CSV_FIELDS, provenance=prov)
