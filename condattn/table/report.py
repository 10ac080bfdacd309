"""The table from its plan: the kept records restored before, the finished runs kept after, the renderer between."""

from __future__ import annotations

import sys
from pathlib import Path

from ..runs import RunRecord
from .plan import Plan
from .store import kept_root as store_root


def kept_root(p: Plan) -> Path:
    """Where the table's finished runs are kept beside it (committed): results/<scale>/runs/<run name>.json.gz."""
    return store_root(p.results_root, p.scale)



def keep_finished(p: Plan) -> int:
    """Store the records of the plan's finished cells (selection, reported and length runs) beside the table, once
    each (a twin's link is not stored again), so that committing results/<scale>/ keeps the evidence and a cut session
    loses no finished run."""
    root = kept_root(p)
    return sum(RunRecord(c.run_dir).keep_in(root) for c in p.cells)



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



def report(p: Plan, failed: list[str], force: bool = False) -> int:
    """Render the table of the plan (`write_table(plan)`) from the runs there are; 1 when cells failed. A table whose
    result has more missing runs (its JSON's `missing_runs`) than the one already at its path (a fresh clone without
    runs) does not replace it: the old files are put back and the refusal says why (`force`: write it anyway)."""
    from ..reporting.tables import renderer_for

    if n := keep_finished(p):  # whether or not the table is written below: a finished run is evidence
        print(f"[reproduce] kept the records of {n} finished runs in {kept_root(p)} (summary, config, metrics, "
              "patch report: commit them with the table)")
    out = p.results_root / p.scale
    stem = p.output_stem
    old = {f: f.read_bytes() for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".json", ".png")) if f.exists()}
    md_path, md = renderer_for(p.exp)(p)
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

