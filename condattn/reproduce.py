"""`python -m condattn.reproduce experiments/tableN.yaml --scale smoke`: every cell of a table, then the table.

Cells are rows × methods × seeds; each is one `train` run with Hydra overrides
`<row overrides> <scale overrides> conditioning=<method> scale=<scale> seed=<seed>` (scale overrides: the
experiment's optional `scales: {<scale>: {overrides: [...]}}`) and a fixed run name
`<table>_<row>_<method>_<scale>_s<seed>`. Before any cell trains or is submitted, every cell's config is
composed and checked (overrides, options, data, batch split, checkpoints in its run dir); one message per
problem. Finished cells are skipped (their summary.json is valid), unfinished ones resume from their last
checkpoint, failed ones are reported in the table as missing. A stop request (Ctrl-C, SIGTERM) checkpoints
the running cell and ends the table; running the command again finishes only what is missing.

With `scales: {<scale>: {lr_grid: [0.5, 1, 2]}}` every row picks its lr first (the fair protocol): stage 1 runs the
row's first seed at each multiplier of its optim.lr (`optim.lr=<value>`, a variant run like any other), stage 2 its
other seeds at the multiplier with the best validation score (`selection_key`: never a test metric); the table
records the pick and the grid's scores.

The parts: `plan()` (cells, overrides, identity, lr picks, cost; no side effects), the launch
(`launch.run_local`, or a submitit job array: slurm / submitit_local, see docs/cluster.md), and `report()`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .checks import early_problems, seed_problems, table_override_problems
from .engine.artefacts import repair_finished
from .engine.preflight import preflight_checked
from .engine.signals import StopFlag
from .experiment import Experiment, load
from .launch import LAUNCHERS, SUBMITIT_LAUNCHERS, ConfigError, RunSpec, active_job, launcher_problems
from .runs import RunId, RunRecord
from .table.cells import cells, needs, parts, rows_slug, select_rows  # noqa: F401 (the command's names)
from .table.kept import NOTHING, Restored, restore_kept, with_kept  # noqa: F401
from .table.length import length_check
from .table.lr_grid import LrPick, selection_key  # noqa: F401
from .table.plan import Plan, plan, problem_report, refusal
from .table.report import keep_finished, kept_line, report

# --------------------------------------------------------------------------------------------- checks and launch


@dataclass(frozen=True)
class Options:
    """What the command was asked (its switches, typed): read by every part of it, never set after `main`."""

    scale: str
    launcher: str = "local"
    dry_run: bool = False
    force: bool = False
    no_reuse: bool = False
    report_only: bool = False
    refresh_stale: bool = False
    status: bool = False
    only_rows: tuple[str, ...] | None = None  # --rows: train only these (the table still shows every row)
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planner:
    """How this command plans its table (table/plan.py) and reads the kept records (table/kept.py)."""

    exp: Experiment
    seeds: tuple[int, ...]
    stem: str
    opts: Options

    def plan(self, read_records: bool = True, full: bool = False) -> Plan:
        """A plan of the cells to train (`full`: also the other rows' picks and variants, which the table reads)."""
        o = self.opts
        rows = list(o.only_rows) if o.only_rows is not None else None
        return plan(self.exp, o.scale, list(self.seeds), list(o.overrides), o.launcher, rows, read_records,
                    full=full or rows is None, reuse=not o.no_reuse, stem=self.stem)

    def full(self) -> Plan:
        return self.plan(full=True)

    def with_kept(self, read_records: bool = True) -> tuple[Plan, Restored]:
        """A plan and what the kept records bring to it: restored, or only read in a dry run (it writes nothing);
        under --force (retraining) none are read."""
        if self.opts.force and not self.opts.report_only:
            return self.plan(read_records=read_records), NOTHING
        return with_kept(self.plan, not self.opts.no_reuse, write=not self.opts.dry_run)


@dataclass
class Todo:
    """What the cells of a plan need now."""

    pending: list[RunSpec] = field(default_factory=list)  # to train or submit
    stale: list[RunSpec] = field(default_factory=list)  # --force on SLURM: waiting cells whose old results must go
    waiting: dict[str, list[str]] = field(default_factory=dict)  # pretraining run -> the cells waiting for it
    queued: int = 0


def problems(p: Plan, opts: Options, specs: Sequence[RunSpec]) -> tuple[dict, dict, list[RunSpec]]:
    """The preflight of every cell (options, data, batch split over the launcher's processes, checkpoints):
    ({message: cell names} that refuse the table, the same of warnings, the cells with their preflight's result)."""
    found: dict[str, list[str]] = {}
    warnings: dict[str, list[str]] = {}
    for prob in launcher_problems(specs[0].cfg):
        found.setdefault(prob.message, []).append("launcher")
    checked = []
    for c in specs:
        c = c.checked_by(preflight_checked(c.cfg, check_data=bool(c.cfg.launcher.get("check_data", True)),
                                           check_run_dir=not opts.force))
        checked.append(c)
        for prob in c.checked.problems:
            # a dry run is often made away from the data (a laptop, a login node): missing data is a warning
            target = warnings if (opts.dry_run and prob.kind == "data") else found
            target.setdefault(prob.message, []).append(c.name)
    return found, warnings, checked


def todo(p: Plan, opts: Options, specs: list[RunSpec], kept: Restored = NOTHING) -> Todo:
    """Skip finished cells (`kept.finished`: those a kept record makes finished, in a dry run that restores nothing)
    and cells whose SLURM job is still queued or running; link a cell not started yet to a finished run of its science
    config under another name (engine/twins.py) instead of training it; on a job array, fine-tuning cells wait for
    their pretraining run (a job array has no order). A cell whose committed record is unreadable and that has no
    finished run here (`kept.corrupt`, `blocked`) waits for --force."""
    from .engine.provenance import equivalent_hashes, fingerprint, source_files
    from .engine.twins import TwinIndex, link

    out = Todo()
    by_name = {c.name: c for c in p.cells}
    twins: dict[Path, TwinIndex] = {}
    n = len(specs)
    files, same = source_files(), equivalent_hashes()
    blocked = set() if opts.force else blocked_cells(kept)
    refresh = opts.refresh_stale
    for i, c in enumerate(specs, 1):
        if c.name in blocked:
            print(f"[reproduce] {i}/{n} {c.name}: not trained, its committed record is unreadable (said above)")
            continue
        if c.name in kept.finished and not RunRecord(c.run_dir).finished:  # a dry run: read, not restored
            # under --refresh-stale the kept record is judged as the restored run will be (the same rule)
            if refresh and (why := _kept_other_code(p, c, files, same)):
                print(f"[reproduce] {i}/{n} {c.name}: its kept record was {why}; would be retrained")
                out.pending.append(c)
                continue
            print(f"[reproduce] {i}/{n} {c.name}: finished (its kept record; restored by the real command), skipped")
            continue
        # a reused twin (a link) is only ever read: under --force, or when its run is no longer finished (the owner
        # retrained or removed it), the link goes and this cell trains in its own dir; the twin is never touched
        if c.run_dir.is_symlink() and (opts.force or not RunRecord(c.run_dir).finished) and not opts.dry_run:
            c.run_dir.unlink()
        status = RunRecord(c.run_dir).status
        code = fingerprint(files, str(c.cfg.conditioning.method))
        first_stage = p.needs(c.name)
        if first_stage and c.cfg.launcher.name in SUBMITIT_LAUNCHERS and \
                (opts.force or not RunRecord(by_name[first_stage].run_dir).finished):
            out.waiting.setdefault(first_stage, []).append(c.name)
            if opts.force:
                out.stale.append(c)
            out.queued += 1
            continue
        if opts.force:
            out.pending.append(c)
            continue
        if status == "finished" and refresh and (why := _other_code(c, files, same)):
            print(f"[reproduce] {i}/{n} {c.name}: {why}; {_refreshed(c.run_dir, opts.dry_run)}")
            out.pending.append(c)
            continue
        if status == "finished":
            if not opts.dry_run and not c.run_dir.is_symlink():  # a broken best_model.pt: as `train` repairs it
                repair_finished(c.run_dir, say=lambda m: print(f"[reproduce] {m}"))
            print(f"[reproduce] {i}/{n} {c.name}: finished earlier, skipped")
            continue
        if not c.run_dir.is_symlink() and not c.run_dir.exists() and not opts.no_reuse:
            index = twins.setdefault(c.run_dir.parent, TwinIndex(c.run_dir.parent))
            if (twin := index.find(c.cfg, c.run_dir, code if refresh else None)) is not None:
                if not opts.dry_run:
                    link(c.run_dir, twin)
                print(f"[reproduce] {i}/{n} {c.name}: the same science config finished as {twin.name}; "
                      f"{'would reuse' if opts.dry_run else 'reused (linked)'} it, not trained again (--no-reuse: "
                      "train it anyway)")
                continue
        if status == "corrupt":
            print(f"[reproduce] {i}/{n} {c.name}: summary.json is unreadable (corrupt or half-written); "
                  "treating the cell as unfinished")
        elif status == "failed":
            print(f"[reproduce] {i}/{n} {c.name}: failed earlier; running it again")
        if c.cfg.launcher.name == "slurm" and (job := active_job(c.run_dir)):
            print(f"[reproduce] {i}/{n} {c.name}: job {job} is still queued or running, skipped")
            out.queued += 1
            continue
        out.pending.append(c)
    return out


def blocked_cells(kept: Restored) -> set[str]:
    """The cells whose committed record is unreadable and that have no finished run here: neither trained nor put in
    the table until --force (FORCE=1) retrains them."""
    return {name for name, u in kept.corrupt.items() if not RunRecord(u.run_dir).finished}


def say_corrupt(kept: Restored, p: Plan, force: bool) -> None:
    """One line per unreadable committed record of the plan's cells: what it is, and what the command does about it."""
    for name, u in kept.corrupt.items():
        live, path = RunRecord(u.run_dir), u.record
        row = RunId.parse(name, p.exp.table, p.exp.rows, p.exp.methods, p.scale)
        put_back = f"put the committed file back (git checkout -- {path})"
        if force:
            then = "the cell is retrained (--force) and the record written anew"
        elif live.finished and (live.read_summary() or {}).get("restored_from"):
            then = f"{live.dir} holds the copy restored from it earlier, so the table is unchanged; {put_back}"
        elif live.finished:
            then = f"it is written again from the finished run {live.dir} when the table is"
        else:
            then = (f"its cell is not trained and the table not rewritten: {put_back}, or retrain the cell with FORCE=1"
                    + (f" ROWS={row.row} (the row's cells)" if row else ""))
        print(f"[reproduce] {path}, the committed record of {name}, is unreadable ({u.why}); {then}", file=sys.stderr)


def _other_code(c: RunSpec, files: dict, same: dict) -> str | None:
    """Why the finished run of a cell (its own, or a twin it links to) no longer answers for it under --refresh-stale,
    or None: a config that is not the cell's (`identity.answers`), else code other than this code
    (`engine.provenance.other_code`: the one rule of "same code", which the tables' code line reads too)."""
    from .engine.identity import answers, recorded_config
    from .engine.provenance import other_code

    if why := answers(c.cfg, recorded_config(c.run_dir)):
        return why
    stale = other_code((RunRecord(c.run_dir).summary or {}).get("code"), str(c.cfg.conditioning.method), files, same)
    return f"made by other code ({', '.join(stale)} differ from this code's)" if stale else None


def _kept_other_code(p: Plan, c: RunSpec, files: dict, same: dict) -> str | None:
    """`_other_code` for a cell a dry run finds finished only by its kept record (its own or a twin's, not restored):
    made by code other than this code (`engine.provenance.other_code`), or None."""
    from .engine.provenance import other_code
    from .table.store import Records

    summary = Records(p.scale).of(c.name, c.cfg, c.run_dir).summary or {}
    stale = other_code(summary.get("code"), str(c.cfg.conditioning.method), files, same)
    return f"made by other code ({', '.join(stale)} differ from this code's)" if stale else None


def _refreshed(run_dir: Path, dry_run: bool) -> str:
    """Make way for a cell's retraining under --refresh-stale: a link to a twin goes (the twin is never touched), a
    run of its own is set aside. What was done, said."""
    if run_dir.is_symlink():
        twin = run_dir.resolve().name
        if not dry_run:
            run_dir.unlink()
        return f"{'would be retrained' if dry_run else 'retrained'} in its own dir (the twin {twin} is kept as it is)"
    aside = _set_aside(run_dir, dry_run)
    return "would be retrained" if dry_run else f"retrained (the old run kept as {aside.name})"


def _set_aside(run_dir: Path, dry_run: bool) -> Path:
    """Move a finished run made by other code to `<dir>.stale-<n>` (kept, never deleted) so its cell trains again."""
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.stale-{n}")).exists():
        n += 1
    if not dry_run:
        run_dir.rename(aside)
    return aside


def _checked(p: Plan, opts: Options, specs: list[RunSpec], kept: Restored = NOTHING) -> Todo | None:
    """The preflight, then what the cells need, with the waiting and warnings said; None when a problem refuses."""
    found, warnings, specs = problems(p, opts, specs)
    t = todo(p, opts, specs, kept)
    for first_stage, names in t.waiting.items():
        print(f"[reproduce] {len(names)} cells ({names[0]} … {names[-1]}) wait for their pretraining run "
              f"{first_stage}; run the same command again (without --force) once it has finished")
    if p.waiting:
        grid = ", ×".join(f"{m:g}" for m in p.picks[p.waiting[0]].lrs)
        keys = ", ".join(sorted({p.picks[r].key for r in p.waiting}))
        rows = ", ".join(p.waiting) if len(p.waiting) <= 4 else f"{p.waiting[0]} … {p.waiting[-1]}"
        print(f"[reproduce] lr grid ×{grid} of each row's optim.lr: {len(p.waiting)} rows ({rows}) run their first "
              f"seed at each multiplier first, picked by validation ({keys}); their other seeds are planned once "
              "those runs have ended")
    if warnings:
        print("[reproduce] warnings (a real submission would refuse these):")
        print("\n".join(problem_report(warnings, len(specs))))
    if found:
        print("[reproduce] refused before starting any job:" + refusal(found, len(specs)), file=sys.stderr)
        return None
    return t


def _write_table(p: Plan, planner: Planner, kept: Restored, failed: list[str], force: bool = False) -> int:
    """The table (`report`), unless a cell's committed record is unreadable and no run here stands for it: then the
    committed table stays as it is until --force (one line, exit 1)."""
    if (blocked := blocked_cells(kept)) and not planner.opts.force:
        if n := keep_finished(p):  # the evidence of the runs there are is kept all the same
            print(kept_line(p, n))
        print(f"[reproduce] the table is not written: {len(blocked)} cell(s) have an unreadable committed record and "
              "no finished run here (said above); the committed table stays as it is")
        return 1
    from .reporting.tables import renderer_for  # the views, handed to the table wing from here (never imported there)

    def render(plan: Plan):  # the experiment's own renderer (`renderer: module:function`), else the generic one
        return renderer_for(plan.exp)(plan)

    return report(planner.full() if planner.opts.only_rows else p, failed, render, force=force)


def _submit(p: Plan, planner: Planner, t: Todo, kept: Restored) -> int:
    """The SLURM path (slurm, submitit_local): one job array of the pending cells."""
    from .launch import submit

    opts = planner.opts
    launcher = p.cells[0].cfg.launcher
    if opts.dry_run and t.pending:
        print("\n".join(p.cost(t.pending)))
    if not t.pending:
        print("[reproduce] nothing to submit: every cell is finished or queued"
              + (f", or waits for its lr grid ({', '.join(p.waiting)})" if p.waiting else ""))
        if t.queued or p.waiting:
            print(f"[reproduce] {t.queued} cells are still queued or running; run the same command again once they "
                  f"end (lr grids: their stage 2), then `make report-table-N SCALE={opts.scale}` writes the table")
            return 0
        return 0 if opts.dry_run else _write_table(p, planner, kept, [])
    if opts.force and not opts.dry_run:
        for c in [*t.pending, *t.stale]:  # a requeued job must resume, never wipe: clear the run dirs now instead
            shutil.rmtree(c.run_dir, ignore_errors=True)
    with StopFlag() as stop:
        failed = submit(t.pending, launcher, p.exp.table, opts.scale, dry_run=opts.dry_run, stop=stop)
    if opts.dry_run or (launcher.name == "slurm" and not launcher.get("wait")):
        return 0
    return _write_table(p, planner, kept, failed)


def _dry_run(p: Plan, t: Todo) -> int:
    """What a local run would train, its cost on the launcher's GPU and, measured, on this machine; nothing written."""
    from .engine.cost import machine_projection

    if t.pending:
        print("\n".join(p.cost(t.pending)))
        print(machine_projection([(c.name, c.cfg) for c in t.pending], [p.runs_root / p.scale,
                                                                       p.results_root / p.scale / "runs"]))
    print(f"[reproduce] dry run: {len(t.pending)} of {len(p.cells)} cells would train here, one after another "
          "(launcher=local)" + (f"; then the other seeds of {len(p.waiting)} rows at their lr pick"
                                if p.waiting else ""))
    for c in t.pending:
        print(f"  {c.name} -> {c.run_dir}")
    return 0


def _local(p: Plan, planner: Planner, t: Todo, kept: Restored) -> int:
    """Train the pending cells here, one after another; with lr grids, plan again once a stage has run and train
    what the picks add (each cell at most once per command)."""
    from .launch import run_local

    opts = planner.opts
    if opts.dry_run:
        return _dry_run(p, t)
    attempted: set[str] = set()
    failed: list[str] = []
    pending = t.pending
    res = None
    while True:
        attempted |= {c.name for c in pending}
        if pending or res is None:  # the first stage always says what it trained, "0 of 0" included
            res = run_local(pending, p.exp.metric, force=opts.force,
                            needs=p.needs)
            failed += res.failed
            if res.interrupted:
                break
        if not (p.waiting or length_check(p.exp, opts.scale)):
            break
        # a stage has ended (trained now, finished earlier or linked to another table's twin runs): the picks add the
        # rows' other seeds, the verdicts the length check; stop once a plan adds no cell
        planned = {c.name for c in p.cells}
        p, kept = planner.with_kept()
        if not (new := [c for c in p.cells if c.name not in planned]):
            break
        if (t := _checked(p, opts, new, kept)) is None:
            return 2
        pending = [c for c in t.pending if c.name not in attempted]
    code = _write_table(p, planner, kept, failed)
    if res is not None and res.interrupted:
        again = ("rerun the same command without FORCE=1 (--force) to finish the missing ones: with it, the "
                 "interrupted cells would start over from step 0" if opts.force else
                 "rerun the same command to finish the missing ones")
        print(f"[reproduce] stopped: {len(res.failed)} cell(s) interrupted or failed, {len(res.not_started)} not "
              f"started. Finished cells are kept; {again} (interrupted cells resume from their checkpoint).")
        return 3
    return code


def _say_made(p: Plan) -> None:
    if made := p.made_with:
        print(f"[reproduce] {' '.join(made.overrides)} changes {', '.join(made.methods)}: the table is written "
              f"as {p.output_stem}.md, beside the default one")
    for line in p.unreached:
        print(f"[reproduce] warning: {line}")


def _run(planner: Planner) -> int:
    opts = planner.opts
    # --force retrains: stage 1 of an lr grid runs again before anything picks (with --report-only it only means
    # "write the table anyway", and the picks are read from the runs as always)
    p, kept = planner.with_kept(read_records=not (opts.force and not opts.report_only))
    if opts.status:  # queued / running / failed / finished per cell (launch.status_lines)
        from .launch import status_lines

        print(f"[reproduce] {p.exp.table} at scale {opts.scale}: {len(p.cells)} cells")
        print("\n".join(status_lines(p.cells)))
        return 0
    say_corrupt(kept, p, opts.force)
    if opts.report_only:
        _say_made(p)
        return _write_table(p, planner, kept, [], force=opts.force)
    if (t := _checked(p, opts, p.cells, kept)) is None:
        return 2
    _say_made(p)
    if p.cells[0].cfg.launcher.name in SUBMITIT_LAUNCHERS:
        return _submit(p, planner, t, kept)
    return _local(p, planner, t, kept)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.reproduce", description=__doc__.splitlines()[0])
    p.add_argument("experiment", help="experiments/tableN_*.yaml")
    p.add_argument("--scale", default="smoke", help="smoke | small | medium | paper")
    p.add_argument("--seeds", help='e.g. "0 1 2" or 0,1,2; default: the experiment\'s seeds for this scale')
    p.add_argument("--launcher", default="local", help=f"one of {', '.join(LAUNCHERS)}")
    p.add_argument("--dry-run", action="store_true",
                   help="validate every cell and print the jobs (and the exact sbatch script) without running")
    p.add_argument("--force", action="store_true", help="rerun finished cells from scratch")
    p.add_argument("--no-reuse", action="store_true", help="train every cell in its own run dir, even when a finished "
                   "run of another table has the same science config (by default it is linked and reused)")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table from existing runs")
    p.add_argument("--refresh-stale", action="store_true", help="retrain exactly the finished cells whose code "
                   "fingerprint (conditioning, model, task, engine) differs from HEAD's; the old runs are kept beside "
                   "them as <run>.stale-<n>")
    p.add_argument("--status", action="store_true", help="list each cell as queued, running, failed or finished (run "
                   "records, and squeue/sacct for SLURM jobs); trains nothing")
    p.add_argument("--rows", help='train only these rows, e.g. "listops" or "vit_*,listops_cet*" (shell globs); the '
                   "table is still written with every row, from the runs there are. Two processes of one command "
                   "already share its cells (each skips the cell the other trains); --rows splits them by hand")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell (e.g. impl.threads=2)")
    args = p.parse_intermixed_args(argv)

    try:
        exp = load(args.experiment)
    except (FileNotFoundError, ValueError) as e:
        print(f"[reproduce] {e}", file=sys.stderr)
        return 2
    if args.scale not in exp.scales:
        p.error(f"--scale {args.scale!r} is not defined in {args.experiment}; choose one of {list(exp.scales)}")
    if args.launcher not in LAUNCHERS:
        p.error(f"--launcher {args.launcher!r} is not available; choose one of {list(LAUNCHERS)}")
    seeds = list(exp.at(args.scale).seeds)
    try:
        seeds = [int(x) for x in args.seeds.replace(",", " ").split()] if args.seeds else seeds
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: give integers, e.g. --seeds \"0 1 2\"")
    try:
        only_rows = select_rows(exp, args.scale, args.rows.replace(",", " ").split()) if args.rows else None
    except ValueError as e:
        p.error(str(e))
    overrides = list(args.overrides)
    early = seed_problems(seeds) + ([] if args.status else [  # before the plan reads or writes a run
        *early_problems(overrides), *table_override_problems(overrides, args.experiment, list(exp.methods),
                                                             args.launcher)])
    if early:
        print("[reproduce] refused before starting any job: " + "; ".join(early), file=sys.stderr)
        return 2
    # a part of the table (--rows) or other seeds: written beside the full one (table9_readings.rows-vit_.md)
    stem = f"{exp.table}.rows-{rows_slug(args.rows)}" if args.rows else exp.table
    if seeds != list(exp.at(args.scale).seeds):  # other seeds: another table, never over the default one
        stem = f"{stem}.seeds-{'+'.join(map(str, seeds))}"
        print(f"[reproduce] seeds {' '.join(map(str, seeds))} are not the experiment's "
              f"({' '.join(map(str, exp.at(args.scale).seeds))}): the table is written as {stem}.md, beside the "
              "default one")
    opts = Options(args.scale, args.launcher, args.dry_run, args.force, args.no_reuse, args.report_only,
                   args.refresh_stale, args.status, tuple(only_rows) if only_rows is not None else None,
                   tuple(overrides))
    try:
        return _run(Planner(exp, tuple(seeds), stem, opts))
    except ConfigError as e:
        msg = str(e)
        print(f"[reproduce] refused before starting any job:{'' if msg.startswith(chr(10)) else ' '}{msg}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
