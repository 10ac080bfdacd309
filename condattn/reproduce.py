"""`python -m condattn.reproduce experiments/tableN.yaml --scale smoke`: every cell of a table, then the table.

Cells are rows × methods × seeds; each is one `train` run with Hydra overrides
`<row overrides> <scale overrides> conditioning=<method> scale=<scale> seed=<seed>` (scale overrides: the
experiment's optional `scales: {<scale>: {overrides: [...]}}`) and a fixed run name
`<table>_<row>_<method>_<scale>_s<seed>`. Before any cell trains or is submitted, every cell's config is
composed and checked (overrides, options, data, batch split, checkpoints in its run dir); one message per
problem. Finished cells are skipped (their summary.json is valid), unfinished ones resume from their last
checkpoint, failed ones are reported in the table as missing. A stop request (Ctrl-C, SIGTERM) checkpoints
the running cell and ends the table; running the command again finishes only what is missing.
Launchers: local (in this process), slurm (a submitit job array), submitit_local (the SLURM code path on
this machine); see README "Cluster".
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import sys
import time
import traceback
from pathlib import Path

from .engine.preflight import preflight
from .engine.signals import StopFlag
from .launch import LAUNCHERS, SUBMITIT_LAUNCHERS, ConfigError, RunSpec, active_job, compose_cell, launcher_problems
from .reporting import load_experiment, write_table
from .reporting.tables import methods_for, rows_for
from .runs import RunId, RunRecord


def select_rows(exp: dict, scale: str, patterns: list[str]) -> list[str]:
    """The rows of this scale that match any of `patterns` (shell globs: `vit_*`, `listops`); ValueError naming
    a pattern that matches no row, with the rows there are."""
    rows = rows_for(exp, scale)
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(r, pat) for r in rows):
            raise ValueError(f"--rows {pat!r} matches no row of {exp['table']} at scale {scale}; "
                             f"its rows are: {', '.join(rows)}")
    return [r for r in rows if any(fnmatch.fnmatchcase(r, pat) for pat in patterns)]


def cells(exp: dict, scale: str, seeds: list[int], extra: list[str],
          launcher: str = "local", only_rows: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """(run name, overrides) of every cell, in the order they run: with a `pretrain:` stage (table 3), first one
    pretraining run per method, then the rows' runs of that method, each given `model.init_from=<its pretraining
    run's name>`. `only_rows`: train just these rows (the table still shows every row from the runs there are)."""
    out = []
    at_scale = list((exp["scales"].get(scale) or {}).get("overrides", []))  # `scales: {<scale>: {overrides: [...]}}`
    common = [f"run.table={exp['table']}", f"launcher={launcher}"]
    pre = exp.get("pretrain")
    pre_names = {}
    if pre:
        pseed = int(pre.get("seed", 0))
        for method in exp["methods"]:
            name = pre_names[method] = RunId(exp["table"], "pretrain", method, scale, pseed).name
            out.append((name, [*pre.get("overrides", []), *(pre.get("scales", {}).get(scale) or []),
                               f"conditioning={method}", f"scale={scale}", f"seed={pseed}", "run.row=pretrain",
                               f"run.name={name}", *common, *extra]))
    for row in rows_for(exp, scale):
        if only_rows is not None and row not in only_rows:
            continue
        spec = exp["rows"][row]
        for method in methods_for(exp, row):
            init = [f"model.init_from={pre_names[method]}"] if pre else []
            # a row's own overrides at this scale, `{method}` / `{scale}` filled in (table 2: each method's backbone
            # starts from table 1's run of the same method)
            row_scale = [o.replace("{method}", method).replace("{scale}", scale)
                         for o in (spec.get("scales") or {}).get(scale) or []]
            for seed in seeds:
                name = RunId(exp["table"], row, method, scale, seed).name
                overrides = [*spec.get("overrides", []), *at_scale, *row_scale, *init, f"conditioning={method}",
                             f"scale={scale}", f"seed={seed}", f"run.row={row}", f"run.name={name}", *common, *extra]
                out.append((name, overrides))
    return out


def needs(exp: dict, name: str, scale: str) -> str | None:
    """The pretraining cell a fine-tuning cell starts from (None without a pretrain stage), with its variant."""
    if not exp.get("pretrain") or "_pretrain_" in name:
        return None
    run = RunId.parse(name, exp["table"], exp["rows"], exp["methods"], scale)
    if run is None:
        return None
    pre = RunId(exp["table"], "pretrain", run.method, scale, int(exp["pretrain"].get("seed", 0)))
    return RunId(**{**vars(pre), "variant": (exp.get("variants") or {}).get(pre.name, "")}).name


def _problem_report(problems: dict[str, list[str]], n_cells: int) -> list[str]:
    lines = []
    for msg, names in problems.items():
        if len(names) == n_cells and n_cells > 1:
            where = f"all {n_cells} cells"
        elif len(names) > 4:
            where = f"{len(names)} cells: {names[0]} … {names[-1]}"
        else:
            where = ", ".join(names)
        lines.append(f"  - {msg}  [{where}]")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.reproduce", description=__doc__.splitlines()[0])
    p.add_argument("experiment", help="experiments/tableN_*.yaml")
    p.add_argument("--scale", default="smoke", help="smoke | small | medium | paper")
    p.add_argument("--seeds", help='e.g. "0 1 2" or 0,1,2; default: the experiment\'s seeds for this scale')
    p.add_argument("--launcher", default="local", help=f"one of {', '.join(LAUNCHERS)}")
    p.add_argument("--dry-run", action="store_true",
                   help="validate every cell and print the jobs (and the exact sbatch script) without running")
    p.add_argument("--force", action="store_true", help="rerun finished cells from scratch")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table from existing runs")
    p.add_argument("--rows", help='train only these rows, e.g. "listops" or "vit_*,listops_cet*" (shell globs); the '
                   "table is still written with every row, from the runs there are. Two processes given disjoint "
                   "rows fill one table side by side")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell (e.g. impl.threads=2)")
    args = p.parse_intermixed_args(argv)

    try:
        exp = load_experiment(args.experiment)
    except (FileNotFoundError, ValueError) as e:
        print(f"[reproduce] {e}", file=sys.stderr)
        return 2
    if args.scale not in exp["scales"]:
        p.error(f"--scale {args.scale!r} is not defined in {args.experiment}; choose one of {list(exp['scales'])}")
    if args.launcher not in LAUNCHERS:
        p.error(f"--launcher {args.launcher!r} is not available; choose one of {list(LAUNCHERS)}")
    seeds = list(exp["scales"][args.scale]["seeds"])
    try:
        seeds = [int(x) for x in args.seeds.replace(",", " ").split()] if args.seeds else seeds
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: give integers, e.g. --seeds \"0 1 2\"")
    try:
        args.only_rows = select_rows(exp, args.scale, args.rows.replace(",", " ").split()) if args.rows else None
    except ValueError as e:
        p.error(str(e))
    try:
        return _run(args, exp, seeds)
    except ConfigError as e:
        msg = str(e)
        print(f"[reproduce] refused before starting any job:{'' if msg.startswith(chr(10)) else ' '}{msg}",
              file=sys.stderr)
        return 2


def _name_variants(todo: list[RunSpec], n_extra: int) -> dict[str, str]:
    """Give every cell whose extra overrides (the command's, after the cell's own) change its science config its
    variant name `<cell name>-<8 hex>` (engine/identity.py), so `ARGS="conditioning.lam=2"` trains its own runs
    beside the table's; a cell they do not change (λ on a baseline) keeps its name and its finished run. A pretraining
    run's new name follows into the `model.init_from` of its fine-tuning cells. Returns {cell name: variant}."""
    from .engine.identity import variant

    if not n_extra:
        return {}
    out: dict[str, str] = {}
    renamed: dict[str, str] = {}
    for c in todo:
        own = c.overrides[:-n_extra]  # cells() puts the command's overrides last
        if any(o.startswith("model.init_from=") and o.split("=", 1)[1] in renamed for o in c.overrides):
            c.overrides = [f"model.init_from={renamed[o.split('=', 1)[1]]}"
                           if o.startswith("model.init_from=") and o.split("=", 1)[1] in renamed else o
                           for o in c.overrides]
            c.cfg = compose_cell(c.overrides)
        v = variant(c.cfg, compose_cell(own))
        if v:
            out[c.name] = v
            renamed[c.name] = new = f"{c.name}-{v}"
            c.overrides = [f"run.name={new}" if o.startswith("run.name=") else o for o in c.overrides]
            c.cfg.run.name, c.name = new, new
    return out


def _run(args: argparse.Namespace, exp: dict, seeds: list[int]) -> int:
    todo = [RunSpec(name, ov) for name, ov in cells(exp, args.scale, seeds, list(args.overrides), args.launcher,
                                                     args.only_rows)]
    # 1. every override of every cell composes (one message per distinct bad override)
    errors: dict[str, list[str]] = {}
    for c in todo:
        try:
            c.cfg = compose_cell(c.overrides)
        except ConfigError as e:
            errors.setdefault(str(e), []).append(c.name)
    if errors:
        raise ConfigError("\n" + "\n".join(_problem_report(errors, len(todo))))
    variants = _name_variants(todo, len(args.overrides))
    exp = {**exp, "variants": variants} if variants else exp  # the renderers read these cells' runs
    first = todo[0].cfg
    runs_root, results_root = Path(first.paths.runs), Path(first.paths.results)
    by_dir: dict[str, list[str]] = {}
    for c in todo:
        by_dir.setdefault(str(c.run_dir), []).append(c.name)
    shared = {d: names for d, names in by_dir.items() if len(names) > 1}
    if shared:  # e.g. an extra run.name= override: the cells would overwrite each other's runs
        d, names = next(iter(shared.items()))
        raise ConfigError(f"{len(names)} cells ({', '.join(names[:3])}{', …' if len(names) > 3 else ''}) would share "
                          f"the run dir {d}; do not override run.name or run.dir for a whole table")

    if args.report_only:
        return _report(exp, args.scale, runs_root, results_root, seeds, [])

    # 2. the preflight of every cell: options, data, batch split over the launcher's processes, checkpoints
    problems: dict[str, list[str]] = {}
    warnings: dict[str, list[str]] = {}
    for prob in launcher_problems(first):
        problems.setdefault(prob.message, []).append("launcher")
    for c in todo:
        for prob in preflight(c.cfg, check_data=bool(c.cfg.launcher.get("check_data", True)),
                              check_run_dir=not args.force):
            # a dry run is often made away from the data (a laptop, a login node): missing data is a warning
            target = warnings if (args.dry_run and prob.kind == "data") else problems
            target.setdefault(prob.message, []).append(c.name)

    # 3. what each cell needs: skip finished ones and cells whose SLURM job is still queued or running
    pending: list[RunSpec] = []
    by_name = {c.name: c for c in todo}
    waiting: dict[str, list[str]] = {}  # pretraining run -> the fine-tuning cells waiting for it
    queued = 0
    n = len(todo)
    stale: list[RunSpec] = []  # --force on SLURM: waiting cells whose old results must go with their pretraining's
    for i, c in enumerate(todo, 1):
        status = RunRecord(c.run_dir).status
        first_stage = needs(exp, c.name, args.scale)
        if first_stage and c.cfg.launcher.name in SUBMITIT_LAUNCHERS and \
                (args.force or not RunRecord(by_name[first_stage].run_dir).finished):
            # a job array has no order: fine-tuning jobs are submitted by a later call, once their pretraining ended
            waiting.setdefault(first_stage, []).append(c.name)
            if args.force:
                stale.append(c)
            queued += 1
            continue
        if args.force:
            pending.append(c)
            continue
        if status == "finished":
            print(f"[reproduce] {i}/{n} {c.name}: finished earlier, skipped")
            continue
        if status == "corrupt":
            print(f"[reproduce] {i}/{n} {c.name}: summary.json is unreadable (corrupt or half-written); "
                  "treating the cell as unfinished")
        elif status == "failed":
            print(f"[reproduce] {i}/{n} {c.name}: failed earlier; running it again")
        if c.cfg.launcher.name == "slurm" and (job := active_job(c.run_dir)):
            print(f"[reproduce] {i}/{n} {c.name}: job {job} is still queued or running, skipped")
            queued += 1
            continue
        pending.append(c)

    for first_stage, names in waiting.items():
        print(f"[reproduce] {len(names)} cells ({names[0]} … {names[-1]}) wait for their pretraining run "
              f"{first_stage}; run the same command again (without --force) once it has finished")
    if warnings:
        print("[reproduce] warnings (a real submission would refuse these):")
        print("\n".join(_problem_report(warnings, n)))
    if problems:
        print("[reproduce] refused before starting any job:\n" + "\n".join(_problem_report(problems, n)),
              file=sys.stderr)
        return 2

    if args.dry_run and pending:  # what the cells to run will cost, before anything is queued (engine/cost.py)
        from .engine.cost import describe_cost

        print("\n".join(describe_cost(exp["table"], [(c.name, c.cfg) for c in pending])))
    launcher = first.launcher
    if launcher.name in SUBMITIT_LAUNCHERS:
        from .launch import submit

        if not pending:
            print("[reproduce] nothing to submit: every cell is finished or queued")
            if queued:
                print(f"[reproduce] {queued} cells are still queued or running; `make report-table-N "
                      f"SCALE={args.scale}` writes the table once they end")
                return 0
        else:
            if args.force and not args.dry_run:
                for c in [*pending, *stale]:  # a requeued job must resume, never wipe: clear the run dirs now instead
                    shutil.rmtree(c.run_dir, ignore_errors=True)
            with StopFlag() as stop:
                failed = submit(pending, launcher, exp["table"], args.scale, dry_run=args.dry_run, stop=stop)
            if args.dry_run or (launcher.name == "slurm" and not launcher.get("wait")):
                return 0
            return _report(exp, args.scale, runs_root, results_root, seeds, failed)
        if args.dry_run:
            return 0
        return _report(exp, args.scale, runs_root, results_root, seeds, [])

    if args.dry_run:
        print(f"[reproduce] dry run: {len(pending)} of {n} cells would train here, one after another (launcher=local)")
        for c in pending:
            print(f"  {c.name} -> {c.run_dir}")
        return 0

    from .engine.trainer import TrainingDiverged, TrainingInterrupted, train

    failed: list[str] = []
    not_started: list[str] = []
    interrupted = False
    ran = 0
    t_all = time.time()
    with StopFlag() as stop:
        for i, c in enumerate(pending, 1):
            if stop.requested:
                interrupted = True
                not_started = [x.name for x in pending[i - 1:]]
                print(f"[reproduce] stop requested ({stop.name})")
                break
            cfg = c.cfg
            if (first_stage := needs(exp, c.name, args.scale)) in failed:
                print(f"[reproduce] {i}/{len(pending)} {c.name}: skipped, its pretraining run {first_stage} failed "
                      "(reported as missing)", flush=True)
                failed.append(c.name)
                continue
            if args.force:
                cfg.resume = "never"
            print(f"[reproduce] {i}/{len(pending)} {c.name}", flush=True)
            ran += 1
            t0 = time.time()
            try:
                s = train(cfg)
                key = exp["metric"] if exp["metric"] in s["metrics"] else next(iter(s["metrics"]))  # (a pretrain cell)
                print(f"[reproduce]   {key}={s['metrics'][key]:.4f} in {time.time() - t0:.0f} s", flush=True)
            except (TrainingInterrupted, KeyboardInterrupt) as e:
                why = str(e).split("; run the same command")[0] if str(e) else "KeyboardInterrupt"
                print(f"[reproduce] stopped at {c.name}: {why}", flush=True)
                interrupted = True
                failed.append(c.name)
                not_started = [x.name for x in pending[i:]]
                break
            except Exception as e:
                if not isinstance(e, TrainingDiverged):  # its message says it all
                    traceback.print_exc()
                print(f"[reproduce] {c.name} FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                      "(reported as missing in the table); continuing", flush=True)
                failed.append(c.name)
    print(f"[reproduce] {ran} of {len(pending)} cells run in {time.time() - t_all:.0f} s")
    code = _report(exp, args.scale, runs_root, results_root, seeds, failed)
    if interrupted:
        print(f"[reproduce] stopped: {len(failed)} cell(s) interrupted or failed, {len(not_started)} not started. "
              "Finished cells are kept; rerun the same command to finish the missing ones (interrupted cells "
              "resume from their checkpoint).")
        return 3
    return code


def _renderer(exp: dict):
    """The experiment's `renderer: module:function` (same signature as reporting.write_table), or the generic one."""
    spec = exp.get("renderer")
    if not spec:
        return write_table
    import importlib

    module, _, fn = str(spec).partition(":")
    return getattr(importlib.import_module(module), fn or "write_table")


def _report(exp: dict, scale: str, runs_root: Path, results_root: Path, seeds: list[int], failed: list[str]) -> int:
    md_path, md = _renderer(exp)(exp, scale, runs_root, results_root, seeds)
    print()
    print(md)
    print(f"[reproduce] wrote {md_path} (+ .csv, .png)")
    if failed:
        print(f"[reproduce] failed or interrupted cells: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
