"""The typed experiment file (experiments/tableN_*.yaml): rows, scales, methods and hypotheses as frozen classes,
parsed once, refusing an unknown key in one line that names it and the nearest valid one (`higer_is_better` in a loss
table would otherwise read as "higher is better").

`load(path)` gives the Experiment, the one form of the file that planning and rendering pass around: the rules read
per row and scale (metric, direction, hypothesis, reported seeds, families, a cell's overrides) are its methods, and
the protocol fields (lr grid, bound, selection seeds, length check) are validated here, when the file is parsed.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

HYPOTHESES = ("primary", "exploratory")


class ExperimentError(ValueError):
    """A malformed experiment file: the message is one line naming the file, the key and the fix."""


def _check_keys(where: str, node: Any, allowed: tuple[str, ...]) -> dict:
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ExperimentError(f"{where}: expected a mapping of {', '.join(allowed)}, got {type(node).__name__} "
                              f"{node!r:.60}")
    for key in node:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ExperimentError(f"{where}: unknown key {key!r}; {hint}valid keys: {', '.join(allowed)}")
    return dict(node)


def _names(cls) -> tuple[str, ...]:
    return tuple(f.metadata.get("yaml", f.name) for f in fields(cls))


@dataclass(frozen=True)
class LengthCheck:
    """The baseline and every primary row with a verdict run again at `factor` × steps on `seeds` reported seeds."""

    factor: int = 2
    seeds: int = 5


@dataclass(frozen=True)
class ScaleSpec:
    """One scale of an experiment: the reported seeds, the rows it trains, its overrides and its lr protocol."""

    seeds: tuple[int, ...]
    rows: tuple[str, ...] | None = None
    overrides: tuple[str, ...] = ()
    lr_grid: tuple[float, ...] = ()
    lr_bound: tuple[float, float] = (0.125, 8.0)
    selection_seeds: tuple[int, ...] = ()
    exploratory_seeds: int | None = None
    length_check: LengthCheck | None = None
    # {family: n}: a family whose MDE needs more than the scale's seeds reports n, the scale's seeds continued
    family_seeds: Mapping[str, int] = field(default_factory=dict)

    def problem(self, table: str, scale: str, reported: Any = ()) -> str | None:
        """`protocol_problem` of these settings against the seeds a command reports (--seeds)."""
        return protocol_problem(table, scale, asdict(self), reported)


@dataclass(frozen=True)
class Row:
    """One row: its overrides, and for a table of readings (table 9) the one method it trains, its task, its words and
    its declared hypothesis."""

    overrides: tuple[str, ...] = ()
    method: str | None = None
    task: str | None = None
    reading: str | None = None
    hypothesis: str = "primary"
    label: str | None = None
    metric: str | None = None
    metrics: Mapping[str, str] = field(default_factory=dict)  # {scale: summary key}
    select_metric: str | None = None
    higher_is_better: bool | None = None
    scales: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # {scale: overrides}
    paper_row: str | None = None
    lam: float | None = None  # table 8: the row's λ, as the axis of its figure
    model: str | None = None  # table 6: the model in words


REGIMES = ("budget", "convergence")


@dataclass(frozen=True)
class FamilyRegime:
    """What a family's verdicts are about (`regimes: {<family>: {regime: …, budget: …}}`): `budget`, a family still
    learning at 2× its steps (augmented, a short recipe: its verdicts are at a budget), or `convergence`, a family
    whose baseline passes the convergence rule (no augmentation, few images: it plateaus), which names the `budget`
    family it pairs with. Each method's regime line sets its verdict in the one beside its verdict in the other: an arm
    pairs with the arm of the same row name after the family's (table 9: `vit_hard_cet` ↔ `<family>_cet`), or of the
    same method where the rows are the families (table 1)."""

    regime: str
    budget: str | None = None


@dataclass(frozen=True)
class Pretrain:
    """Table 3's first stage: one pretraining run per method, its fine-tuning cells start from it."""

    overrides: tuple[str, ...] = ()
    seed: int = 0
    scales: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# keys whose values are the papers' numbers, words or figures' claims: free-form, read by the renderers
FREE = ("paper", "paper_provenance", "paper_columns", "paper_sources", "paper_std", "paper_models", "paper_claims",
        "notes", "anchors", "metrics")


@dataclass(frozen=True)
class Experiment:
    """One experiment file, typed: the rules read per row and scale (metric, direction, hypothesis, seeds, families,
    a cell's overrides) are its methods; the papers' numbers and words (`paper:`, `notes:`, ...) its properties."""

    table: str
    metric: str
    methods: tuple[str, ...]
    rows: Mapping[str, Row]
    scales: Mapping[str, ScaleSpec]
    title: str = ""
    higher_is_better: bool = True
    metric_at: Mapping[str, str] = field(default_factory=dict)  # {scale: summary key the table reports}
    metric_multiplier: float = 100.0
    select_metric: str | None = None
    curve: Mapping[str, str] = field(default_factory=dict)  # {split, key}
    renderer: str | None = None
    baseline_reading: str = "baseline"
    summary_stat: str = "mean"
    paper_digits: int = 1
    pretrain: Pretrain | None = None
    regimes: Mapping[str, FamilyRegime] = field(default_factory=dict)  # {family: its regime} (FamilyRegime)
    path: str = ""
    free: Mapping[str, Any] = field(default_factory=dict)

    def at(self, scale: str) -> ScaleSpec:
        """The scale's settings; ExperimentError naming the scales there are."""
        if scale not in self.scales:
            raise ExperimentError(f"scale {scale!r} is not defined in {self.path or self.table}; choose one of "
                                  f"{', '.join(self.scales)}")
        return self.scales[scale]

    def rows_at(self, scale: str) -> list[str]:
        """The rows a scale trains: its `rows:` when given (e.g. table 3's offline scales run only the stand-in task),
        else every row of the experiment."""
        rows = self.at(scale).rows
        return list(self.rows) if rows is None else list(rows)

    def methods_of(self, row: str) -> list[str]:
        """The methods a row trains: its own `method:` (table 9: each row is one reading), else every method."""
        own = self.rows[row].method
        return list(self.methods) if own is None else [own]

    def row_metric(self, scale: str | None, row: str | None = None) -> str:
        """The row's `metrics: {<scale>: key}` entry, else its `metric:`, else the experiment's `metric_at: {<scale>:
        key}` entry, else its `metric` (the small tables with an lr grid report a held-out test split; validation
        picks the lr). Without `row`: the experiment's own (its heading)."""
        spec = self.rows[row] if row is not None else Row()
        at = self.metric_at.get(scale) if scale is not None else None
        return (spec.metrics.get(scale) if scale is not None else None) or spec.metric or at or self.metric

    def higher_is_better_for(self, row: str | None = None) -> bool:
        """The metric's direction: the row's `higher_is_better`, else the experiment's (false for a loss)."""
        own = self.rows[row].higher_is_better if row is not None else None
        return self.higher_is_better if own is None else bool(own)

    def hypothesis(self, row: str) -> str:
        """"primary" (declared before running: the papers' methods as stated and the rival methods; one family per
        task, Holm-corrected) or "exploratory" (every other reading; Benjamini–Hochberg q)."""
        return self.rows[row].hypothesis

    def family_of(self, row: str) -> str:
        """The family a row's comparisons belong to: its task in a table of readings (table 9), else the row."""
        return _family(row, self.rows[row])

    def row_seeds(self, scale: str, row: str, seeds: list[int]) -> list[int]:
        """The reported seeds of a row: all of `seeds` for the baseline and primary rows, the first
        `scales.<scale>.exploratory_seeds` of them for an exploratory row (when the scale sets it). A family in
        `scales.<scale>.family_seeds` reports its n seeds instead, the scale's seeds continued (0-9 → 0-19), when
        `seeds` are the scale's own: seeds a command names (--seeds) are run as named."""
        at = self.at(scale)
        n = at.exploratory_seeds
        if n and self.hypothesis(row) == "exploratory":
            return list(seeds[:int(n)])
        more = at.family_seeds.get(self.family_of(row))
        if more and list(seeds) == list(at.seeds) and more > len(seeds):
            top = max(seeds, default=-1)
            return [*seeds, *range(top + 1, top + 1 + more - len(seeds))]
        return list(seeds)

    def families(self, scale: str) -> dict[str, list[tuple[str, str]]]:
        """The comparisons of a table, one family per task: {family: [(row, method), ...]}, the family's baseline
        first. A table of readings (rows that name their `method` and `task`, table 9) has one family per task, its
        baseline the row `<task>_<baseline_reading>`; a table whose rows train every method (tables 1, 3, 4, 5) has one
        family per row, its baseline the first method."""
        out: dict[str, list[tuple[str, str]]] = {}
        for row in self.rows_at(scale):
            name = self.family_of(row)
            fam = out.setdefault(name, [])
            for method in self.methods_of(row):
                if name != row and row == f"{name}_{self.baseline_reading}":
                    fam.insert(0, (row, method))
                else:
                    fam.append((row, method))
        return out

    def pick_key(self, row: str, method: str) -> str:
        """The key of a cell group's lr pick: the row, when it trains one method (table 9's readings), else
        "<row>/<method>" (tables 1, 3, 4, 5: each method of a row picks its own lr)."""
        return row if self.rows[row].method is not None or len(self.methods) == 1 else f"{row}/{method}"

    def paper_row(self, row: str) -> str:
        """The paper row whose numbers a row is shown beside: its `paper_row:`, else the row itself."""
        return (self.rows[row].paper_row if row in self.rows else None) or row

    def cell_overrides(self, row: str, method: str, scale: str, seed: int) -> list[str]:
        """The overrides of one cell before its name and launcher: the row's, the scale's, the row's at this scale
        (`{method}`/`{scale}` filled in), then the method, the scale and the seed. Reproduce and the floors both
        compose a cell from this one recipe."""
        spec = self.rows[row]
        own = [o.replace("{method}", method).replace("{scale}", scale) for o in spec.scales.get(scale) or ()]
        return [*spec.overrides, *self.at(scale).overrides, *own, f"conditioning={method}", f"scale={scale}",
                f"seed={seed}"]

    @property
    def multiplier(self) -> float:
        """What the table multiplies the metric by: 100 (accuracies in %) unless `metric_multiplier` says (loss: 1)."""
        return float(self.metric_multiplier)

    # the papers' numbers, words and figures' claims (free-form in the file): typed views of the `paper:` block
    @property
    def paper(self) -> Mapping[str, Any]:
        """The papers' numbers: {paper row: {column key: number}} (table 3: {column key: [number per task]})."""
        return self.free.get("paper") or {}

    @property
    def paper_provenance(self) -> str | None:
        return self.free.get("paper_provenance")

    @property
    def paper_columns(self) -> Mapping[str, str] | list[str]:
        """The paper's columns: key → label for the generic table, a list of labels for table 3's."""
        return self.free.get("paper_columns") or {}

    @property
    def paper_sources(self) -> Mapping[str, str]:
        return self.free.get("paper_sources") or {}

    @property
    def paper_models(self) -> list[str]:
        return list(self.free.get("paper_models") or [])

    @property
    def paper_claims(self) -> Mapping[str, Any]:
        return self.free.get("paper_claims") or {}

    @property
    def notes(self) -> list | Mapping[str, str]:
        """The notes under the table: a list (every scale; an entry may name its rows and scales) or {scale: text}."""
        return self.free.get("notes") or []

    @property
    def metrics(self) -> list[Mapping[str, str]]:
        """The columns of a table that reports several metrics (`metrics: [{key, label}]`, tables 2 and 7)."""
        return list(self.free.get("metrics") or [])


def _tuple(where: str, v: Any, kind=str) -> tuple:
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        raise ExperimentError(f"{where}: expected a list, got {v!r:.60}")
    bad = [x for x in v if not isinstance(x, kind) or isinstance(x, bool) and kind is not bool]
    if bad:
        raise ExperimentError(f"{where}: {bad[0]!r} is not a {kind.__name__ if isinstance(kind, type) else kind}")
    return tuple(v)


def _scale(where: str, node: Any) -> ScaleSpec:
    d = _check_keys(where, node, _names(ScaleSpec))
    if "seeds" not in d:
        raise ExperimentError(f"{where}: missing key 'seeds' (the reported seeds, e.g. seeds: [0, 1, 2])")
    length = d.get("length_check")
    return ScaleSpec(
        seeds=_tuple(f"{where}.seeds", d["seeds"], int),
        rows=_tuple(f"{where}.rows", d["rows"]) if d.get("rows") is not None else None,
        overrides=_tuple(f"{where}.overrides", d.get("overrides")),
        lr_grid=tuple(float(m) for m in _tuple(f"{where}.lr_grid", d.get("lr_grid"), (int, float))),
        lr_bound=tuple(float(m) for m in _tuple(f"{where}.lr_bound", d.get("lr_bound") or [0.125, 8], (int, float))),
        selection_seeds=_tuple(f"{where}.selection_seeds", d.get("selection_seeds"), int),
        exploratory_seeds=d.get("exploratory_seeds"),
        length_check=LengthCheck(**_check_keys(f"{where}.length_check", length, _names(LengthCheck)))
        if length else None,
        family_seeds=_family_seeds(f"{where}.family_seeds", d.get("family_seeds")),
    )


def _family_seeds(where: str, node: Any) -> dict[str, int]:
    if node is None:
        return {}
    if not isinstance(node, Mapping) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 2
                                                 for v in node.values()):
        raise ExperimentError(f"{where}: expected {{family: number of reported seeds (at least 2)}}, e.g. "
                              f"{{vit_hard: 20}}; got {node!r:.80}")
    return {str(k): int(v) for k, v in node.items()}


def protocol_problem(table: str, scale: str, node: Mapping, reported: Any = ()) -> str | None:
    """What is wrong with a scale's lr protocol and length check (None: nothing), in one line: checked when the
    experiment file is parsed, and again by the plan against the seeds a command reports (--seeds)."""
    grid = node.get("lr_grid") or []
    length = node.get("length_check")
    if length:
        factor, n = length.get("factor", 2), length.get("seeds", 5)
        if not (isinstance(factor, int) and factor > 1 and isinstance(n, int) and n >= 2):
            return (f"scales.{scale}.length_check={dict(length)!r} in {table}: give an integer factor > 1 and at "
                    "least 2 seeds, e.g. {factor: 2, seeds: 5}")
    if not grid:
        return None
    ok = isinstance(grid, (list, tuple)) and all(
        isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0 for m in grid)
    if not (ok and len(set(grid)) == len(grid) and all(
            math.isclose(b / a, 2.0) for a, b in zip(sorted(grid), sorted(grid)[1:]))):
        return (f"scales.{scale}.lr_grid={list(grid)!r} in {table}: give distinct log2-spaced positive multipliers of "
                "each row's optim.lr, e.g. lr_grid: [0.5, 1, 2]")
    lo, hi = node.get("lr_bound") or (0.125, 8.0)
    if not (0 < lo <= min(grid) and max(grid) <= hi):
        return f"scales.{scale}.lr_bound=[{lo}, {hi}] in {table} must contain the lr_grid {sorted(grid)}"
    sel = list(node.get("selection_seeds") or [])
    seen = set(node.get("seeds") or []) | set(reported or [])
    if len(sel) < 2 or len(set(sel)) != len(sel) or seen & set(sel):
        return (f"scales.{scale}.selection_seeds={sel!r} in {table}: an lr grid needs at least 2 distinct selection "
                f"seeds, disjoint from the reported seeds {sorted(seen)}, e.g. selection_seeds: [100, 101]")
    return None


def _per_scale(where: str, node: Any) -> dict[str, tuple[str, ...]]:
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ExperimentError(f"{where}: expected {{scale: [overrides]}}, got {node!r:.60}")
    return {s: _tuple(f"{where}.{s}", v) for s, v in node.items()}


def _family(name: str, row: Row) -> str:
    return row.task if row.method is not None and row.task else name


def _row(where: str, node: Any, methods: tuple[str, ...]) -> Row:
    d = _check_keys(where, node, _names(Row))
    if d.get("hypothesis", "primary") not in HYPOTHESES:
        raise ExperimentError(f"{where}.hypothesis: {d['hypothesis']!r}; use one of {', '.join(HYPOTHESES)}")
    if d.get("method") is not None and d["method"] not in methods:
        raise ExperimentError(f"{where}.method: {d['method']!r} is not among the experiment's methods "
                              f"({', '.join(methods)})")
    return Row(**{**d, "overrides": _tuple(f"{where}.overrides", d.get("overrides")),
                  "scales": _per_scale(f"{where}.scales", d.get("scales")), "metrics": dict(d.get("metrics") or {})})


TOP = tuple(f.name for f in fields(Experiment) if f.name not in ("free", "path")) + FREE
REQUIRED = ("table", "metric", "methods", "rows", "scales")


def parse(raw: Any, path: str = "<experiment>") -> Experiment:
    """The Experiment of a loaded YAML document; ExperimentError (one line) for anything malformed."""
    if not isinstance(raw, Mapping) or not raw:
        raise ExperimentError(f"{path}: empty or not a mapping; an experiment file needs the keys "
                              f"{', '.join(REQUIRED)} (see experiments/table4_lra.yaml)")
    d = _check_keys(path, raw, TOP)
    for key in REQUIRED:
        if key not in d:
            raise ExperimentError(f"{path}: missing key {key!r}")
    methods = _tuple(f"{path}: methods", d["methods"])
    if not isinstance(d["rows"], Mapping) or not d["rows"]:
        raise ExperimentError(f"{path}: rows must map each row's name to its spec")
    if not isinstance(d["scales"], Mapping) or not d["scales"]:
        raise ExperimentError(f"{path}: scales must map each scale (smoke, small, ...) to its seeds")
    rows = {str(name): _row(f"{path}: rows.{name}", spec, methods) for name, spec in d["rows"].items()}
    scales = {str(name): _scale(f"{path}: scales.{name}", spec) for name, spec in d["scales"].items()}
    for name, spec in d["scales"].items():
        if problem := protocol_problem(str(d["table"]), str(name), spec):
            raise ExperimentError(f"{path}: {problem}")
    for name, sc in scales.items():
        unknown = [r for r in sc.rows or () if r not in rows]
        if unknown:
            raise ExperimentError(f"{path}: scales.{name}.rows names {unknown[0]!r}, not a row of the experiment "
                                  f"({', '.join(rows)})")
        fams = {_family(r, spec) for r, spec in rows.items()}
        if odd := [f for f in sc.family_seeds if f not in fams]:
            raise ExperimentError(f"{path}: scales.{name}.family_seeds names {odd[0]!r}, not a family of the "
                                  f"experiment ({', '.join(sorted(fams))})")
    regimes = _regimes(f"{path}: regimes", d.get("regimes"), {_family(r, spec) for r, spec in rows.items()})
    pre = d.get("pretrain")
    pretrain = None
    if pre is not None:
        p = _check_keys(f"{path}: pretrain", pre, _names(Pretrain))
        pretrain = Pretrain(_tuple(f"{path}: pretrain.overrides", p.get("overrides")), int(p.get("seed", 0)),
                            _per_scale(f"{path}: pretrain.scales", p.get("scales")))
    curve = _check_keys(f"{path}: curve", d.get("curve"), ("split", "key"))
    typed = {k: v for k, v in d.items()
             if k not in (*FREE, "rows", "scales", "methods", "pretrain", "curve", "regimes")}
    return Experiment(**typed, methods=methods, rows=rows, scales=scales, pretrain=pretrain, curve=curve,
                      regimes=regimes, path=path, free={k: d[k] for k in FREE if k in d})


def _regimes(where: str, node: Any, families: set[str]) -> dict[str, FamilyRegime]:
    """`regimes:` typed and checked: each regime one of REGIMES, a convergence family naming a family declared
    `budget` (and a budget family naming none). A declared family that is not among the rows (a copy of the file with
    rows left out) has no regime line and is dropped."""
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ExperimentError(f"{where}: expected {{family: {{regime: budget|convergence, budget: <family>}}}}, got "
                              f"{node!r:.80}")
    out = {}
    for fam, spec in node.items():
        d = _check_keys(f"{where}.{fam}", spec, _names(FamilyRegime))
        if d.get("regime") not in REGIMES:
            raise ExperimentError(f"{where}.{fam}.regime: {d.get('regime')!r}; use one of {', '.join(REGIMES)}")
        out[str(fam)] = FamilyRegime(str(d["regime"]), None if d.get("budget") is None else str(d["budget"]))
    for fam, r in out.items():
        if r.regime == "budget" and r.budget is not None:
            raise ExperimentError(f"{where}.{fam}: a budget family pairs with none (budget: {r.budget!r}); the "
                                  "convergence family names the budget family it pairs with")
        budgets = ", ".join(f for f, x in out.items() if x.regime == "budget") or "none declared"
        if r.regime == "convergence" and (r.budget not in out or out[r.budget].regime != "budget"):
            raise ExperimentError(f"{where}.{fam}.budget: {r.budget!r}; a convergence family names the family declared "
                                  f"`regime: budget` it pairs with ({budgets})")
    return {fam: r for fam, r in out.items() if fam in families}


def load(path: str | Path) -> Experiment:
    """Parse an experiment file; FileNotFoundError naming the known experiments, ExperimentError (one line) for a
    malformed one."""
    path = Path(path)
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
        raise FileNotFoundError(f"experiment file {path} not found; known experiments: {', '.join(known)}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ExperimentError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    return parse(raw, str(path))
