"""The table from its plan: the kept records restored before, the finished runs kept after, the renderer between.
The renderer (`write_table(plan) -> (md path, md text)`, one of reporting/'s) is handed in by the command above: the
table wing never imports the views."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from ..runs import RunRecord
from .plan import Plan
from .store import exploratory_root
from .store import kept_root as store_root

Renderer = Callable[[Plan], tuple[Path, str]]


def exploratory(p: Plan) -> bool:
    """A table made with science overrides (`Plan.made_with`: ARGS="conditioning.lam=5"): exploratory output, written
    under results/exploratory/ (ignored by git), never beside the committed tables."""
    return p.made_with is not None


def kept_root(p: Plan) -> Path:
    """Where the table's finished runs are kept beside it: results/<scale>/runs/<run name>.json.zst (committed), or
    for an exploratory table results/exploratory/<scale>/runs/ (ignored)."""
    return store_root(exploratory_root(p.results_root) if exploratory(p) else p.results_root, p.scale)


def keep_finished(p: Plan) -> int:
    """Store the records of the plan's finished cells (selection, reported and length runs) beside the table, once
    each (a twin's link is not stored again), so that committing results/<scale>/ keeps the evidence and a cut session
    loses no finished run. An exploratory table keeps its records in its own ignored folder."""
    root = kept_root(p)
    return sum(RunRecord(c.run_dir).keep_in(root) for c in p.cells)


def kept_line(p: Plan, n: int) -> str:
    """What was kept, and (for a committed table only) that the records go with it into git."""
    if exploratory(p):
        return (f"[reproduce] kept the records of {n} finished runs in {kept_root(p)} (exploratory: an ignored "
                "folder; nothing to commit)")
    return (f"[reproduce] kept the records of {n} finished runs in {kept_root(p)} (summary, config, metrics, "
            "patch report: commit them with the table)")



def _missing(path: Path, data: bytes | None) -> int | None:
    """The planned runs without a finished summary that a table's JSON records (`missing_runs`, written from its
    result); None for a file without it."""
    import json

    if data is None:
        return None
    try:
        n = json.loads(data).get("missing_runs")
    except ValueError:
        return None
    return n if isinstance(n, int) else None



def out_dir(p: Plan) -> Path:
    """Where the plan's table is written: results/<scale>/, or results/exploratory/<scale>/ for an exploratory one."""
    return (exploratory_root(p.results_root) if exploratory(p) else p.results_root) / p.scale


def report(p: Plan, failed: list[str], render: Renderer, force: bool = False) -> int:
    """Render the table of the plan with `render` (the experiment's renderer, handed in by the command) from the runs
    there are; 1 when cells failed. A table whose result has more missing runs (its JSON's `missing_runs`) than the
    one already at its path (a fresh clone without runs) does not replace it: the old files are put back and the
    refusal says why (`force`: write it anyway)."""
    if n := keep_finished(p):  # whether or not the table is written below: a finished run is evidence
        print(kept_line(p, n))
    out = out_dir(p)
    stem = p.output_stem
    old = {f: f.read_bytes() for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".json", ".png")) if f.exists()}
    md_path, md = render(p)
    json_path = md_path.with_suffix(".json")
    now, before = _missing(json_path, json_path.read_bytes() if json_path.exists() else None), \
        _missing(json_path, old.get(json_path))
    # a committed table without the count (written before it was recorded) is replaced only by a complete one
    worse = now is not None and now > (before if before is not None else 0)
    if md_path in old and worse and not force:
        for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".json", ".png")):
            if f not in old and f.exists():
                f.unlink()
        for f, data in old.items():
            f.write_bytes(data)
        print(f"[reproduce] kept {md_path}: the table from the runs under {p.runs_root} has more missing runs "
              f"({now}) than the one there ({'none recorded' if before is None else before}); are the runs "
              "elsewhere (paths.runs, $CONDATTN_RUNS)? --force (FORCE=1) writes it anyway", file=sys.stderr)
        return 1
    print()
    print(md)
    print(f"[reproduce] wrote {md_path} (+ .csv, .png)")
    if failed:
        print(f"[reproduce] failed or interrupted cells: {', '.join(failed)}")
    return 1 if failed else 0

