"""Detection tables (2: Mask R-CNN + XCiT, 7: DETR): several metrics per row, each beside the papers' number.

The experiment file lists `metrics: [{key, label}]` (summary.json metrics keys, shown × 100) and the papers' numbers
as `paper: {row: {source: {baseline: [...], conditioned: [...]}}}` in the same order (the layout of
the papers' tables), with `paper_sources: {source: label}`. The source of a method's number is the paper
that proposed it (`cet` for CET, `sca` for SCA); a baseline row shows every source's baseline (table 7: the DETR
paper's reference). Written by `reproduce` through the experiment's `renderer: condattn.reporting.detection:write_table`
(a `write_table(plan)`, as reporting.tables.write_table): results/<scale>/<table>.{md,csv,png}. An optional
`notes: {<scale>: text}` is printed under the table at that scale (save_outputs, notes.table_notes), once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..conditioning.spec import BASELINE, method_spec
from ..experiment import Experiment
from ..table.provenance import Provenance, provenance
from ..table.result import Values
from . import tables
from .fmt import fmt_values
from .tables import METHOD_LABELS, _direction, plot_curves, provenance_line, save_outputs, table_start

if TYPE_CHECKING:
    from ..table.planned import Plan


def _metrics(exp: Experiment) -> list[dict]:
    ms = exp.metrics or [{"key": exp.metric, "label": exp.metric}]
    return [m if isinstance(m, dict) else {"key": str(m), "label": str(m)} for m in ms]


def collect(plan: Plan):
    """{(row, method): tables.TableCell} (values = the primary metric, for provenance and curves) and
    {(row, method, metric key): [value × multiplier per finished seed]}."""
    exp = plan.exp
    cells = tables.collect(plan)
    values = {(row, method, k): [exp.multiplier * float(s["metrics"][k]) for s in cell.summaries
                                 if s["metrics"].get(k) is not None]
              for (row, method), cell in cells.items() for k in (m["key"] for m in _metrics(exp))}
    return cells, values


def paper_values(exp: Experiment, row: str, method: str, i: int) -> list[tuple[str, float]]:
    """(source label, value) of metric i that the papers report for this row and method."""
    out = []
    sources = exp.paper_sources
    for src, entry in (exp.paper.get(row) or {}).items():
        if method == BASELINE:
            vals = entry.get("baseline")
        elif method_spec(method).paper_key == src:
            vals = entry.get("conditioned")
        else:
            continue
        if vals is not None and i < len(vals) and vals[i] is not None:
            out.append((sources.get(src, src), float(vals[i])))
    return out


def _ours(vals: list[float], missing: list[int]) -> str:
    return fmt_values(Values((), tuple(vals), tuple(missing)))


def render(exp: Experiment, scale: str, cells: dict, values: dict, prov: Provenance) -> tuple[str, list[dict]]:
    metrics = _metrics(exp)
    digits = exp.paper_digits
    head = ["model", "method"]
    for m in metrics:
        head += [f"{m['label']}: ours", f"{m['label']}: papers"]
    head += ["steps", "wall time / run"]
    sources = ", ".join(f"{v}" for v in exp.paper_sources.values())
    lines = table_start(
        exp, f"Ours: mean ± std over seeds × {exp.multiplier:g} (n = finished seeds). Papers: the number reported for "
        f"the same model and method, labelled by the paper it comes from ({sources}; "
        f"{exp.paper_provenance or ''}).{_direction(exp)}", head)
    csv_rows = []
    for row in exp.rows_at(scale):
        for method in exp.methods:
            c = cells[(row, method)]
            cols = [row, METHOD_LABELS.get(method, method)]
            for i, m in enumerate(metrics):
                vals = values[(row, method, m["key"])]
                paper = paper_values(exp, row, method, i)
                cols += [_ours(vals, c.missing), " · ".join(f"{lab} {v:.{digits}f}" for lab, v in paper) or "–"]
                v = Values((), tuple(vals), ())
                csv_rows.append({
                    "table": exp.table, "row": row, "method": method, "label": METHOD_LABELS.get(method, method),
                    "scale": scale, "metric": m["key"], "metric_label": m["label"], "n": len(vals),
                    "mean": v.mean, "std": v.std,
                    "values": " ".join(f"{v:.4f}" for v in vals), "missing_seeds": " ".join(map(str, c.missing)),
                    "steps": " ".join(map(str, c.steps)), "wall_time_s": " ".join(f"{w:.1f}" for w in c.wall),
                    "papers": "; ".join(f"{lab}: {v}" for lab, v in paper),
                    "commit": " ".join(sorted({s.get("commit", "") for s in c.summaries})),
                })
            cols += [",".join(map(str, sorted(set(c.steps)))) or "–",
                     f"{Values((), tuple(c.wall), ()).mean:.0f} s" if c.wall else "–"]
            lines.append("| " + " | ".join(cols) + " |")
    lines += ["", provenance_line(prov)]  # the scale's note follows (save_outputs: notes.table_notes)
    return "\n".join(lines) + "\n", csv_rows


def write_table(plan: Plan) -> tuple[Path, str]:
    cells, values = collect(plan)
    prov = provenance(plan, cells)
    md, csv_rows = render(plan.exp, plan.scale, cells, values, prov)
    return save_outputs(plan, md, csv_rows, lambda png: plot_curves(plan.exp, plan.scale, cells, png),
                        "validation curves", provenance=prov)
