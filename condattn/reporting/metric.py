"""Which summary key a table reports, per row and scale: one rule for the tables, the lr grid's selection key
(reproduce.selection_key) and the floors."""

from __future__ import annotations


def row_metric(exp: dict, scale: str | None, row: str | None = None) -> str:
    """The row's `metrics: {<scale>: key}` entry, else its `metric:`, else the experiment's `metric_at: {<scale>:
    key}` entry, else its `metric` (the small tables with an lr grid report a held-out test split; validation picks
    the lr). Without `row`: the experiment's own (its heading)."""
    spec = (exp.get("rows") or {}).get(row) or {} if row is not None else {}
    at = (exp.get("metric_at") or {}).get(scale) if scale is not None else None
    return (spec.get("metrics") or {}).get(scale) or spec.get("metric") or at or exp["metric"]
