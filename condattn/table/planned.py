"""The frozen `Plan`: what a table is at this moment, the one thing planning hands to the launch and the renderers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..experiment import Experiment
from ..launch import RunSpec
from .lr_grid import LrPick


@dataclass(frozen=True)
class MadeWith:
    """Science overrides of a command (e.g. conditioning.lam=5) and the methods they change: the table says so."""

    overrides: tuple[str, ...]
    methods: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """A table at one scale: its cells to train (composed, named), every cell it plans, the lr picks, the variant of
    each cell run with overrides its name does not carry, the length check, what made it, and where its runs and
    results go. `stem`: the output file's name (the table's, or one naming the seeds, rows or overrides that made it).
    """

    exp: Experiment
    scale: str
    seeds: tuple[int, ...]
    runs_root: Path
    results_root: Path
    cells: tuple[RunSpec, ...] = ()
    planned: tuple[str, ...] = ()  # every run the table trains: selection, reported and length runs
    picks: Mapping[str, LrPick] = field(default_factory=dict)  # by `Experiment.pick_key`
    variants: Mapping[str, str] = field(default_factory=dict)
    longer: Mapping[str, str] = field(default_factory=dict)  # the length check's run variants, by the 1× run's name
    made_with: MadeWith | None = None
    stem: str = ""
    unreached: tuple[str, ...] = ()  # one line per override of the command that changes no cell (said, not refused)

    @property
    def output_stem(self) -> str:
        return self.stem or self.exp.table

    @property
    def waiting(self) -> list[str]:
        """The rows (`pick_key`s: "<row>/<method>" where a row trains several) whose lr grid has no pick yet: their
        other seeds are not planned."""
        return [row for row, p in self.picks.items() if p.pick is None]

    def lr_pick(self, key: str) -> dict | None:
        """The pick named `key` (a `pick_key`) as `LrPick.as_dict` gives it; None without one."""
        p = self.picks.get(key)
        return p.as_dict() if p is not None else None

    def needs(self, name: str) -> str | None:
        """The pretraining run the cell `name` starts from (table/cells.needs), with its planned variant."""
        from .cells import needs

        return needs(self.exp, self.variants, name, self.scale)

    def cost(self, specs: list[RunSpec]) -> list[str]:
        """What these cells will cost before anything is queued (engine/cost.py)."""
        from ..engine.cost import describe_cost

        return describe_cost(self.exp.table, [(c.name, c.cfg) for c in specs])
