"""What a verdict can rule out, in the papers' own terms: pure functions (no I/O) on lists of floats and small
dataclasses, shared by the table renderers and the findings.

- The papers state their gains on their own scale (+0.6…+1.0 top-1 at about 20 % ImageNet error). An effect carries
  across scales as a *relative* one: the fall in error (100 − accuracy) as a share of the baseline's error, or for a
  loss the fall as a share of the loss above its floor. A family's MDE in those terms says what size of effect its
  "no difference detected" rules out, beside the claim's.
- The seeds per arm a paper-sized effect (the claim's relative fall applied to our baseline) would need.
- The convergence rule tied to that effect: the baseline's gain at 2× its steps, with its interval, against the
  paper-sized effect here; when it is not under it, the verdicts are at a budget and Δ's trend from 1× to 2× is given.
- An lr pick's strength: a lead over its neighbour under one standard error is a weak pick; a pick at the bound that
  still beats its inner neighbour means the bound binds.
- A project-wide Holm family over every primary test of a scale, beside the per-table families.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from .stats import ALPHA, DiffCI, holm, welch_ci


@dataclass(frozen=True)
class Scale:
    """How a metric turns into room for improvement: an accuracy in % (error = top − value) or a loss (room =
    value − floor; floor 0 when no irreducible loss is known, which understates relative effects)."""

    higher_is_better: bool = True
    top: float = 100.0
    floor: float = 0.0

    def room(self, value: float) -> float:
        """The error (accuracy) or the loss above the floor at `value`."""
        return self.top - value if self.higher_is_better else value - self.floor

    def relative(self, effect: float, at: float) -> float:
        """An improvement of `effect` (metric units, positive = better) as a share of the room at `at`."""
        room = self.room(at)
        if room <= 0:
            raise ValueError(f"no room for improvement at {at} (top {self.top}, floor {self.floor}): the relative "
                             "effect is undefined; check the metric's direction and its top/floor")
        return effect / room

    def absolute(self, relative: float, at: float) -> float:
        """The improvement (metric units) that is a `relative` share of the room at `at`."""
        return relative * self.room(at)


@dataclass(frozen=True)
class Claim:
    """A paper's claim: its baseline and its method's value, on the paper's own scale."""

    who: str
    baseline: float
    conditioned: float
    scale: Scale = Scale()

    @property
    def effect(self) -> float:
        """The claimed improvement (positive = better)."""
        sign = 1.0 if self.scale.higher_is_better else -1.0
        return sign * (self.conditioned - self.baseline)

    @property
    def relative(self) -> float:
        return self.scale.relative(self.effect, self.baseline)


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = 0.8) -> int | None:
    """Seeds per arm for a two-sided two-sample test to detect `effect` with this power (normal approximation):
    n = ⌈2 · (z_{1−α/2} + z_{power})² · sd² / effect²⌉, sd the pooled standard deviation of the two arms. At least 2;
    None when the effect is not positive."""
    if effect <= 0 or not math.isfinite(effect):
        return None
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return max(2, math.ceil(2 * (z * sd / effect) ** 2))


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float | None:
    """√(((n_a − 1)s_a² + (n_b − 1)s_b²) / (n_a + n_b − 2)); None with fewer than 2 values in a group."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a), statistics.variance(b)
    return math.sqrt(((len(a) - 1) * va + (len(b) - 1) * vb) / (len(a) + len(b) - 2))


@dataclass(frozen=True)
class Arm:
    """One row of a family: its label, its values, and the paper's claim for it (None: a rival method)."""

    label: str
    values: list[float]
    claim: Claim | None = None


@dataclass(frozen=True)
class Reach:
    """What a family's test can rule out: its MDE as a relative effect beside each claim, translated here."""

    family: str
    mde: float
    baseline: float  # our baseline's mean
    scale: Scale
    rows: list[tuple[Arm, float, int | None]]  # (arm with a claim, the claim's size here, seeds per arm needed)

    @property
    def relative_mde(self) -> float:
        return self.scale.relative(self.mde, self.baseline)

    def ratio(self, arm: Arm) -> float:
        """The MDE's relative effect over the arm's claimed one: 'no difference detected' rules out only effects
        this many times the claim."""
        assert arm.claim is not None
        return self.relative_mde / arm.claim.relative if arm.claim.relative > 0 else math.inf

    @property
    def smallest(self) -> float | None:
        """The smallest claimed effect, translated here (the effect the table tests)."""
        return min((here for _, here, _ in self.rows), default=None)


def reach(family: str, base: Sequence[float], mde: float, arms: Sequence[Arm], scale: Scale) -> Reach:
    """The family's reach: each claimed arm's effect here (its relative claim at our baseline's room) and the seeds
    per arm that effect needs at the pooled sd of the baseline and the arm."""
    mean = statistics.fmean(base)
    rows = []
    for arm in arms:
        if arm.claim is None or arm.claim.effect <= 0:
            continue
        here = scale.absolute(arm.claim.relative, mean)
        sd = pooled_sd(base, arm.values)
        rows.append((arm, here, seeds_needed(here, sd) if sd is not None else None))
    return Reach(family, mde, mean, scale, rows)


def _pct(x: float) -> str:
    return f"{100 * x:.2g} %" if abs(x) < 0.1 else f"{100 * x:.0f} %"


def _room_word(scale: Scale) -> str:
    return "error" if scale.higher_is_better else ("loss" if scale.floor == 0 else f"loss above {scale.floor:g}")


def room_text(scale: Scale, at: float, digits: int = 2) -> str:
    """"3.23 % error" (an accuracy) or "loss 4.428" (a loss above 0) or "loss above 4.1: 0.300"."""
    room = scale.room(at)
    if scale.higher_is_better:
        return f"{room:.{digits}f} % error"
    return f"loss {room:.{digits + 1}f}" if scale.floor == 0 else f"{_room_word(scale)} {room:.{digits + 1}f}"


def reach_text(r: Reach, digits: int = 2) -> str:
    """One line: the MDE's relative effect, each claim's, how many times the claim 'no difference' rules out, the
    paper-sized effect here and the seeds per arm it would need."""
    room = _room_word(r.scale)
    head = (f"Reach ({r.family}): the MDE {r.mde:.{digits + 1}g} is a {_pct(r.relative_mde)} relative fall in {room} "
            f"at this baseline's {room_text(r.scale, r.baseline, digits)}")
    if not r.rows:
        return head + "; no row of this family has a paper's number to set beside it."
    claims = "; ".join(
        f"{a.label} {_pct(a.claim.relative)} ({a.claim.baseline:g} → {a.claim.conditioned:g}; "  # type: ignore[union-attr]
        f"MDE {r.ratio(a):.1f}× it)" for a, _, _ in r.rows)
    need = "; ".join(f"{a.label} {here:.{digits}g} → {'–' if n is None else f'{n:,}'} seeds"
                     for a, here, n in r.rows)
    return (f"{head}; the papers claim (relative fall in {room}, their numbers): {claims}. 'No difference detected' "
            f"here rules out only effects of at least the MDE's size. A paper-sized effect here, and the seeds per arm "
            f"it would need (α 0.05 two-sided, power 0.8, pooled sd of baseline and row): {need}.")


def speaks_to(r: Reach, words: dict[str, str]) -> tuple[list[str], list[str]]:
    """Which claims a family's verdicts can speak to (a 'better' or 'worse' verdict, or a 'no difference' whose MDE is
    at most the claim's size here) and which they cannot (a 'no difference' with a larger MDE). `words`: label →
    verdict."""
    can, cannot = [], []
    for a, here, _ in r.rows:
        word = words.get(a.label, "–")
        if word.startswith(("better", "worse")):
            can.append(f"{a.label} ({word.split(' (')[0]})")
        elif word.startswith("no difference") and r.mde <= here:
            can.append(f"{a.label} (no difference, MDE within the claim)")
        elif word.startswith("no difference"):
            cannot.append(f"{a.label} (MDE {r.ratio(a):.1f}× the claim)")
        else:
            cannot.append(f"{a.label} (not tested)")
    return can, cannot


def paired_gain(one: dict[int, float], two: dict[int, float], higher_is_better: bool = True,
                level: float = 0.95) -> DiffCI | None:
    """The mean gain from `one` to `two` over the seeds both have (a gain is an improvement: a lower loss for a
    loss), with a paired t interval; None with fewer than 2 such seeds."""
    from scipy import stats

    seeds = sorted(set(one) & set(two))
    if len(seeds) < 2:
        return None
    sign = 1.0 if higher_is_better else -1.0
    d = [sign * (two[s] - one[s]) for s in seeds]
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1)) * sd / math.sqrt(len(d))
    return DiffCI(mean, mean - half, mean + half, level, "paired-t")


@dataclass(frozen=True)
class Trend:
    """Δ to the baseline at 1× and at 2× over the same seeds, and the change with a Welch interval over the per-seed
    gains of the two arms."""

    label: str
    at1: float
    at2: float
    change: DiffCI | None
    n: int


def delta_trend(label: str, base1: dict[int, float], base2: dict[int, float], arm1: dict[int, float],
                arm2: dict[int, float]) -> Trend | None:
    """Δ (arm − baseline) at 1× and 2× on the seeds each arm has at both lengths; change = mean gain of the arm −
    mean gain of the baseline (1× → 2×), with Welch's interval. None with fewer than 2 such seeds in an arm."""
    sb, sa = sorted(set(base1) & set(base2)), sorted(set(arm1) & set(arm2))
    if len(sb) < 2 or len(sa) < 2:
        return None
    at1 = statistics.fmean(arm1[s] for s in sa) - statistics.fmean(base1[s] for s in sb)
    at2 = statistics.fmean(arm2[s] for s in sa) - statistics.fmean(base2[s] for s in sb)
    change = welch_ci([base2[s] - base1[s] for s in sb], [arm2[s] - arm1[s] for s in sa])
    return Trend(label, at1, at2, change, min(len(sa), len(sb)))


def converged(gain: DiffCI | None, effect: float | None) -> bool | None:
    """The convergence test: the whole 95 % interval of the baseline's 2× gain under the effect the table tests; None
    when it cannot be judged (no gain measured, or no paper's effect)."""
    return None if gain is None or effect is None else gain.high < effect


def convergence_text(family: str, gain: DiffCI | None, n: int, effect: float | None, effect_why: str,
                     trends: Sequence[Trend], unit: str = "points", digits: int = 2) -> str:
    """The convergence line: converged when the whole 95 % interval of the baseline's 2× gain lies under the effect
    the table tests; otherwise the verdicts are at a budget, and each row's Δ trend from 1× to 2× follows."""
    if gain is None:
        return (f"Convergence ({family}): not tested (fewer than 2 seeds finished at both lengths).")
    units = f" {unit}" if unit else ""
    said = (f"Convergence ({family}), judged against the effect the table tests: at 2× its steps the baseline gains "
            f"{gain.text(digits)}{units} (95 % paired interval, the same {n} seeds at 1×)")
    if effect is None:
        return said + "; no paper's number sets an effect to judge it against: convergence not judged."
    ok = converged(gain, effect)
    said += (f", {'under' if ok else 'NOT under'} the paper-sized effect here, {effect:.{digits}g}{units} "
             f"({effect_why}): ")
    if ok:
        return said + "converged."
    said += "NOT converged, so the verdicts are at a budget (they may change with length)"
    parts = [f"{t.label} {t.at1:+.{digits}f} → {t.at2:+.{digits}f}"
             + (f" (change {t.change.text(digits)}, n={t.n})" if t.change else "") for t in trends]
    return said + (f". Δ from 1× to 2× on the same seeds: {'; '.join(parts)}." if parts else ".")


def pick_strength(scores: dict[float, Sequence[float]], pick: float, higher_is_better: bool = True,
                  at_bound: bool = False) -> str:
    """'weak pick' when the pick's mean selection score leads its better grid neighbour by less than one standard
    error of the difference (√(s_p²/n_p + s_q²/n_q) over the selection seeds); 'bound binding' when the pick sits at
    the bound and still beats its inner neighbour (the best lr may lie beyond: growing the grid needs training);
    '' otherwise (or with fewer than 2 finite seeds at the pick or its neighbours)."""
    grid = sorted(float(m) for m in scores)
    finite = {m: [float(v) for v in scores[m] if v is not None and math.isfinite(float(v))] for m in scores}
    finite = {float(m): v for m, v in finite.items()}
    if float(pick) not in finite or len(finite[float(pick)]) < 2:
        return ""
    i = grid.index(float(pick))
    nbrs = [grid[j] for j in (i - 1, i + 1) if 0 <= j < len(grid) and len(finite.get(grid[j], [])) >= 2]
    if not nbrs:
        return ""
    sign = 1.0 if higher_is_better else -1.0
    p = finite[float(pick)]
    leads = []
    for m in nbrs:
        q = finite[m]
        lead = sign * (statistics.fmean(p) - statistics.fmean(q))
        se = math.sqrt(statistics.variance(p) / len(p) + statistics.variance(q) / len(q))
        leads.append((lead, se))
    if at_bound and all(lead > 0 for lead, _ in leads):
        return "bound binding"
    lead, se = min(leads)
    return "weak pick" if lead < se else ""


@dataclass(frozen=True)
class PrimaryTest:
    """One primary test of the scale: a name, its raw p, and its verdict in its own family."""

    name: str
    p: float | None
    word: str


def project_holm(tests: Sequence[PrimaryTest]) -> list[tuple[PrimaryTest, float | None, bool]]:
    """Holm over every primary test given (a test without p counts as p = 1): (test, adjusted p, whether its
    verdict flips: 'better'/'worse' in its family but adjusted p ≥ 0.05 here, or the reverse)."""
    adjusted = holm([1.0 if t.p is None else t.p for t in tests])
    out = []
    for t, adj in zip(tests, adjusted):
        adj = None if t.p is None else adj
        held = t.word.startswith(("better", "worse"))
        now = adj is not None and adj < ALPHA
        out.append((t, adj, held != now and t.p is not None))
    return out
