"""Step 0 of a finished run, recomputed without training, for the committed records that lack it.

Step 0's diagnostics (engine/parts/diagnostics.py) are a function of the run's resolved config alone: its seed draws
the initial weights and the first batch, the diagnostics batch is the first validation samples, and the gradient norms
come from the first step's backward pass, before any update. `recompute` builds the run from its recorded config.yaml
in a scratch directory as the trainer does and runs that first forward and backward pass, with no optimizer step
(`StepLoop.step0`). Runs resumed before checkpoints kept step 0 recorded `diagnostics.step0 = {}`;

    python -m condattn.engine.step0 results/small/runs            # fill every empty step 0 there
    python -m condattn.engine.step0 --check 3 results/small/runs  # recompute 3 records that have it: the difference

gives each such record (`runs.KeptRecord`) its values back, compared first with the step-0 `diag` and `grad` rows of
the record's own metrics.jsonl (a run logs them before any checkpoint, and its summary's step 0 is their union), and
says so in `diagnostics.step0_recomputed` (when, at which commit, the largest difference). A recompute that differs from
those rows by more than `TOLERANCE`, or lacks one of their values, is refused and the record left as it was. Values a
later diagnostics version measures and the run's code did not are left out: the record gets what its run measured.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..runs import METRICS, SUMMARY, KeptRecord, kept_records

TOLERANCE = 1e-6  # relative to the value's size (or absolute below 1): float32 noise, not another measurement
HOW = ("recomputed without training: the run rebuilt from its recorded config and seed, step 0's diagnostics "
       "measured on its first forward and backward pass before any update (condattn.engine.step0)")


def recompute(config_yaml: str, torch_threads: int | None = None) -> dict[str, Any]:
    """Step 0's diagnostics of the run whose resolved config is `config_yaml` (a run's config.yaml), as its
    summary's `diagnostics.step0` holds them. `torch_threads`: the thread count the run used when its config leaves
    `impl.threads` unset (its summary's `hardware.torch_threads`)."""
    import torch
    from omegaconf import OmegaConf, open_dict

    from ..config import resolve_paths
    from .loop import StepLoop
    from .setup import build_run, process_settings

    cfg = OmegaConf.create(config_yaml)
    threads = torch.get_num_threads()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    with tempfile.TemporaryDirectory(prefix="condattn-step0-") as scratch, open_dict(cfg):
        run_dir = Path(scratch) / str(cfg.run.name)
        cfg.run.dir, cfg.resume, cfg.logger.name = str(run_dir), "never", "none"
        resolve_paths(cfg)
        if not cfg.impl.get("threads") and torch_threads:
            torch.set_num_threads(int(torch_threads))
        try:
            return StepLoop(build_run(cfg, run_dir, process_settings(cfg))).step0()
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(was_deterministic)


def logged_step0(metrics_text: str) -> dict[str, Any]:
    """The step-0 `diag` and `grad` rows of a metrics.jsonl text, as one dict (what the run's summary recorded)."""
    import json

    rows = [json.loads(line) for line in metrics_text.splitlines() if line.strip()]
    return {k: v for r in rows if r.get("step") == 0 and r.get("split") in ("diag", "grad")
            for k, v in r.items() if k not in ("step", "split")}


def difference(got: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float]:
    """(largest absolute, largest relative) difference of `got` to `ref` over `ref`'s keys (inf: `got` lacks one).
    Keys only `got` has are a later diagnostics version's (the run's code did not measure them): not compared."""
    if not set(ref) <= set(got):
        return math.inf, math.inf
    gap, rel = 0.0, 0.0
    for k in ref:
        x, y = float(got[k]), float(ref[k])
        d = 0.0 if x == y or (math.isnan(x) and math.isnan(y)) else abs(x - y)
        d = math.inf if math.isnan(d) else d
        gap, rel = max(gap, d), max(rel, d / max(abs(y), 1.0))
    return gap, rel


def empty_step0(records: list[KeptRecord]) -> list[KeptRecord]:
    """The finished records whose summary has `diagnostics.step0` empty."""
    return [r for r in records if r.summary is not None and not (r.summary.get("diagnostics") or {}).get("step0")]


def measure(record: KeptRecord) -> tuple[dict[str, Any], dict[str, Any], float, float]:
    """(recomputed step 0, the record's logged step-0 rows, largest absolute and relative difference)."""
    files = record.files or {}
    summary = files[SUMMARY]
    got = recompute(files["config.yaml"], (summary.get("hardware") or {}).get("torch_threads"))
    logged = logged_step0(files.get(METRICS, ""))
    return got, logged, *difference(got, logged)


class NotWritten(ValueError):
    """A recompute that does not match the record's logged step-0 rows (the record is left as it was)."""


def fill(record: KeptRecord, commit: str) -> str:
    """Give `record` its recomputed step 0 when it matches its logged rows (else NotWritten); one line saying what
    was done."""
    got, logged, gap, rel = measure(record)
    if not logged or rel > TOLERANCE:
        why = "its metrics.jsonl has no step-0 rows" if not logged else \
            f"the recompute lacks {sorted(set(logged) - set(got))[:3]} of its logged step-0 rows" if gap == math.inf \
            else f"the recompute differs from its logged step-0 rows by {gap:.3g} ({rel:.3g} relative)"
        raise NotWritten(f"not written, {why}")
    files = record.files or {}
    summary = dict(files[SUMMARY])
    values = {k: got[k] for k in logged}  # what the run's own code measured (a later version measures more)
    summary["diagnostics"] = {**summary.get("diagnostics", {}), "step0": values, "step0_recomputed": {
        "how": HOW, "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
        "max_abs_diff_to_logged_rows": gap}}
    record.write({**files, SUMMARY: summary})
    return (f"{record.name}: step 0 written ({len(values)} values; largest difference to its logged step-0 rows "
            f"{gap:.3g})")


def check(record: KeptRecord) -> str:
    """One line: how far the recompute lies from the step 0 `record` recorded."""
    got = measure(record)[0]
    recorded = record.summary["diagnostics"]["step0"]  # type: ignore[index]
    gap, rel = difference(got, recorded)
    return (f"{record.name}: {len(recorded)} values recorded, largest difference of the recompute to them {gap:.3g} "
            f"({rel:.3g} relative; {len(set(got) - set(recorded))} values measured now that its code did not)")


def guarded(do: Any, record: KeptRecord, *args: Any) -> tuple[str, bool]:
    """(`do(record, *args)`'s line, True), or (why not, False): a recompute that does not match, or a run that cannot
    be rebuilt here (e.g. a fine-tuning run whose pretraining run is not under paths.runs). The other records go on."""
    try:
        return do(record, *args), True
    except NotWritten as e:
        return f"{record.name}: {e}", False
    except Exception as e:  # noqa: BLE001 (one record's failure is reported, not fatal)
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{record.name}: not recomputed, the run cannot be rebuilt here: {type(e).__name__}: {why}", False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m condattn.engine.step0", description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", help="folders of committed run records (results/<scale>/runs)")
    ap.add_argument("--check", type=int, default=0, metavar="N",
                    help="recompute N records that have step 0 (spread over each folder) and compare; write nothing")
    ap.add_argument("--only", default="", help="only records whose name contains this text")
    args = ap.parse_args(argv)
    from .provenance import git_commit

    failed = 0
    for root in args.roots:
        if not Path(root).is_dir():
            print(f"[condattn] {root}: no such folder; give results/<scale>/runs", file=sys.stderr)
            return 2
        records = [r for r in kept_records(root) if args.only in r.name]
        empty = empty_step0(records)
        if args.check:
            full = [r for r in records if r.finished and r not in empty]
            picks = full[:: max(1, len(full) // args.check)][: args.check]
            done = [guarded(check, r) for r in picks]
        else:
            print(f"[condattn] {root}: {len(empty)} of {len(records)} records have an empty step 0", flush=True)
            commit = git_commit() if empty else ""
            done = [guarded(fill, r, commit) for r in empty]
        for line, ok in done:
            print(f"[condattn] {line}", flush=True)
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
