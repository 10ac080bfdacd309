"""What a verdict can rule out, in the papers' own terms: pure functions on numbers.

- The papers state their gains on their own scale (+0.6…+1.0 top-1 at about 20 % ImageNet error). An effect carries
  across scales as a *relative* one: the fall in error (100 − accuracy) as a share of the baseline's error, or for a
  loss the fall as a share of the loss above its floor.
- The seeds per arm a paper-sized effect (the claim's relative fall applied to our baseline) would need: at the
  baseline's spread (a broken row's spread says nothing of the effect) and at the α the family's verdicts use.
- Convergence: an equivalence test of the baseline's gain at 2× its steps against the paper-sized effect (the margin),
  with its power; a verdict is at convergence only when the baseline converged and the row's Δ moved by less than its
  MDE from 1× to 2×.
- An lr pick's strength against the standard error of the selection seeds' means (a spread pooled over the grid and
  the reported runs at the pick, never one degree of freedom).
- A noise floor: the baseline against itself on disjoint halves of its seeds, through the family's test and correction.
- A project-wide Holm family over every primary test of a scale.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist

from .core import ALPHA, DiffCI, holm, mde, welch_ci, welch_p
from .verdict import Outcome, verdicts


@dataclass(frozen=True)
class Scale:
    """How a metric turns into room for improvement: an accuracy in % (error = top − value) or a loss (room =
    value − floor; floor 0 when no irreducible loss is known, which understates relative effects)."""

    higher_is_better: bool = True
    top: float = 100.0
    floor: float = 0.0

    def room(self, value: float) -> float:
        return self.top - value if self.higher_is_better else value - self.floor

    def relative(self, effect: float, at: float) -> float:
        """An improvement of `effect` (metric units, positive = better) as a share of the room at `at`."""
        room = self.room(at)
        if room <= 0:
            raise ValueError(f"no room for improvement at {at} (top {self.top}, floor {self.floor}): the relative "
                             "effect is undefined; check the metric's direction and its top/floor")
        return effect / room

    def absolute(self, relative: float, at: float) -> float:
        return relative * self.room(at)


@dataclass(frozen=True)
class Claim:
    """A paper's claim: its own baseline and its method's value, on the paper's own scale."""

    who: str
    baseline: float
    conditioned: float
    scale: Scale = Scale()

    @property
    def effect(self) -> float:
        """The claimed improvement (positive = better)."""
        return (1.0 if self.scale.higher_is_better else -1.0) * (self.conditioned - self.baseline)

    @property
    def relative(self) -> float:
        return self.scale.relative(self.effect, self.baseline)


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = 0.8) -> int | None:
    """Seeds per arm for a two-sided two-sample t-test at level `alpha` to detect `effect` with this power: the
    smallest n (at least 2) with (t_{1−α/2, 2n−2} + t_{power, 2n−2}) · sd · √(2/n) ≤ effect, the MDE's own formula
    (core.mde). The normal approximation ⌈2 (z_{1−α/2} + z_{power})² sd² / effect²⌉ is where the search starts: t's
    quantiles are larger, so it undercounts (by 1-2 seeds at small n). None when the effect is not positive."""
    if effect <= 0 or not math.isfinite(effect):
        return None
    if sd == 0:
        return 2
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    n = max(2, math.ceil(2 * (z * sd / effect) ** 2))
    while (mde(sd, n, alpha, power) or math.inf) > effect:
        n += 1
    return n


@dataclass(frozen=True)
class ClaimHere:
    """One claimed arm of a family: the claim, its effect translated to our baseline, and the seeds per arm that
    effect needs at the baseline's spread `sd` and the family's α."""

    label: str
    claim: Claim
    here: float
    seeds: int | None


@dataclass(frozen=True)
class Reach:
    """What a family's test can rule out: its MDE as a relative effect beside each claim, translated here. `sd` and
    `alpha`: the baseline's spread and the α the seeds for a paper-sized effect are computed at."""

    family: str
    mde: float
    baseline: float
    scale: Scale
    sd: float
    alpha: float
    rows: tuple[ClaimHere, ...]

    @property
    def relative_mde(self) -> float:
        return self.scale.relative(self.mde, self.baseline)

    def ratio(self, row: ClaimHere) -> float:
        """The MDE's relative effect over the claim's: 'no difference detected' rules out only effects this many
        times the claim."""
        return self.relative_mde / row.claim.relative if row.claim.relative > 0 else math.inf

    @property
    def smallest(self) -> ClaimHere | None:
        """The claim with the smallest effect here (the effect the table tests)."""
        return min(self.rows, key=lambda r: r.here, default=None)


def reach(family: str, base: Sequence[float], mde_: float, claims: Sequence[tuple[str, Claim]], scale: Scale,
          alpha: float = ALPHA) -> Reach:
    """The family's reach: each claim with a positive effect translated to our baseline's room, and the seeds per arm
    it needs at the baseline's std and `alpha` (the family's corrected α)."""
    mean, sd = statistics.fmean(base), statistics.stdev(base)
    rows = []
    for label, claim in claims:
        if claim.effect <= 0:
            continue
        here = scale.absolute(claim.relative, mean)
        rows.append(ClaimHere(label, claim, here, seeds_needed(here, sd, alpha)))
    return Reach(family, mde_, mean, scale, sd, alpha, tuple(rows))


class Speaks(str, Enum):
    VERDICT = "a verdict"  # better or worse
    WITHIN = "no difference, MDE within the claim"
    TOO_WIDE = "no difference, MDE larger than the claim"
    UNTESTED = "not tested"


def speaks_to(r: Reach, outcomes: Mapping[str, Outcome]) -> list[tuple[ClaimHere, Speaks]]:
    """For each claim: whether the family's verdict on its arm speaks to it (a better/worse verdict, or a 'no
    difference' whose MDE is at most the claim's size here) or not."""
    out = []
    for row in r.rows:
        o = outcomes.get(row.label, Outcome.UNTESTED)
        kind = (Speaks.VERDICT if o in (Outcome.BETTER, Outcome.WORSE) else Speaks.UNTESTED if o == Outcome.UNTESTED
                else Speaks.WITHIN if r.mde <= row.here else Speaks.TOO_WIDE)
        out.append((row, kind))
    return out


def paired_gain(one: Mapping[int, float], two: Mapping[int, float], higher_is_better: bool = True,
                level: float = 0.95) -> DiffCI | None:
    """The mean gain from `one` to `two` over the seeds both have (a gain is an improvement: a lower loss for a loss),
    with a paired t interval at `level`; None with fewer than 2 such seeds."""
    from scipy import stats

    seeds = sorted(set(one) & set(two))
    if len(seeds) < 2:
        return None
    sign = 1.0 if higher_is_better else -1.0
    d = [sign * (two[s] - one[s]) for s in seeds]
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1)) * sd / math.sqrt(len(d))
    return DiffCI(mean, mean - half, mean + half, level, "paired-t")


class State(str, Enum):
    CONVERGED = "converged"
    LEARNING = "still learning"
    UNDETERMINED = "not shown converged"
    NOT_JUDGED = "not judged"


@dataclass(frozen=True)
class Convergence:
    """The equivalence test of the baseline's paired gain at 2× its steps against `margin` (the paper-sized effect
    here): converged when the one-sided (1 − α) upper bound of the gain (`high`; `low` the lower one, the two a
    1 − 2α interval) lies under the margin; still learning when the lower bound is above 0; else not shown converged.
    `power`: the chance a baseline whose true gain is 0 passes at this spread and n; `seeds_for_power`: the paired
    seeds at 2× that give it power 0.8."""

    gain: float
    low: float
    high: float
    n: int
    sd: float
    margin: float | None
    alpha: float
    power: float | None
    seeds_for_power: int | None

    @property
    def state(self) -> State:
        if self.margin is None:
            return State.NOT_JUDGED
        if self.high < self.margin:
            return State.CONVERGED
        return State.LEARNING if self.low > 0 else State.UNDETERMINED

    @property
    def converged(self) -> bool | None:
        return None if self.margin is None else self.state == State.CONVERGED


def equivalence_power(margin: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """P(upper one-sided bound < margin | true gain 0) ≈ Φ(margin·√n/sd − t_{1−α, n−1}) (1.0 when sd is 0)."""
    from scipy import stats

    if sd == 0:
        return 1.0
    return float(NormalDist().cdf(margin * math.sqrt(n) / sd - stats.t.ppf(1 - alpha, n - 1)))


def convergence(one: Mapping[int, float], two: Mapping[int, float], margin: float | None, higher_is_better: bool = True,
                alpha: float = ALPHA, power: float = 0.8) -> Convergence | None:
    """The convergence test over the seeds with a run at both lengths; None with fewer than 2 of them."""
    gain = paired_gain(one, two, higher_is_better, level=1 - 2 * alpha)
    if gain is None:
        return None
    n = len(set(one) & set(two))
    sign = 1.0 if higher_is_better else -1.0
    sd = statistics.stdev(sign * (two[s] - one[s]) for s in set(one) & set(two))
    if margin is None or margin <= 0:
        return Convergence(gain.diff, gain.low, gain.high, n, sd, None, alpha, None, None)
    need = next((k for k in range(2, 100_001) if equivalence_power(margin, sd, k, alpha) >= power), None)
    return Convergence(gain.diff, gain.low, gain.high, n, sd, margin, alpha, equivalence_power(margin, sd, n, alpha),
                       need)


@dataclass(frozen=True)
class Trend:
    """Δ to the baseline at 1× and at 2× on the seeds each arm has at both lengths, and the change with a Welch
    interval over the per-seed gains of the two arms."""

    at1: float
    at2: float
    change: DiffCI | None
    n: int


def delta_trend(base1: Mapping[int, float], base2: Mapping[int, float], arm1: Mapping[int, float],
                arm2: Mapping[int, float]) -> Trend | None:
    """Δ (arm − baseline) at 1× and 2×; change = mean gain of the arm − mean gain of the baseline (1× → 2×). None with
    fewer than 2 seeds at both lengths in an arm."""
    sb, sa = sorted(set(base1) & set(base2)), sorted(set(arm1) & set(arm2))
    if len(sb) < 2 or len(sa) < 2:
        return None
    at1 = statistics.fmean(arm1[s] for s in sa) - statistics.fmean(base1[s] for s in sb)
    at2 = statistics.fmean(arm2[s] for s in sa) - statistics.fmean(base2[s] for s in sb)
    change = welch_ci([base2[s] - base1[s] for s in sb], [arm2[s] - arm1[s] for s in sa])
    return Trend(at1, at2, change, min(len(sa), len(sb)))


class Basis(str, Enum):
    CONVERGENCE = "at convergence"
    BUDGET = "at a budget"
    NO_CHECK = "no length check"


def verdict_basis(state: State | None, trend: Trend | None, mde_: float | None) -> Basis:
    """A verdict is at convergence only when the baseline converged and the row's Δ moved from 1× to 2× by less than
    its MDE; at a budget otherwise (no run at 2×, a Δ that moved, a baseline not shown converged). `state` None: the
    scale has no length check."""
    if state is None:
        return Basis.NO_CHECK
    if state != State.CONVERGED or trend is None or mde_ is None:
        return Basis.BUDGET
    return Basis.CONVERGENCE if abs(trend.at2 - trend.at1) < mde_ else Basis.BUDGET


class Mark(str, Enum):
    NONE = ""
    WEAK = "weak pick"
    BOUND = "bound"
    BINDING = "bound binding"
    FLAT = "flat"


@dataclass(frozen=True)
class PickStrength:
    """The pick's lead over its nearer-scoring grid neighbour, the standard error of that lead (σ·√(1/n_p + 1/n_q),
    σ pooled over the grid's selection seeds and the runs at the pick, `df` its degrees of freedom) and the mark."""

    mark: Mark
    lead: float | None = None
    se: float | None = None
    sigma: float | None = None
    df: int = 0


def _pooled(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """The pooled std of groups around their own means, and its degrees of freedom."""
    ss = sum(sum((v - statistics.fmean(g)) ** 2 for v in g) for g in groups if len(g) > 1)
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    return (math.sqrt(ss / df), df) if df else (None, 0)


def pick_strength(scores: Mapping[float, Sequence[float | None]], pick: float, higher_is_better: bool = True,
                  at_bound: bool = False, at_pick: Sequence[float] = ()) -> PickStrength:
    """'bound binding' when the pick sits at the bound and still beats its inner neighbour (the best lr may lie beyond:
    growing the grid needs training); 'weak pick' when its lead over its better neighbour is under the standard error
    of the difference of the two means over the selection seeds, σ pooled over every multiplier's selection seeds and
    `at_pick` (the selection metric of the reported runs at the pick: the same configuration, other seeds); none
    otherwise, or without 2 finite selection scores at the pick and a neighbour."""
    fin = {float(m): [float(v) for v in vs if v is not None and math.isfinite(float(v))] for m, vs in scores.items()}
    grid, pick = sorted(fin), float(pick)
    if pick not in fin or len(fin[pick]) < 2:
        return PickStrength(Mark.NONE)
    i = grid.index(pick)
    nbrs = [grid[j] for j in (i - 1, i + 1) if 0 <= j < len(grid) and len(fin[grid[j]]) >= 2]
    if not nbrs:
        return PickStrength(Mark.NONE)
    sigma, df = _pooled([*fin.values(), list(at_pick)])
    sign = 1.0 if higher_is_better else -1.0
    leads = [(sign * (statistics.fmean(fin[pick]) - statistics.fmean(fin[m])),
              (sigma or 0.0) * math.sqrt(1 / len(fin[pick]) + 1 / len(fin[m]))) for m in nbrs]
    lead, se = min(leads)
    if at_bound and all(x > 0 for x, _ in leads):
        return PickStrength(Mark.BINDING, lead, se, sigma, df)
    return PickStrength(Mark.WEAK if lead < se else Mark.NONE, lead, se, sigma, df)


@dataclass(frozen=True)
class NoiseFloor:
    """The baseline against itself: its reported seeds split in two disjoint halves (`seeds_a` the lower seeds),
    tested as one more primary arm of its family (Welch, then Holm over the family's arms with their own p and this
    split: `m` tests in all); and over every split of the seeds into two halves (`splits`), how many the protocol
    calls different (`called_different`) under that same Holm step-down, the split one more arm beside the real ones
    (not p × m: an arm with a small p of its own lowers the step the split is judged at)."""

    seeds_a: tuple[int, ...]
    seeds_b: tuple[int, ...]
    diff: float
    low: float
    high: float
    p: float
    p_adj: float
    outcome: Outcome
    mde_corrected: float | None
    m: int
    splits: int
    called_different: int

    @property
    def rate(self) -> float:
        return self.called_different / self.splits if self.splits else 0.0


def noise_floor(base: Mapping[int, float], others: Sequence[float | None] = (), higher_is_better: bool = True
                ) -> NoiseFloor | None:
    """The A/A test of a family's baseline on a split of its reported seeds (no new runs); None under 4 seeds.
    `others`: the raw p of each of the family's primary arms (None: declared, not tested, p = 1 as `verdicts` counts
    it); the split joins them as one more arm under Holm, as a real arm would."""
    seeds = sorted(base)
    if len(seeds) < 4:
        return None
    half = len(seeds) // 2
    a, b = seeds[:half], seeds[half:2 * half]
    rest = [1.0 if p is None else float(p) for p in others]
    m = len(rest) + 1
    blank = [(i, [], "primary") for i in range(1, m)]  # the family's size for the split's MDE at α/m
    t = verdicts([base[s] for s in a], [(0, [base[s] for s in b], "primary"), *blank], higher_is_better)[0]
    p0 = t.p if t.p is not None else 1.0
    p_adj = holm([p0, *rest])[0]
    outcome = Outcome.NONE if p_adj is None or p_adj >= ALPHA else \
        (Outcome.BETTER if (t.ci.diff > 0) == higher_is_better else Outcome.WORSE)
    called, total = 0, 0
    pool = seeds[:2 * half]
    for first in itertools.combinations(pool[1:], half - 1):  # each split once: the lowest seed in the first half
        left = {pool[0], *first}
        p = welch_p([base[s] for s in left], [base[s] for s in pool if s not in left])
        total += 1
        called += p is not None and (holm([p, *rest])[0] or 1.0) < ALPHA
    return NoiseFloor(tuple(a), tuple(b), t.ci.diff, t.ci.low, t.ci.high, p0, float(p_adj or 1.0), outcome,
                      t.mde_corrected, m, total, called)


@dataclass(frozen=True)
class Speed:
    """How fast an arm reaches its baseline's final validation level: the median over its seeds of the first evaluated
    step at that level, as a ratio to the baseline's own median (< 1: fewer steps), with a seeded percentile bootstrap
    interval (each arm's seeds resampled). A run that never reaches it counts as later than any that did: `ratio` None
    when the arm's median run never does; `high` None when the interval is unbounded above (`low` likewise)."""

    ratio: float | None
    low: float | None
    high: float | None
    median: float | None  # the arm's median steps (None: its median run never reached the level)
    base_median: float | None
    n: int
    n_base: int
    level: float = 0.95


def _medians(x):
    """Row medians of a 2-D array whose inf marks a run that never reached the level: inf when either middle value is
    (as `median_steps`), never the nan that inf − inf gives."""
    import numpy as np

    x = np.sort(x, axis=-1)
    n = x.shape[-1]
    lo, hi = x[..., (n - 1) // 2], x[..., n // 2]
    return np.where(np.isinf(hi), np.inf, (lo + np.where(np.isinf(hi), 0.0, hi)) / 2)


def _median_inf(xs) -> float:
    import numpy as np

    return float(_medians(np.asarray(xs, dtype=float)[None, :])[0])


def speed_ratio(base_steps: Sequence[int | None], arm_steps: Sequence[int | None], level: float = 0.95,
                reps: int = 2000, seed: int = 0) -> Speed | None:
    """`Speed` from the per-seed steps to the level (None: never reached) of the baseline and the arm; None without
    steps in either, or when the baseline's own median run never reaches it (no ratio to take)."""
    import numpy as np

    if not base_steps or not arm_steps:
        return None
    b = np.asarray([math.inf if x is None else float(x) for x in base_steps])
    a = np.asarray([math.inf if x is None else float(x) for x in arm_steps])
    mb, ma = _median_inf(b), _median_inf(a)
    if not math.isfinite(mb) or mb <= 0:
        return None
    rng = np.random.default_rng(seed)
    ia, ib = rng.integers(0, len(a), (reps, len(a))), rng.integers(0, len(b), (reps, len(b)))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = _medians(a[ia]) / _medians(b[ib])  # inf / inf (neither median reached): nan, left out
    ratios = ratios[~np.isnan(ratios)]
    lo, hi = (np.quantile(ratios, [0.5 - level / 2, 0.5 + level / 2], method="inverted_cdf") if len(ratios)
              else (math.inf, math.inf))  # no interpolation: an unbounded resample stays inf, never inf − inf

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return Speed(finite(ma / mb), finite(float(lo)), finite(float(hi)), finite(ma), mb, len(a), len(b), level)


class Word(str, Enum):
    """One word per method from its two regimes (`regime_word`)."""

    HELPS = "helps at convergence"
    SPEEDS = "only speeds training up"
    HURTS = "hurts"
    NEITHER = "neither at this MDE"
    NO_FAMILY = "no converged family yet"
    NOT_AT_CONVERGENCE = "not decided: its verdict there is not at convergence"


def regime_word(budget: Outcome, converged: Outcome | None, at_convergence: bool, speed: Speed | None) -> Word:
    """The one word for a method, from its verdict at a budget (a still-learning family), its verdict in the converged
    family (None: no converged family with its runs yet; `at_convergence`: that verdict's basis is convergence, the
    family's baseline converged and the Δ held from 1× to 2×) and its speed (steps to the baseline's final level, as
    a ratio):
    - better at convergence: helps at convergence; worse there: hurts;
    - no difference at convergence: hurts when worse at a budget (it only slows training); only speeds training up
      when better at a budget and reaching the baseline's level in fewer steps (ratio < 1), or when its whole speed
      interval lies under 1; else neither at this MDE."""
    if converged is None:
        return Word.NO_FAMILY
    if not at_convergence or converged == Outcome.UNTESTED:
        return Word.NOT_AT_CONVERGENCE
    if converged == Outcome.BETTER:
        return Word.HELPS
    if converged == Outcome.WORSE or budget == Outcome.WORSE:
        return Word.HURTS
    fewer = speed is not None and speed.ratio is not None and speed.ratio < 1
    clearly = speed is not None and speed.high is not None and speed.high < 1
    return Word.SPEEDS if (budget == Outcome.BETTER and fewer) or clearly else Word.NEITHER


@dataclass(frozen=True)
class ProjectTest:
    """One primary test of a scale: its raw p (unrounded), its outcome in its own family, its Holm p over the scale,
    and whether the verdict depends on the family chosen."""

    name: str
    p: float | None
    outcome: Outcome
    p_project: float | None = None
    flips: bool = False


def project_holm(tests: Sequence[tuple[str, float | None, Outcome]]) -> list[ProjectTest]:
    """Holm over every primary test given (a test without p counts as p = 1)."""
    adjusted = holm([1.0 if p is None else p for _, p, _ in tests])
    out = []
    for (name, p, outcome), adj in zip(tests, adjusted):
        adj = None if p is None else adj
        held = outcome in (Outcome.BETTER, Outcome.WORSE)
        now = adj is not None and adj < ALPHA
        out.append(ProjectTest(name, p, outcome, adj, held != now and p is not None))
    return out


__all__ = ["Basis", "Claim", "ClaimHere", "Convergence", "Mark", "NoiseFloor", "PickStrength", "ProjectTest", "Reach",
           "Scale", "Speaks", "Speed", "State", "Trend", "Word", "convergence", "delta_trend", "equivalence_power",
           "mde", "noise_floor", "paired_gain", "pick_strength", "project_holm", "reach", "regime_word",
           "seeds_needed", "speaks_to", "speed_ratio", "verdict_basis"]
