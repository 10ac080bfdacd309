"""`python -m condattn.reproduce experiments/tableN.yaml --scale smoke`: every cell of a table, then the table.

Cells are rows × methods × seeds; each is one `train` run with Hydra overrides
`<row overrides> conditioning=<method> scale=<scale> seed=<seed>` and a fixed run name
`<table>_<row>_<method>_<scale>_s<seed>`. Finished cells are skipped (their summary.json is valid),
unfinished ones resume from their last checkpoint, failed ones are reported in the table as missing.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from .config import compose
from .reporting import load_experiment, write_table
from .reporting.tables import run_name

LAUNCHERS = ("local",)


def cells(exp: dict, scale: str, seeds: list[int], extra: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for row, spec in exp["rows"].items():
        for method in exp["methods"]:
            for seed in seeds:
                name = run_name(exp["table"], row, method, scale, seed)
                overrides = [*spec.get("overrides", []), f"conditioning={method}", f"scale={scale}", f"seed={seed}",
                             f"run.table={exp['table']}", f"run.row={row}", f"run.name={name}", *extra]
                out.append((name, overrides))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.reproduce", description=__doc__.splitlines()[0])
    p.add_argument("experiment", help="experiments/tableN_*.yaml")
    p.add_argument("--scale", default="smoke", help="smoke | small | paper")
    p.add_argument("--seeds", help='e.g. "0 1 2" or 0,1,2; default: the experiment\'s seeds for this scale')
    p.add_argument("--launcher", default="local", help=f"one of {', '.join(LAUNCHERS)}")
    p.add_argument("--force", action="store_true", help="rerun finished cells from scratch")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table from existing runs")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell (e.g. impl.threads=2)")
    args = p.parse_intermixed_args(argv)

    exp = load_experiment(args.experiment)
    if args.scale not in exp["scales"]:
        p.error(f"--scale {args.scale!r} is not defined in {args.experiment}; choose one of {list(exp['scales'])}")
    if args.launcher not in LAUNCHERS:
        p.error(f"--launcher {args.launcher!r} is not available; choose one of {list(LAUNCHERS)}")
    seeds = list(exp["scales"][args.scale]["seeds"])
    try:
        seeds = [int(x) for x in args.seeds.replace(",", " ").split()] if args.seeds else seeds
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: give integers, e.g. --seeds \"0 1 2\"")
    todo = cells(exp, args.scale, seeds, list(args.overrides))
    configs = [(name, compose(ov)) for name, ov in todo]  # every override checked before any job starts
    runs_root = Path(configs[0][1].paths.runs)
    results_root = Path(configs[0][1].paths.results)

    failed = []
    if not args.report_only:
        from .engine.trainer import TrainingInterrupted, summary_is_finished, train

        t_all = time.time()
        for i, (name, cfg) in enumerate(configs, 1):
            if args.force:
                cfg.resume = "never"
            elif summary_is_finished(cfg.run.dir):
                print(f"[reproduce] {i}/{len(configs)} {name}: finished earlier, skipped")
                continue
            print(f"[reproduce] {i}/{len(configs)} {name}", flush=True)
            t0 = time.time()
            try:
                s = train(cfg)
                print(f"[reproduce]   {exp['metric']}={s['metrics'].get(exp['metric'], float('nan')):.4f} "
                      f"in {time.time() - t0:.0f} s", flush=True)
            except (TrainingInterrupted, KeyboardInterrupt) as e:
                print(f"[reproduce] stopped at {name}: {e}. Finished cells are kept; rerun to continue.")
                failed.append(name)
                break
            except Exception:
                traceback.print_exc()
                print(f"[reproduce] {name} FAILED (reported as missing in the table); continuing", flush=True)
                failed.append(name)
        print(f"[reproduce] {len(configs)} cells in {time.time() - t_all:.0f} s")

    md_path, md = write_table(exp, args.scale, runs_root, results_root, seeds)
    print()
    print(md)
    print(f"[reproduce] wrote {md_path} (+ .csv, .png)")
    if failed:
        print(f"[reproduce] failed or interrupted cells: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
