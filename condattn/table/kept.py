"""A plan's committed run records put back into its runs root (table/store.py), or, for a dry run, only read: what
restoring brings, the cells that count as finished by it, and the records that cannot be read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..runs import RunRecord
from .plan import Plan
from .store import RunStore, kept_root, restorable, restore


@dataclass(frozen=True)
class Unreadable:
    """A cell's committed record that cannot be read: where it lies, why, and the cell's run dir."""

    record: Path
    why: str
    run_dir: Path


@dataclass(frozen=True)
class Restored:
    """What the kept records bring to a plan: the cells restored (or, in a dry run, that would be) from their own
    record (`own`) or a twin's (`twins`), and the cells whose own record is there but unreadable (`corrupt`, by run
    name), never stood in for by a twin or trained over without --force."""

    own: tuple[str, ...] = ()
    twins: tuple[str, ...] = ()
    corrupt: Mapping[str, Unreadable] = field(default_factory=dict)

    @property
    def finished(self) -> frozenset[str]:
        """The cells a kept record makes finished."""
        return frozenset((*self.own, *self.twins))

    def __len__(self) -> int:
        return len(self.own) + len(self.twins)


NOTHING = Restored()  # no kept record brings anything (--force, or no records)


def restore_kept(p: Plan, reuse: bool = True, write: bool = True) -> Restored:
    """Put back into the runs root the kept record of each planned cell whose run dir is absent (a fresh clone, a new
    machine), its own or (`reuse`) its twin's (table/store.py): such a cell counts as finished, as it did where it ran.
    Never a cell being trained (its lock) or set aside by --refresh-stale, and never a pretraining run that a
    fine-tuning cell still to train would start from (records carry no weights). `write` False (a dry run): the same
    answer, nothing written. Every planned cell's own record that is unreadable is named in `corrupt`."""
    kept = kept_root(p.results_root, p.scale)
    if not p.cells or not kept.is_dir():
        return NOTHING
    store = RunStore(kept)
    corrupt = {c.name: Unreadable(rec.path, why, c.run_dir) for c in p.cells
               if (why := (rec := store.get(c.name)).unreadable)}
    todo = [c for c in p.cells if restorable(c.run_dir) and c.name not in corrupt]
    feeds = {c.name for c in p.cells if "_pretrain_" in c.name} if p.exp.pretrain else set()
    done: dict[str, str] = {}

    def one(c) -> None:
        if write:
            how = restore(store, c.name, c.cfg, c.run_dir, reuse)
        else:
            rec = store.record_for(c.name, c.cfg, reuse)
            how = "" if rec is None else "own" if rec.name == c.name else "twin"
        if how:
            done[c.name] = how

    for c in (c for c in todo if c.name not in feeds):
        one(c)
    for c in (c for c in todo if c.name in feeds):  # a pretraining run: once every cell that starts from it finished
        users = [u for u in p.cells if p.needs(u.name) == c.name]
        if users and all(u.name in done or RunRecord(u.run_dir).finished for u in users):
            one(c)
    out = Restored(tuple(n for n, how in done.items() if how == "own"),
                   tuple(n for n, how in done.items() if how == "twin"), corrupt)
    if len(out):
        twins = len(out.twins)
        print(f"[reproduce] {'restored' if write else 'would restore (dry run: nothing written)'} {len(out)} finished "
              f"runs from their kept records ({kept}) into {p.cells[0].run_dir.parent}"
              + (f", {twins} of them linked to the record of the same science config made under another name (the "
                 "same science config and code finished there; reused, not trained again: --no-reuse trains them)"
                 if twins else "")
              + "; they count as finished (no checkpoints: --force retrains them)")
    return out


def with_kept(make_plan: Callable[[], Plan], reuse: bool = True, write: bool = True) -> tuple[Plan, Restored]:
    """A plan, then the kept records of its cells restored (`write` False: only read). The plan reads those records
    where they lie (table/store.Records) to make its lr picks and length checks, so one plan holds every cell they
    add."""
    p = make_plan()
    return p, restore_kept(p, reuse, write)
