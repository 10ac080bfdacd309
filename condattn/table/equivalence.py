"""Code equivalence by reproduction: when an edit to shared code changes the fingerprint of every method's runs, train
one smoke cell per method at the old commit and at HEAD; where every metric is bit-identical, record that the two
fingerprints compute the same (`results/code_equivalence.json`), so `STALE=1` does not retrain runs that HEAD
reproduces exactly. Evidence, not proof: the record names the cells that were reproduced.

    python -m condattn.table.equivalence --since <commit>      # (make code-equivalence SINCE=<commit>)

The cells are table 9's smoke cells (ViT, one per method; ListOps with Nyströmformer for the baseline, SCA and CET):
every registered method, seconds each. HEAD must be committed (its fingerprint is what the record names).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ..engine import provenance
from ..experiment import load
from ..runs import RunRecord
from .cells import parts

EXPERIMENT = provenance.REPO / "experiments" / "table9_readings.yaml"
ROWS = ("listops_baseline", "listops_sca10", "listops_cet")  # beside one ViT row per method


def evidence_cells() -> list[tuple[str, str, list[str]]]:
    """(method, cell name, overrides): table 9's first ViT smoke row of each method, and the ListOps rows of ROWS."""
    exp = load(EXPERIMENT)
    out, seen = [], set()
    for part in parts(exp, "smoke", [0]):
        if (part.row.startswith("vit_") and part.method not in seen) or part.row in ROWS:
            seen.add(part.method)
            out.append((part.method, part.name, list(part.own)))
    return out


def train_at(where: Path, name: str, overrides: list[str], runs: Path) -> dict:
    """Train one cell with the code checked out at `where`; its summary's metrics."""
    cmd = [sys.executable, "-m", "condattn.train", *overrides, "logger=none", f"paths.runs={runs}",
           f"paths.cache={runs.parent / 'cache'}"]
    env = {**__import__("os").environ, "PYTHONPATH": str(where)}
    done = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=1800)
    summary = RunRecord(runs / "smoke" / name).summary
    if summary is None:
        raise RuntimeError(f"{name} did not finish at {where}: {done.stderr.strip().splitlines()[-1:]}")
    return summary["metrics"]


def record(since: str, out: Path) -> list[dict]:
    """Reproduce the evidence cells at `since` and at HEAD; append an entry per method to `out`."""
    head = provenance.git_commit()
    if head.endswith("+dirty") or head == "unknown":
        raise SystemExit(f"HEAD is {head}: commit first (the record names HEAD's fingerprint)")
    old_files = provenance.files_at(since)
    if old_files is None:
        raise SystemExit(f"--since {since}: not a commit of this repository")
    now_files = provenance.source_files()
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), since], cwd=provenance.REPO, check=True)
        try:
            for method, name, overrides in evidence_cells():
                if not (old / "configs" / "conditioning" / f"{method}.yaml").is_file():  # no run of it can be older
                    print(f"[equivalence] {name}: {method} has no config at {since}: nothing to compare")
                    continue
                a = train_at(old, name, overrides, Path(tmp) / "a" / "runs")
                b = train_at(provenance.REPO, name, overrides, Path(tmp) / "b" / "runs")
                same = a == b
                print(f"[equivalence] {name}: {'bit-identical' if same else 'DIFFERS'} at {since} and {head}")
                entries.append({"method": method, "cell": name, "from_commit": since, "to_commit": head,
                                "from_code": provenance.fingerprint(old_files, method),
                                "to_code": provenance.fingerprint(now_files, method), "equal": same,
                                "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=provenance.REPO)
    known = json.loads(out.read_text()) if out.is_file() else []
    out.write_text(json.dumps(known + entries, indent=1) + "\n")
    return entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m condattn.table.equivalence", description=__doc__.splitlines()[0])
    ap.add_argument("--since", required=True, help="the commit whose runs' code to compare with HEAD's")
    args = ap.parse_args(argv)
    entries = record(args.since, provenance.EQUIVALENCE)
    differ = [e["cell"] for e in entries if not e["equal"]]
    where = provenance.EQUIVALENCE.relative_to(provenance.REPO)
    print(f"[equivalence] {len(entries) - len(differ)} of {len(entries)} cells bit-identical; recorded in {where}"
          + (f"; differ: {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
