"""The length check: the baseline and every primary row with a verdict run again at factor × their steps."""

from __future__ import annotations

from collections.abc import Mapping

from ..experiment import Experiment
from ..launch import RunSpec
from ..runs import variant_of
from ..stats import Outcome, verdicts
from .cells import Part
from .compose import Composer, named
from .lr_grid import LrPick, lr_variant
from .store import Records


def length_check(exp: Experiment, scale: str) -> tuple[int, int] | None:
    """The scale's `length_check: {factor: 2, seeds: 5}`: the baseline and every primary row with a verdict run again
    at factor × their steps, on their `seeds` lowest reported seeds, at their lr pick. None without one."""
    spec = exp.at(scale).length_check  # validated when the file was parsed
    return (spec.factor, spec.seeds) if spec else None



def finished_values(exp: Experiment, scale: str, row: str, specs: list[RunSpec],
                    records: Records) -> list[float] | None:
    """The reported metric of the finished runs of a group once every one of them has ended (a failed run counts as
    ended, and is left out), or None while any is still to run."""
    key = exp.row_metric(scale, row)
    vals = []
    for c in specs:
        rec = records.of(c.name, c.cfg, c.run_dir)
        s = rec.summary
        if s is None or key not in s["metrics"]:
            if rec.status == "failed":
                continue
            return None
        vals.append(float(s["metrics"][key]))
    return vals



def length_cells(comp: Composer, exp: Experiment, scale: str, reported: Mapping[tuple, list[tuple[Part, RunSpec]]],
                 picks: Mapping[str, LrPick], extra: list[str], renamed: Mapping[str, str],
                 records: Records) -> tuple[list[tuple[Part, RunSpec]], dict[str, str]]:
    """The runs at factor × steps of each family whose baseline and primary rows have all finished: the baseline and
    every primary row whose adjusted p < 0.05 (the same tests the table prints), with their variants by the readable
    name of the run at 1× steps."""
    factor, n = length_check(exp, scale) or (0, 0)
    out: list[tuple[Part, RunSpec]] = []
    longer: dict[str, str] = {}
    for fam in exp.families(scale).values():
        groups = {rm: reported.get(rm) for rm in fam}
        primary = [rm for rm in fam[1:] if exp.hypothesis(rm[0]) == "primary"]
        values = {rm: finished_values(exp, scale, rm[0], [c for _, c in groups[rm] or []], records)
                  for rm in [fam[0], *primary]}
        if any(not v for v in values.values()):
            continue
        found = verdicts(values[fam[0]], [(rm, values[rm], "primary") for rm in primary],
                         exp.higher_is_better_for(fam[0][0]))
        for rm in [fam[0], *(rm for rm in primary if found[rm].outcome in (Outcome.BETTER, Outcome.WORSE))]:
            pick = picks[exp.pick_key(*rm)]
            for part, spec in sorted(groups[rm] or [], key=lambda pc: pc[0].seed)[:n]:  # the n lowest, any order
                tail = (*lr_variant(pick.base_lr, pick.pick)[0], f"task.steps={factor * int(spec.cfg.task.steps)}")
                long_spec, v = named(comp, part, extra, renamed, tail, variant_of(pick.pick, factor))
                if long_spec is not None:
                    out.append((part, long_spec))
                    longer[part.name] = v
    return out, longer

