"""`make reproduce-all SCALE=small [DRY_RUN=1]`: every table that defines the scale, in one resumable command.

Before anything trains it prints each table's projected cost on this machine: the cells still to run (finished ones
and kept records count as done), the seeds the lr picks will add, and at most the length check's runs, each at the
seconds per step that finished runs of the same model, data and method took (their summaries' wall time, wherever
they ran; a method not measured yet takes its model and data's; a recipe no run has measured is counted, not
guessed). `--dry-run` prints only that. Then it runs `reproduce` per table,
in order; a table that fails does not stop the others, and running the command again finishes only what is missing.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .engine.cost import measured_steps, recipe, run_seconds
from .experiment import load
from .runs import RunId, RunRecord

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def tables(scale: str, root: Path = EXPERIMENTS) -> list[Path]:
    """The experiment files that define `scale`, in table order."""
    files = sorted(root.glob("table*.yaml"), key=lambda f: int(re.match(r"table(\d+)", f.name).group(1)))
    return [f for f in files if scale in load(f).scales]


def measured(dirs: list[Path]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(seconds per training step, a run's fixed seconds: its wall time outside the steps) by recipe, the medians over
    the finished runs under `dirs` (run roots and kept records), wherever they ran; (model, data, "*"): over every
    method, for a method not measured yet (engine/cost.measured_steps)."""
    return {k: (v[0], v[1]) for k, v in measured_steps(dirs).items()}


@dataclass
class Projection:
    """A table's cells still to train and their projected seconds (None: no finished run of the recipe measures it)."""

    table: str
    cells: int = 0
    finished: int = 0
    reused: int = 0  # of the finished: another table's runs of the same science config and code (twins)
    now: list[float | None] = field(default_factory=list)  # planned now: stage 1, or every cell without an lr grid
    after_picks: list[float | None] = field(default_factory=list)  # the seeds the lr picks will add
    length: list[float | None] = field(default_factory=list)  # at most: the length check's runs not planned yet

    @staticmethod
    def hours(xs: list[float | None]) -> str:
        known = [x for x in xs if x is not None]
        unmeasured = f", {len(xs) - len(known)} unmeasured" if len(known) < len(xs) else ""
        return f"{len(xs)} runs ({sum(known) / 3600:.1f} h{unmeasured})"

    def line(self) -> str:
        parts = [f"{self.hours(self.now)} now"]
        if self.after_picks:
            parts.append(f"{self.hours(self.after_picks)} after the lr picks")
        if self.length:
            parts.append(f"at most {self.hours(self.length)} for the length check")
        reused = f" ({self.reused} as another table's twin runs)" if self.reused else ""
        return (f"  {self.table}: {self.cells} cells planned, {self.finished} finished{reused}; "
                f"to train: {' + '.join(parts)}")

    @property
    def seconds(self) -> float:
        return sum(x for x in [*self.now, *self.after_picks, *self.length] if x is not None)

    @property
    def unmeasured(self) -> int:
        return sum(x is None for x in [*self.now, *self.after_picks, *self.length])


def project(p, step_s: dict, kept=None) -> Projection:
    """The projection of one table's plan; a finished cell counts as finished, and so does one a kept record makes
    finished (`kept`, table/kept.Restored: restored, or in a dry run only read) and one that `reproduce` will link to a
    finished twin (the same science config under another name: engine/twins.py)."""
    from .engine.twins import TwinIndex
    from .reproduce import length_check

    exp, scale, seeds = p.exp, p.scale, list(p.seeds)
    out = Projection(exp.table, cells=len(p.cells))

    def cost(cfg, factor: int = 1) -> float | None:
        if cfg is None:
            return None
        model, data, method = recipe(cfg)
        s = step_s.get((model, data, method), step_s.get((model, data, "*")))
        return None if s is None else run_seconds(s[0], s[1], factor * int(cfg.task.steps))

    twins = [TwinIndex(d) for d in {c.run_dir.parent for c in p.cells[:1]}]
    first: dict[tuple[str, str], object] = {}  # each (row, method)'s first planned cell config: recipe and steps
    for c in p.cells:
        run = RunId.parse(c.name, exp.table, exp.rows, exp.methods, scale)
        if run is not None:
            first.setdefault((run.row, run.method), c.cfg)
        if RunRecord(c.run_dir).finished or (kept is not None and c.name in kept.finished):
            out.finished += 1
            out.reused += c.run_dir.is_symlink() or (kept is not None and c.name in kept.twins)
        elif not c.run_dir.exists() and any(t.find(c.cfg, c.run_dir) for t in twins):
            out.finished += 1
            out.reused += 1
        else:
            out.now.append(cost(c.cfg))

    def row_method(key: str) -> tuple[str, str]:  # a pick key: "<row>/<method>", or a reading's "<row>"
        row, _, method = key.partition("/")
        return row, method or exp.methods_of(row)[0]

    for key in p.waiting:
        row, method = row_method(key)
        out.after_picks += [cost(first.get((row, method)))] * len(exp.row_seeds(scale, row, seeds))
    if check := length_check(exp, scale):
        factor, n = check
        planned = set(p.longer)
        for fam in exp.families(scale).values():
            base = RunId(exp.table, *fam[0], scale, 0).name.rsplit("_s", 1)[0]
            if any(name.rsplit("_s", 1)[0] == base for name in planned):
                continue  # this family's length runs are planned: they are among the cells above
            for row, method in [fam[0], *(rm for rm in fam[1:] if exp.hypothesis(rm[0]) == "primary")]:
                k = min(n, len(exp.row_seeds(scale, row, seeds)))
                out.length += [cost(first.get((row, method)), factor)] * k
    return out


def main(argv: list[str] | None = None) -> int:
    from .launch import ConfigError
    from .reproduce import main as reproduce
    from .reproduce import plan, with_kept

    ap = argparse.ArgumentParser(prog="python -m condattn.reproduce_all", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="small")
    ap.add_argument("--dry-run", action="store_true", help="print the projected cost only; train nothing")
    ap.add_argument("--experiments", type=Path, default=EXPERIMENTS, help="the folder of the experiment files")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell of every table")
    args = ap.parse_args(argv)
    files = tables(args.scale, args.experiments)
    if not files:
        ap.error(f"no experiment under {args.experiments} defines --scale {args.scale!r}")
    if early := _refusals(files, list(args.overrides)):
        print("[reproduce-all] refused before starting any job: " + "; ".join(early), file=sys.stderr)
        return 2
    plans = []
    for f in files:
        exp = load(f)
        def make_plan(exp=exp):
            return plan(exp, args.scale, list(exp.at(args.scale).seeds), list(args.overrides))

        try:  # a dry run reads the kept records without restoring them: it writes nothing
            plans.append(with_kept(make_plan, write=not args.dry_run))
        except ConfigError as e:
            print(f"[reproduce-all] {f.name}: refused before starting any job: {str(e).strip()}", file=sys.stderr)
            return 2
    roots = {d for p, _ in plans if p.cells
             for d in (p.cells[0].run_dir.parent, p.results_root / args.scale / "runs")}
    step_s = measured(sorted(roots))
    proj = [project(p, step_s, kept) for p, kept in plans]
    print(f"[reproduce-all] scale {args.scale}: {len(files)} tables; projected cost on this machine, one run after "
          "another (seconds per step measured by finished runs of the same model, data and method):")
    print("\n".join(x.line() for x in proj))
    total, unmeasured = sum(x.seconds for x in proj), sum(x.unmeasured for x in proj)
    print(f"[reproduce-all] total ≈ {total / 3600:.1f} h" + (f", plus {unmeasured} runs of recipes no finished run has "
                                                             "measured yet" if unmeasured else ""))
    if args.dry_run:
        return 0
    failed = []
    for f in files:
        print(f"[reproduce-all] {f.name}", flush=True)
        if (code := reproduce([str(f), "--scale", args.scale, *args.overrides])) != 0:
            failed.append(f"{f.name} (exit {code})")
        if code == 3:  # stopped (Ctrl-C, SIGTERM): the running cell checkpointed; the other tables wait too
            print("[reproduce-all] stopped; run the same command again to go on")
            return 3
    print("[reproduce-all] done" + (f"; not complete: {', '.join(failed)} (run the same command again to finish what "
                                    "is missing)" if failed else ": every table written"))
    return 1 if failed else 0


def _refusals(files: list[Path], overrides: list[str]) -> list[str]:
    """The checks `reproduce` makes before its plan (checks.early_problems, table_override_problems), every table's."""
    from .checks import early_problems, table_override_problems

    methods = sorted({m for f in files for m in load(f).methods})
    return early_problems(overrides) + table_override_problems(overrides, "each table's experiment file (experiments/)",
                                                               methods)


if __name__ == "__main__":
    sys.exit(main())
