"""A table's plan: every cell composed and named, its lr picks and length runs, read from the runs and the kept records
(no side effects)."""

from __future__ import annotations

from pathlib import Path

from ..engine.identity import is_science_key
from ..experiment import Experiment
from ..launch import ConfigError, RunSpec
from ..runs import RunId
from .cells import Part, override_slug, parts
from .compose import Composer, named, reached
from .length import length_cells, length_check
from .lr_grid import LrPick, grid_row, lr_grid
from .planned import MadeWith, Plan
from .store import Records

__all__ = ["Plan", "plan", "problem_report", "refusal"]


def plan(exp: Experiment, scale: str, seeds: list[int], extra: list[str], launcher: str = "local",
         only_rows: list[str] | None = None, read_records: bool = True, full: bool = True, reuse: bool = True,
         stem: str = "") -> Plan:
    """Every cell of the table at this scale, composed and named, without side effects (it reads run records, writes
    nothing). With an lr grid, a row's other seeds are planned once its stage-1 runs have ended (`read_records`
    False, as under --force: none has). The cells of rows outside `only_rows` are planned too when `full` (their
    variants and picks name the runs the table shows) but never returned to train; a plan that only trains
    (`full=False`) skips them, unless the scale has a length check: its verdicts read every primary row's runs, so a
    `--rows` process trains its rows' length runs too. ConfigError: the overrides that do not compose
    (one message each), an optim.lr override beside an lr grid, cells that would share a run dir. `stem`: the output
    file's name (default: the table's); science overrides among `extra` name the table after them."""
    grid = lr_grid(exp, scale)
    full = full or bool(grid and length_check(exp, scale) and read_records)
    if grid and (bad := [o for o in extra if o.split("=", 1)[0].lstrip("+~") == "optim.lr"]):
        raise ConfigError(f"{bad[0]} conflicts with scales.{scale}.lr_grid, which sets every row's lr (multiples of "
                          "its optim.lr): drop the override, or change the row's optim.lr in the experiment")
    comp, renamed, shown, records = Composer(), {}, {}, Records(scale, reuse)
    planned: list[tuple[Part, RunSpec]] = []
    picks: dict[str, LrPick] = {}
    groups: dict[tuple, list[Part]] = {}
    for p in parts(exp, scale, seeds, launcher):
        groups.setdefault((p.name,) if p.pretrain else (p.row, p.method), []).append(p)
    reported: dict[tuple, list[tuple[Part, RunSpec]]] = {}
    changed: set[str] = set()
    reach: set[str] = set()  # the extra overrides that change some cell
    every_group = True
    for group in groups.values():
        if not full and only_rows is not None and not group[0].pretrain and group[0].row not in only_rows:
            every_group = False
            continue
        if extra and (hit := reached(comp, group[0], extra)):
            reach |= hit
            if not group[0].pretrain:
                changed.add(group[0].method)
        if grid and not group[0].pretrain:
            row_cells, pick, variants = grid_row(comp, group, grid, extra, exp, scale, read_records, renamed, records)
            planned += row_cells
            shown.update(variants)
            renamed.update(_renames(row_cells))
            if pick is not None:
                picks[exp.pick_key(group[0].row, group[0].method)] = pick
                reported[(group[0].row, group[0].method)] = [(p, c) for p, c in row_cells if p in group]
            continue
        for part in group:
            spec, shown[part.name] = named(comp, part, list(extra), renamed)
            if spec is not None:
                planned.append((part, spec))
                renamed.update(_renames([(part, spec)]))
    longer: dict[str, str] = {}
    if grid and length_check(exp, scale) and read_records and not comp.errors:
        long_cells, longer = length_cells(comp, exp, scale, reported, picks, extra, renamed, records)
        planned += long_cells
    if comp.errors:
        errors, n = comp.errors, comp.n
        if only_rows:  # report the rows asked for (`--rows`): the others are composed for their picks only
            def asked(name: str) -> bool:
                run = RunId.parse(name, exp.table, exp.rows, exp.methods, scale)
                return run is None or run.row in only_rows
            kept = {m: [x for x in names if asked(x)] for m, names in errors.items()}
            n = sum(1 for p in parts(exp, scale, seeds, launcher) if p.row in only_rows) or n
            errors = {m: names for m, names in kept.items() if names} or errors
        raise ConfigError(refusal(errors, n).lstrip(" "))
    _check_shared_dirs([spec for _, spec in planned])
    made = MadeWith(tuple(o for o in extra if is_science_key(o.split("=", 1)[0].lstrip("+~"))),
                    tuple(sorted(changed))) if changed else None
    stem = stem or exp.table
    if made:  # a table of other science than the file's: named by it, never over the default
        stem = f"{stem}.{override_slug(list(made.overrides))}"
    todo = [spec for part, spec in planned if part.pretrain or only_rows is None or part.row in only_rows]
    first = planned[0][1].cfg
    unreached = tuple(unreached_line(o, exp) for o in extra if o not in reach and
                      is_science_key(o.split("=", 1)[0].lstrip("+~"))) if every_group else ()
    return Plan(exp, scale, tuple(seeds), Path(first.paths.runs), Path(first.paths.results), tuple(todo),
                tuple(spec.name for _, spec in planned), picks, {name: v for name, v in shown.items() if v},
                longer, made, stem, unreached)


def _renames(cells: list[tuple[Part, RunSpec]]) -> dict[str, str]:
    """{readable name: variant name} of the cells named after a variant (a renamed pretraining run's fine-tuning
    cells follow it, compose.named)."""
    return {part.name: spec.name for part, spec in cells if spec.name != part.name}


def unreached_line(override: str, exp: Experiment) -> str:
    """What an override that changes no cell of the table does: nothing (the cells keep their names and runs)."""
    from ..conditioning.spec import option_owners

    key = override.split("=", 1)[0].lstrip("+~")
    why = "every cell has that value already, or does not read it"
    if key.startswith("conditioning."):
        owners = [m.name for m in option_owners(key.partition(".")[2])]
        used = f" (an option of {', '.join(owners)})" if owners else ""
        why = (f"none of its methods ({', '.join(exp.methods)}) uses {key}{used}, or every cell that does has that "
               "value already")
    return (f"{override} reaches no cell of {exp.table}: {why}; the cells, their names and their runs are as without "
            "it")



def _check_shared_dirs(specs: list[RunSpec]) -> None:
    by_dir: dict[str, list[str]] = {}
    for c in specs:
        by_dir.setdefault(str(c.run_dir), []).append(c.name)
    shared = {d: names for d, names in by_dir.items() if len(names) > 1}
    if shared:  # e.g. an extra run.name= override: the cells would overwrite each other's runs
        d, names = next(iter(shared.items()))
        raise ConfigError(f"{len(names)} cells ({', '.join(names[:3])}{', …' if len(names) > 3 else ''}) would share "
                          f"the run dir {d}; do not override run.name or run.dir for a whole table")



def problem_report(problems: dict[str, list[str]], n_cells: int) -> list[str]:
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



def refusal(problems: dict[str, list[str]], n_cells: int) -> str:
    """What follows "refused before starting any job:": one problem on the same line, several one per line."""
    lines = problem_report(problems, n_cells)
    return " " + lines[0][4:] if len(lines) == 1 else "\n" + "\n".join(lines)

