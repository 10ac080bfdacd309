"""The table from its plan: the kept records restored before, the finished runs kept after, the renderer between."""

from __future__ import annotations

import sys
from pathlib import Path

from ..reporting.tables import renderer_for
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



def _missing(md: str) -> int:
    return md.count("missing")



def report(p: Plan, failed: list[str], force: bool = False) -> int:
    """Render the table of the plan (`write_table(plan)`) from the runs there are; 1 when cells failed. A table
    with more `missing` cells than the one already at its path (a fresh clone without runs) does not replace it: the
    old files are put back and the refusal says why (`force`: write it anyway)."""
    if n := keep_finished(p):  # whether or not the table is written below: a finished run is evidence
        print(f"[reproduce] kept the records of {n} finished runs in {kept_root(p)} (summary, config, metrics, "
              "patch report: commit them with the table)")
    out = p.results_root / p.scale
    stem = p.output_stem
    old = {f: f.read_bytes() for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".json", ".png")) if f.exists()}
    md_path, md = renderer_for(p.exp)(p)
    before = old.get(md_path)
    if before is not None and not force and _missing(md) > _missing(before.decode(errors="replace")):
        for f in (out / f"{stem}{ext}" for ext in (".md", ".csv", ".json", ".png")):
            if f not in old and f.exists():
                f.unlink()
        for f, data in old.items():
            f.write_bytes(data)
        print(f"[reproduce] kept {md_path}: the table from the runs under {p.runs_root} has more missing cells "
              f"({_missing(md)}) than the one there ({_missing(before.decode(errors='replace'))}); are the runs "
              "elsewhere (paths.runs, $CONDATTN_RUNS)? --force (FORCE=1) writes it anyway", file=sys.stderr)
        return 1
    print()
    print(md)
    print(f"[reproduce] wrote {md_path} (+ .csv, .png)")
    if failed:
        print(f"[reproduce] failed or interrupted cells: {', '.join(failed)}")
    return 1 if failed else 0

