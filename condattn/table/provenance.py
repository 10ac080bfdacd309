"""Where a table's numbers come from, as facts read once from its runs' summaries: the scale and data, the seeds, the
commits (with run counts and what they do not say alone), each cell's code fingerprints, the hardware and threads,
how many runs and what they cost (wall time summed, mean and median; GPU-hours; everything the plan trained so far),
and when it was written. `TableResult.provenance` holds it; the views (reporting/) only format it."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import TYPE_CHECKING

from ..engine.provenance import equivalent_hashes, other_code, run_method, source_files
from ..engine.twins import made_elsewhere
from ..runs import RunRecord

if TYPE_CHECKING:
    from .observed import TableCell
    from .planned import Plan


class Data(Enum):
    """What the runs trained on."""

    NONE = "none"  # no finished run yet
    STAND_IN = "stand-in"  # offline stand-in data (not comparable with the papers)
    REDUCED = "reduced"  # real data at reduced size (medium scale)
    PAPERS = "papers"  # the papers' datasets


@dataclass(frozen=True)
class Walls:
    """The measured wall time (s) of a group of finished runs: how many, summed, mean and median (None without runs)."""

    runs: int
    sum_s: float
    mean_s: float | None
    median_s: float | None


@dataclass(frozen=True)
class CellCode:
    """One cell's code: the fingerprints its runs recorded (one token each, 'unrecorded' before fingerprints) and the
    parts of the code that differ between its runs ('unrecorded' when some runs have none)."""

    row: str
    method: str
    codes: tuple[str, ...]
    mixed: tuple[str, ...]
    # against the code the table was rendered with (engine/provenance.other_code, the rule STALE=1 applies): the parts
    # in which some of its runs' code differs, and how many of its runs that is (0: every run is current)
    other: tuple[str, ...] = ()
    other_runs: int = 0


@dataclass(frozen=True)
class Spent:
    """Every run the plan trained (selection, reported and length runs): those made for this table, their wall time
    summed, and the runs another table made (reused twins, engine/twins.py) by that table."""

    runs: int
    wall_s: float
    reused: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Provenance:
    scale: str
    data: Data
    seeds: tuple[int, ...]
    commits: tuple[tuple[str, int], ...]  # commit ('unknown' when unrecorded) → runs, by commit
    commit_states: tuple[tuple[str, int], ...]  # runs from code not on main (uncommitted changes, a branch) by state
    aliased: tuple[tuple[str, str, int], ...]  # (recorded commit that never landed, landed commit of its code, runs)
    hardware: tuple[str, ...]
    threads: tuple[int | None, ...]  # torch threads (None: unrecorded)
    cpu_capabilities: tuple[str, ...]
    runs: int  # finished runs shown
    reused: tuple[tuple[str, int], ...]  # of them made for another table (the same science config), by that table
    gpu_hours: float  # wall time × processes of the runs on CUDA devices
    gpu_runs: int
    validation: tuple[tuple[str, tuple[str, ...]], ...]  # how a validation split was made → the rows (data.val_source)
    walls: Walls
    walls_by: tuple[tuple[str, Walls], ...]  # by family (one per row, or per task for table 9), families with runs
    code: tuple[CellCode, ...]
    spent: Spent | None  # None: not read (no trained runs)
    written_at: str  # ISO 8601, UTC, to the minute
    # every run the plan trained (selection, reported and length runs) made by code other than the code the table was
    # rendered with (engine/provenance.other_code: what STALE=1 retrains), of how many checked
    other_code_runs: int = 0
    code_checked: int = 0


def code_text(summary: Mapping) -> str:
    """A run's code fingerprint as one token: 'conditioning=ab12…,model=…' ('unrecorded' before fingerprints)."""
    code = summary.get("code")
    return ",".join(f"{k}={v}" for k, v in sorted(code.items())) if code else "unrecorded"


def _mixed(sums: list[Mapping], same: Mapping[str, Mapping[str, str]]) -> tuple[str, ...]:
    """The code parts whose fingerprint differs between these runs, and 'unrecorded' when only some recorded one.
    Two fingerprints of a part shown to compute the same (`same`: engine/provenance.equivalent_hashes, from
    results/code_equivalence.json) do not differ; the cell's `codes` still lists both."""
    codes = [s.get("code") or {} for s in sums]

    def rep(part: str, h: str | None) -> str | None:
        return same.get(part, {}).get(h, h) if h is not None else None

    parts = sorted({k for c in codes for k in c if len({rep(k, (x or {}).get(k)) for x in codes}) > 1})
    if any(not c for c in codes) and len({bool(c) for c in codes}) > 1:
        parts.append("unrecorded")
    return tuple(parts)


class _Current:
    """`other_code` over many runs, reading the code on disk once: {run: the parts its code differs in}."""

    def __init__(self, same: Mapping) -> None:
        self.files, self.same = source_files(), same

    def parts(self, summary: Mapping) -> list[str]:
        return other_code(summary.get("code"), run_method(summary), self.files, self.same)  # type: ignore[arg-type]

    def cell(self, sums: list[Mapping]) -> tuple[tuple[str, ...], int]:
        found = [self.parts(s) for s in sums]
        return tuple(sorted({p for f in found for p in f})), sum(bool(f) for f in found)


def walls_of(walls: Iterable[float]) -> Walls:
    ws = [float(w) for w in walls]
    return Walls(len(ws), sum(ws), statistics.fmean(ws) if ws else None, statistics.median(ws) if ws else None)


def _data(sums: list[Mapping], scale: str) -> Data:
    if not sums:
        return Data.NONE
    if any((s.get("data") or {}).get("stand_in") for s in sums):
        return Data.STAND_IN
    return Data.REDUCED if scale == "medium" else Data.PAPERS


def _validation(cells: Mapping) -> tuple[tuple[str, tuple[str, ...]], ...]:
    by_how: dict[str, list[str]] = {}
    for key, cell in cells.items():  # (row, method), or a row
        row = key[0] if isinstance(key, tuple) else key
        for s in cell.summaries:
            how = (s.get("data") or {}).get("validation")
            if how and row not in by_how.setdefault(how, []):
                by_how[how].append(row)
    return tuple((how, tuple(rows)) for how, rows in sorted(by_how.items()))


def _commits(sums: list[Mapping]) -> tuple[tuple, tuple, tuple]:
    commits = Counter(s.get("commit", "unknown") for s in sums)
    states = Counter(s["commit_state"] for s in sums if s.get("commit_state") not in (None, "on main"))
    aliased = Counter((s["commit_recorded"], s["commit"]) for s in sums if s.get("commit_recorded"))
    return (tuple(sorted(commits.items())), tuple(sorted(states.items())),
            tuple((rec, real, n) for (rec, real), n in sorted(aliased.items())))


def _threads(sums: list[Mapping]) -> tuple[int | None, ...]:
    got = {(s.get("hardware") or {}).get("torch_threads") for s in sums}
    return tuple(sorted((None if t is None else int(t) for t in got), key=lambda t: (t is None, t or 0)))


def _gpu(sums: list[Mapping]) -> tuple[float, int]:
    gpu = [s for s in sums if (s.get("hardware") or {}).get("device_type") == "cuda"]
    return sum(float(s.get("wall_time_s") or 0) * int(s["hardware"].get("num_processes") or 1) for s in gpu) / 3600, \
        len(gpu)


def trained(plan: Plan) -> list[dict]:
    """The summaries of every finished run the table's plan trains (`plan.planned`: selection, reported and length
    runs, grid extensions included)."""
    return [s for name in plan.planned if (s := RunRecord(plan.runs_root / plan.scale / name).summary) is not None]


def spent(done: list[Mapping], table: str) -> Spent | None:
    """What the runs `done` (`trained()`) cost this table: its own runs and their wall time, and those reused."""
    if not done:
        return None
    own = [s for s in done if not made_elsewhere([s], table)]
    reused = made_elsewhere(done, table)
    return Spent(len(own), sum(float(s.get("wall_time_s") or 0.0) for s in own), tuple(sorted(reused.items())))


def provenance(plan: Plan, cells: Mapping[tuple[str, str], TableCell], done: list[Mapping] | None = None,
               now: datetime | None = None) -> Provenance:
    """The provenance of the table `plan` shows from `cells` (its runs at 1×), `done`: every run the plan trained
    (`trained(plan)`, read when None), `now`: the write time (default: now)."""
    exp, scale = plan.exp, plan.scale
    sums = [s for c in cells.values() for s in c.summaries]
    family = {rm: name for name, members in exp.families(scale).items() for rm in members}
    by: dict[str, list[float]] = {}
    for key, c in cells.items():
        if c.wall:
            by.setdefault(family.get(key, key[0] if isinstance(key, tuple) else key), []).extend(c.wall)
    commits, states, aliased = _commits(sums)
    same = equivalent_hashes()
    now_code = _Current(same)
    done = trained(plan) if done is None else done
    gpu_hours, gpu_runs = _gpu(sums)
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(second=0, microsecond=0)
    return Provenance(
        scale, _data(sums, scale), tuple(sorted({sd for c in cells.values() for sd in c.seeds})), commits, states,
        aliased, tuple(sorted({s.get("hardware_line", "unknown") for s in sums})), _threads(sums),
        tuple(sorted({str(c) for s in sums if (c := (s.get("hardware") or {}).get("cpu_capability"))})),
        len(sums), tuple(sorted(made_elsewhere(sums, exp.table).items())), gpu_hours, gpu_runs, _validation(cells),
        walls_of(w for c in cells.values() for w in c.wall), tuple((k, walls_of(ws)) for k, ws in by.items()),
        tuple(CellCode(k[0], k[1], tuple(sorted({code_text(s) for s in c.summaries})), _mixed(c.summaries, same),
                       *now_code.cell(c.summaries))
              for k, c in cells.items() if isinstance(k, tuple)),
        spent(done, exp.table), when.isoformat(), sum(bool(now_code.parts(s)) for s in done), len(done))
