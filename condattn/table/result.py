"""`TableResult`: one table's numbers and decisions, built once from a `Plan` and its run records, frozen and typed
(numbers, booleans, enums). Families → arms (values at 1× and 2×, the lr pick with its mark, the tests, the verdict
and its basis, the paper's claim), the baseline, its convergence, its noise floor, its floors and reach. Every view
(reporting/: Markdown, CSV, JSON, figure, findings, README block) formats it and decides nothing; `as_json` is its
serialisation, numbers as numbers."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum

from ..conditioning.spec import method_spec
from ..experiment import Experiment
from ..stats import (
    ALPHA,
    Basis,
    Claim,
    Convergence,
    Mark,
    NoiseFloor,
    Outcome,
    Reach,
    Scale,
    Speaks,
    Speed,
    State,
    Trend,
    Verdict,
    Word,
    convergence,
    delta_trend,
    mean_std,
    noise_floor,
    pick_strength,
    project_holm,
    reach,
    regime_word,
    speaks_to,
    speed_ratio,
    verdict_basis,
    verdicts,
)
from .observed import (
    TableCell,
    Target,
    baseline_target,
    collect,
    heuristic_holds,
    longer,
    missing_runs,
    plateau_step,
    steps_to,
)
from .planned import Plan
from .provenance import Provenance, provenance
from .step0 import Step0, step0


@dataclass(frozen=True)
class Values:
    """A cell's measured values (× the table's multiplier), by seed."""

    seeds: tuple[int, ...]
    values: tuple[float, ...]
    missing: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return mean_std(self.values)[0] if self.values else None

    @property
    def std(self) -> float | None:
        return mean_std(self.values)[1] if len(self.values) > 1 else None


@dataclass(frozen=True)
class Test:
    """One arm's test against its family's baseline (stats.verdicts), as numbers and an outcome."""

    diff: float | None
    low: float | None
    high: float | None
    ci_method: str
    p: float | None
    p_adj: float | None
    p_perm: float | None
    correction: str
    mde: float | None
    mde_corrected: float | None
    alpha_corrected: float
    outcome: Outcome

    @property
    def mde_printed(self) -> float | None:
        return self.mde_corrected if self.mde_corrected is not None else self.mde


@dataclass(frozen=True)
class Pick:
    """An lr pick: the multiplier and lr (None while the grid is unfinished), its mark and the numbers behind it, and
    each selection seed's score per multiplier."""

    key: str
    base_lr: float
    multiplier: float | None
    lr: float | None
    at_bound: bool
    flat: bool
    mark: Mark
    lead: float | None
    se: float | None
    sigma: float | None
    df: int
    selection_seeds: int
    scores: tuple[tuple[float, tuple[tuple[int, float | None], ...]], ...]
    means: tuple[tuple[float, float | None], ...]
    tied: tuple[float, ...] = ()  # other multipliers whose mean equals the pick's exactly (not on a flat grid)
    tie_break: str = ""  # the rule that chose among them (lr_grid.TIE_NEAREST / TIE_LOWER)


@dataclass(frozen=True)
class PaperClaim:
    """What a paper gives for a row: its number for the method and its own baseline (never another paper's)."""

    who: str
    value: float
    baseline: float
    effect: bool  # the paper claims an effect (False: its control, e.g. mimetic init)

    @property
    def delta(self) -> float:
        return self.value - self.baseline


@dataclass(frozen=True)
class Arm:
    row: str
    method: str
    label: str
    reading: str
    hypothesis: str  # "baseline" | "primary" | "exploratory"
    at1: Values
    at2: Values | None
    test: Test | None
    test2: Test | None
    trend: Trend | None
    basis: Basis
    pick: Pick | None
    claim: PaperClaim | None
    rival: bool
    steps_median: float | None
    steps_last: int
    steps: tuple[int | None, ...]
    commits: tuple[str, ...]
    step0: tuple[Step0, ...] = ()  # the step-0 diagnostics, means over the runs that recorded them (table/step0.py)
    metric: str = ""  # the summary key its values are (the row's own at this scale: final_test_acc, test_loss, …)
    # steps to the baseline's final validation level, as a ratio to the baseline's (None for the baseline, or
    # without curves)
    speed: Speed | None = None


@dataclass(frozen=True)
class FloorCheck:
    label: str
    value: float
    split: str
    beats: bool
    gap: float


@dataclass(frozen=True)
class Family:
    name: str
    higher_is_better: bool
    untested: bool  # one pretraining run per method: no test over fine-tuning seeds
    baseline: Arm
    arms: tuple[Arm, ...]
    mde: float | None  # at the family's corrected α (its primary rows)
    alpha: float
    reach: Reach | None
    speaks: tuple[tuple[str, Speaks], ...]
    convergence: Convergence | None
    length_check: bool
    noise: NoiseFloor | None
    floor: FloorCheck | None
    floor_metric_mismatch: str  # the metric the cached floors are for, when not this table's ("" when fine)
    target: Target
    heuristic: bool | None
    plateau: float | None
    plateau_total: int
    # what set the convergence margin: the claim (its label and relative effect), and whether it is one of this
    # family's own rows (False: no row of the family has a paper's number; the table's smallest claim is borrowed)
    margin_claim: str = ""
    margin_relative: float | None = None
    margin_own: bool = True

    @property
    def converged(self) -> bool | None:
        return self.convergence.converged if self.convergence is not None else None

    @property
    def state(self) -> State | None:
        if not self.length_check:
            return None
        return self.convergence.state if self.convergence is not None else State.NOT_JUDGED


@dataclass(frozen=True)
class RegimeLine:
    """One method's two regimes (experiment `regimes:`): its verdict in a budget family (still learning at 2×) beside
    its verdict in the converged family that pairs with it, its speed in the budget family (steps to the baseline's
    final validation level, as a ratio), and the one word those decide (stats.regime_word)."""

    row: str  # the arm's row in the budget family
    method: str
    label: str
    hypothesis: str
    budget_family: str
    budget: Outcome
    budget_diff: float | None
    budget_low: float | None
    budget_high: float | None
    budget_mde: float | None
    convergence_family: str  # "": no converged family pairs with it (or none has runs yet)
    convergence: Outcome | None  # None: no converged family with runs yet
    convergence_diff: float | None
    convergence_mde: float | None
    convergence_basis: Basis | None
    speed: Speed | None
    word: Word


@dataclass(frozen=True)
class TableResult:
    table: str
    scale: str
    stem: str
    metric: str
    multiplier: float
    higher_is_better: bool
    families: tuple[Family, ...]
    missing_runs: int  # planned reported and length runs without a finished summary
    provenance: Provenance | None = None  # None: a result serialised before it was recorded
    regimes: tuple[RegimeLine, ...] = ()  # per arm of each budget family (experiment `regimes:`)

    def arm(self, row: str, method: str) -> Arm | None:
        return next((a for f in self.families for a in (f.baseline, *f.arms) if (a.row, a.method) == (row, method)),
                    None)

    def family_of(self, row: str, method: str) -> Family | None:
        return next((f for f in self.families if any((a.row, a.method) == (row, method)
                                                     for a in (f.baseline, *f.arms))), None)

    def as_json(self) -> dict:
        """The result as JSON-ready values: numbers as numbers, enums as their words, NaN as None."""
        return plain(asdict(self))

    @classmethod
    def from_json(cls, doc: Mapping) -> TableResult:
        """The result back from its serialisation (`as_json`), typed as it was built (findings reads it so)."""
        return _build(cls, doc)


def _build(tp, x):
    """`x` (JSON values) as an instance of the type hint `tp`: dataclasses field by field, enums by value, tuples."""
    if x is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _build(next(a for a in args if a is not type(None)), x)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _build(hints[f.name], x[f.name]) for f in dataclasses.fields(tp) if f.name in x})
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(x)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in x)
        return tuple(_build(a, v) for a, v in zip(args, x))
    return float(x) if tp is float else x


def project_tests(tests: Sequence[tuple[str, float | None, Outcome]]):
    """Holm over every primary test of a scale (stats.project_holm), for the findings' sensitivity lines."""
    return project_holm(tests)


def plain(x):
    if isinstance(x, Enum):
        return x.value
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def scale_of(exp: Experiment, row: str) -> Scale:
    """An accuracy in % (multiplier 100: error = 100 − value), else a loss above 0 (no irreducible loss is known)."""
    higher = exp.higher_is_better_for(row)
    return Scale(higher, 100.0) if exp.multiplier == 100 and higher else Scale(higher)


def paper_claim(exp: Experiment, row: str, method: str) -> PaperClaim | None:
    """The paper's numbers for a row × method (its own `paper_key` and its own paper's `paper_baseline_key`, read from
    the method's registration), when the experiment's `paper:` gives both."""
    spec = method_spec(method)
    paper = exp.paper.get(exp.paper_row(row)) or {}
    if not spec.paper_key or not isinstance(paper, dict):
        return None
    value, base = paper.get(spec.paper_key), paper.get(spec.paper_baseline_key)
    if value is None or base is None:
        return None
    return PaperClaim(spec.claim or spec.table_label, float(value), float(base), bool(spec.effect))


def _test(v: Verdict | None) -> Test | None:
    if v is None:
        return None
    ci = v.ci
    return Test(ci.diff if ci else None, ci.low if ci else None, ci.high if ci else None, ci.method if ci else "",
                v.p, v.p_adj, v.p_perm, v.correction, v.mde, v.mde_corrected, v.alpha_corrected, v.outcome)


def _values(c: TableCell | None) -> Values | None:
    return None if c is None else Values(tuple(sd for sd in c.seeds if sd not in c.missing), tuple(c.values),
                                         tuple(c.missing))


def pick_of(plan: Plan, key: str, cell: TableCell | None = None, higher: bool = True) -> Pick | None:
    """The lr pick named `key` with its mark (the reported runs of `cell` at the pick add to the spread its lead is
    judged against); None without a grid."""
    p = plan.picks.get(key)
    if p is None:
        return None
    scores = tuple((float(m), tuple(sorted(by.items()))) for m, by in sorted(p.scores.items()))
    means = tuple((float(m), p.mean(m)) for m in sorted(p.lrs))
    n_sel = max((len(by) for by in p.scores.values()), default=0)
    if p.pick is None:
        return Pick(p.key, p.base_lr, None, None, False, False, Mark.NONE, None, None, None, 0, n_sel, scores, means)
    flat = p.flat()
    sums = cell.summaries if cell else []
    at_pick = [float(s["metrics"][p.key]) for s in sums if s["metrics"].get(p.key) is not None]
    st = pick_strength({m: list(by.values()) for m, by in p.scores.items()}, p.pick, higher, p.at_bound, at_pick)
    mark = Mark.FLAT if flat else st.mark if st.mark != Mark.NONE or not p.at_bound else Mark.BOUND
    tied, rule = p.tie_break()
    return Pick(p.key, p.base_lr, float(p.pick), float(p.lrs[p.pick]), p.at_bound, flat, mark, st.lead, st.se,
                st.sigma, st.df, n_sel, scores, means, tuple(float(m) for m in tied), rule)


def _floor(entry: Mapping | None, base: list[float], mult: float, higher: bool) -> FloorCheck | None:
    floors = [f for f in (entry or {}).get("floors") or [] if f.get("value") is not None]
    if not floors or not base:
        return None
    mean = sum(base) / len(base)
    best = (max if higher else min)(floors, key=lambda f: f["value"])
    value = mult * float(best["value"])
    beats = mean > value if higher else mean < value
    return FloorCheck(best["label"].removeprefix("floor: "), value, best["split"], beats, abs(value - mean))


@dataclass
class _Ctx:
    """What one family's build reads: the plan, its cells at 1× and 2×, the cached floors, and the table's claims
    (`_table_claims`: the convergence margin of a family without a claim of its own)."""

    plan: Plan
    cells: dict
    long: dict
    floors: Mapping
    claims: Sequence[tuple[str, Claim]] = ()


def _arm(ctx: _Ctx, rm: tuple[str, str], hyp: str, t: Verdict | None, t2: Verdict | None, trend: Trend | None,
         basis: Basis, target: Target, base_final: list[int | None] | None = None) -> Arm:
    plan, exp = ctx.plan, ctx.plan.exp
    row, method = rm
    cell, spec = ctx.cells[rm], method_spec(method)
    reading = (exp.rows[row].reading or row) if exp.rows[row].method is not None else spec.table_label
    label = spec.table_label if hyp in ("baseline", "primary") else reading
    higher = exp.higher_is_better_for(row)
    key = exp.curve.get("key", "acc")
    med, last, steps = steps_to(cell.summaries, target.value, key, exp.multiplier, higher)
    # the speed effect: steps to the baseline's final validation level, as a ratio to the baseline's own steps there
    speed = speed_ratio(base_final, steps_to(cell.summaries, target.final, key, exp.multiplier, higher)[2]) \
        if base_final else None
    return Arm(row, method, label, reading, hyp, _values(cell), _values(ctx.long.get(rm)), _test(t), _test(t2), trend,
               basis, pick_of(plan, exp.pick_key(row, method), cell, higher), paper_claim(exp, row, method),
               spec.rival, med, last, tuple(steps), tuple(sorted({s.get("commit", "") for s in cell.summaries})),
               step0(cell.summaries), exp.row_metric(plan.scale, row), speed)


def _tests(ctx: _Ctx, members: list, hyp: dict, higher: bool, untested: bool) -> tuple[dict, dict]:
    base, others = members[0], members[1:]
    if untested:
        return {}, {}
    tests = verdicts(ctx.cells[base].values, [(rm, ctx.cells[rm].values, hyp[rm]) for rm in others], higher)
    if base not in ctx.long:
        return tests, {}
    # the family as declared: a row without runs at 2× counts as p = 1 (Holm never corrects for fewer)
    long = verdicts(ctx.long[base].values, [(rm, ctx.long[rm].values if rm in ctx.long else [], hyp[rm])
                                           for rm in others], higher, pooled=True)
    return tests, long


def _family(ctx: _Ctx, name: str, members: list[tuple[str, str]]) -> Family:
    exp, scale = ctx.plan.exp, ctx.plan.scale
    base_rm, others = members[0], members[1:]
    higher, untested = exp.higher_is_better_for(base_rm[0]), bool(exp.pretrain)
    hyp = {rm: exp.hypothesis(rm[0]) if exp.rows[rm[0]].method is not None else "primary" for rm in others}
    tests, long_tests = _tests(ctx, members, hyp, higher, untested)
    primary = [rm for rm in others if hyp[rm] == "primary"]
    alpha = ALPHA / max(len(primary), 1)
    mde_ = next((tests[rm].mde_corrected for rm in primary if rm in tests and tests[rm].mde_corrected), None)
    base = ctx.cells[base_rm]
    claims = [(method_spec(rm[1]).table_label, c) for rm in primary
              if (c := paper_claim(exp, *rm)) is not None and c.effect]
    sc = scale_of(exp, base_rm[0])
    r = reach(name, base.values, mde_, [(lab, Claim(c.who, c.baseline, c.value, sc)) for lab, c in claims], sc, alpha) \
        if mde_ is not None and len(base.values) >= 2 and not untested else None
    check = (bool(exp.at(scale).length_check) or base_rm in ctx.long) and not untested
    one, two = base.by_seed(), ctx.long[base_rm].by_seed() if base_rm in ctx.long else {}
    margin, m_label, m_rel, m_own = _margin(r, ctx.claims, base.values, sc)
    conv = convergence(one, two, margin, higher) if two else None
    state = (conv.state if conv is not None else State.NOT_JUDGED) if check else None
    target = baseline_target(base.summaries, exp.curve.get("key", "acc"), exp.multiplier, higher)
    _, base_last, to_final = steps_to(base.summaries, target.final, exp.curve.get("key", "acc"), exp.multiplier,
                                      higher)
    # the speed effect's denominator: the baseline reaches its final level by its last evaluation (a seed that ends
    # under the mean of the finals is counted there: that is where its budget ends)
    base_final = [base_last if x is None else x for x in to_final]
    arms = []
    for rm in others:
        trend = delta_trend(one, two, ctx.cells[rm].by_seed(), ctx.long[rm].by_seed()) \
            if two and rm in ctx.long and ctx.long[rm].values else None
        t = tests.get(rm)
        basis = verdict_basis(state, trend, t.mde_printed if t else None)
        arms.append(_arm(ctx, rm, hyp[rm], t, long_tests.get(rm), trend, basis, target, base_final))
    words = {a.label: a.test.outcome for a in arms if a.test is not None}
    total = max((int(s.get("steps") or 0) for s in base.summaries), default=0)
    entry, metric = ctx.floors.get(name) or ctx.floors.get(base_rm[0]), exp.row_metric(scale, base_rm[0])
    mismatch = str(entry.get("metric")) if entry and entry.get("metric") not in (None, metric) else ""
    # the A/A split joins the family's primary arms, each with its own raw p (an arm without a test counts as p = 1)
    noise = noise_floor(one, [tests[rm].p if rm in tests else None for rm in primary], higher) \
        if not untested else None
    return Family(name, higher, untested, _arm(ctx, base_rm, "baseline", None, None, None, Basis.NO_CHECK, target),
                  tuple(arms), mde_, alpha, r, tuple((row.label, k) for row, k in speaks_to(r, words)) if r else (),
                  conv, check, noise, None if mismatch else _floor(entry, base.values, exp.multiplier, higher),
                  mismatch, target, heuristic_holds(target), plateau_step(to_final, total), total, m_label, m_rel,
                  m_own)


def _margin(r: Reach | None, claims: Sequence[tuple[str, Claim]], base: Sequence[float],
            sc: Scale) -> tuple[float | None, str, float | None, bool]:
    """The convergence margin of a family: the paper-sized effect here of its smallest claim; for a family whose rows
    have no paper's number (a QK-norm baseline's family), the table's smallest claimed relative effect applied to this
    baseline (the effect the table tests), so that a baseline with runs at 2× is always judged. (margin, the claim's
    label, its relative effect, whether the claim is the family's own); (None, "", None, True) without a claim or
    without 2 baseline values."""
    if r is not None and r.smallest is not None:
        return r.smallest.here, r.smallest.label, r.smallest.claim.relative, True
    if len(base) < 2 or not claims:
        return None, "", None, True
    label, claim = min(claims, key=lambda lc: lc[1].relative)
    mean = sum(base) / len(base)
    if sc.room(mean) <= 0:
        return None, "", None, True
    return sc.absolute(claim.relative, mean), label, claim.relative, False


def _table_claims(exp: Experiment, scale: str) -> list[tuple[str, Claim]]:
    """Every claimed effect of the table's primary rows (each paper beside its own baseline), by its label."""
    out = []
    for members in exp.families(scale).values():
        for row, method in members[1:]:
            hyp = exp.hypothesis(row) if exp.rows[row].method is not None else "primary"
            c = paper_claim(exp, row, method)
            if hyp == "primary" and c is not None and c.effect:
                claim = Claim(c.who, c.baseline, c.value, scale_of(exp, row))
                if claim.effect > 0:
                    out.append((method_spec(method).table_label, claim))
    return out


def table_result(plan: Plan, floors: Mapping | None = None, cells: dict | None = None,
                 done: list[dict] | None = None) -> tuple[TableResult, dict, dict]:
    """The table's result from its plan's runs (`floors`: the cached floors, {family or row: entry}; `cells`: the
    cells at 1× when already read; `done`: every run the plan trained, table/provenance.trained, read when None), with
    the cells it was built from at 1× and 2× ({(row, method): TableCell}: the views' curves read their runs)."""
    exp, scale = plan.exp, plan.scale
    cells = collect(plan) if cells is None else cells
    long = longer(plan, cells)
    ctx = _Ctx(plan, cells, long, floors or {}, _table_claims(exp, scale))
    fams = tuple(_family(ctx, name, members) for name, members in exp.families(scale).items()
                 if members and all(rm in cells for rm in members))
    result = TableResult(exp.table, scale, plan.output_stem, exp.row_metric(scale), exp.multiplier,
                         exp.higher_is_better_for(), fams, missing_runs(cells) + missing_runs(long),
                         provenance(plan, cells, done), regime_lines(exp, fams))
    return result, cells, long


def _pair_key(fam: Family, a: Arm) -> tuple[str, str]:
    """How an arm finds its twin in the paired family: its row name after the family's (table 9's readings:
    `vit_hard_cet` → "cet"), and its method where the rows are the families (table 1: the row is the family)."""
    return (a.row.removeprefix(f"{fam.name}_") if a.row != fam.name else "", a.method if a.row == fam.name else "")


def regime_lines(exp: Experiment, fams: Sequence[Family]) -> tuple[RegimeLine, ...]:
    """Each arm of every family the experiment declares `regime: budget`, beside its twin in the family declared
    `regime: convergence` that pairs with it (`budget: <that family>`), and the one word (stats.regime_word). A
    converged family whose baseline or twin has no finished run yet counts as none ('no converged family yet')."""
    by_name = {f.name: f for f in fams}
    out = []
    for name, reg in exp.regimes.items():
        fam = by_name.get(name)
        if reg.regime != "budget" or fam is None:
            continue
        conv = next((by_name[c] for c, r in exp.regimes.items()
                     if r.regime == "convergence" and r.budget == name and c in by_name), None)
        twins = {_pair_key(conv, a): a for a in conv.arms} if conv is not None and conv.baseline.at1.n else {}
        for a in fam.arms:
            t, c = a.test, twins.get(_pair_key(fam, a))
            ct = c.test if c is not None and c.at1.n else None
            out.append(RegimeLine(
                a.row, a.method, a.label, a.hypothesis, name, t.outcome if t else Outcome.UNTESTED,
                t.diff if t else None, t.low if t else None, t.high if t else None, t.mde_printed if t else None,
                conv.name if ct is not None and conv is not None else "", ct.outcome if ct else None,
                ct.diff if ct else None, ct.mde_printed if ct else None, c.basis if ct and c else None, a.speed,
                regime_word(t.outcome if t else Outcome.UNTESTED, ct.outcome if ct else None,
                            bool(c and c.basis == Basis.CONVERGENCE), a.speed)))
    return tuple(out)


__all__ = ["Arm", "Basis", "Family", "FloorCheck", "Mark", "Outcome", "PaperClaim", "Pick", "RegimeLine", "Speaks",
           "Speed", "State", "TableResult", "Test", "Values", "Word", "paper_claim", "pick_of", "plain",
           "project_tests", "regime_lines", "table_result"]
