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


def higher_is_better(exp: dict, row: str | None = None) -> bool:
    """The metric's direction: the row's `higher_is_better`, else the experiment's (default true; false for a loss)."""
    spec = (exp.get("rows") or {}).get(row) or {} if row is not None else {}
    return bool(spec.get("higher_is_better", exp.get("higher_is_better", True)))


HYPOTHESES = ("primary", "exploratory")


def hypothesis(exp: dict, row: str) -> str:
    """"primary" (declared before running: the papers' methods as stated and the rival methods; one family per task,
    Holm-corrected) or "exploratory" (every other reading; Benjamini–Hochberg q): the row's `hypothesis`, default
    primary (a table whose rows train every method compares the papers' methods as stated)."""
    h = exp["rows"][row].get("hypothesis", "primary")
    if h not in HYPOTHESES:
        raise ValueError(f"row {row!r} of {exp['table']}: hypothesis {h!r}; use one of {', '.join(HYPOTHESES)}")
    return h


def row_seeds(exp: dict, scale: str, row: str, seeds: list[int]) -> list[int]:
    """The reported seeds of a row: all of `seeds` for the baseline and primary rows, the first
    `scales.<scale>.exploratory_seeds` of them for an exploratory row (when the scale sets it)."""
    n = (exp["scales"].get(scale) or {}).get("exploratory_seeds")
    return list(seeds[:int(n)]) if n and hypothesis(exp, row) == "exploratory" else list(seeds)


def families(exp: dict, scale: str) -> dict[str, list[tuple[str, str]]]:
    """The comparisons of a table, one family per task: {family: [(row, method), ...]}, the family's baseline first.
    A table of readings (rows that name their `method` and `task`, table 9) has one family per task, its baseline the
    row `<task>_<baseline_reading>`; a table whose rows train every method (tables 1, 3, 4, 5) has one family per row,
    its baseline the first method."""
    out: dict[str, list[tuple[str, str]]] = {}
    reading = exp.get("baseline_reading", "baseline")
    for row in rows_for(exp, scale):
        spec = exp["rows"][row]
        task = spec.get("task") if spec.get("method") is not None else None
        fam = out.setdefault(task or row, [])
        for method in methods_for(exp, row):
            if task is not None and row == f"{task}_{reading}":
                fam.insert(0, (row, method))
            else:
                fam.append((row, method))
    return out


def rows_for(exp: dict, scale: str) -> list[str]:
    """The rows a scale trains: `scales: {<scale>: {rows: [...]}}` when given (e.g. table 3's offline scales run only
    the stand-in task), else every row of the experiment."""
    rows = (exp["scales"].get(scale) or {}).get("rows")
    if rows is None:
        return list(exp["rows"])
    unknown = [r for r in rows if r not in exp["rows"]]
    if unknown:
        raise ValueError(f"scales.{scale}.rows names {unknown}, which are not rows of the experiment "
                         f"({', '.join(exp['rows'])})")
    return list(rows)


def methods_for(exp: dict, row: str) -> list[str]:
    """The methods a row trains: its own `method:` when the row names one (table 9: each row is one reading, a
    method with its options), else every method of the experiment."""
    own = exp["rows"][row].get("method")
    if own is None:
        return list(exp["methods"])
    if own not in exp["methods"]:
        raise ValueError(f"row {row!r} has method {own!r}, which is not among the experiment's methods "
                         f"({', '.join(exp['methods'])})")
    return [own]
