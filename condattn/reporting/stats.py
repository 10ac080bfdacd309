"""The statistics every report uses: mean ± sample std over seeds, and a confidence interval for the
difference of two groups' means (Welch's t interval; a seeded bootstrap when scipy is absent)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1); std is 0.0 for a single value. Empty: ValueError."""
    if not values:
        raise ValueError("mean_std of no values")
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_mean_std(values: Sequence[float], digits: int = 2) -> str:
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


@dataclass(frozen=True)
class DiffCI:
    diff: float  # mean(b) − mean(a)
    low: float
    high: float
    level: float
    method: str  # "welch-t" | "bootstrap"

    def text(self, digits: int = 2) -> str:
        return f"{self.diff:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def welch_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> DiffCI:
    """Welch's t interval for mean(b) − mean(a) (unequal variances). Needs ≥ 2 values per group."""
    from scipy import stats

    na, nb = len(a), len(b)
    ma, sa = mean_std(a)
    mb, sb = mean_std(b)
    va, vb = sa * sa / na, sb * sb / nb
    diff = mb - ma
    se = math.sqrt(va + vb)
    if se == 0.0:
        return DiffCI(diff, diff, diff, level, "welch-t")
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return DiffCI(diff, diff - half, diff + half, level, "welch-t")


def bootstrap_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95, reps: int = 10000,
                 seed: int = 0) -> DiffCI:
    """Percentile bootstrap interval for mean(b) − mean(a), resampling each group (seeded: reproducible)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    da = rng.choice(xa, size=(reps, len(xa))).mean(1)
    db = rng.choice(xb, size=(reps, len(xb))).mean(1)
    lo, hi = np.quantile(db - da, [0.5 - level / 2, 0.5 + level / 2])
    return DiffCI(float(xb.mean() - xa.mean()), float(lo), float(hi), level, "bootstrap")


def diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> DiffCI | None:
    """CI for mean(b) − mean(a): Welch when scipy is installed, else bootstrap; None with < 2 values in a group."""
    if len(a) < 2 or len(b) < 2:
        return None
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        return bootstrap_ci(a, b, level)
    return welch_ci(a, b, level)


def mde(std: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The minimum detectable effect of a two-sided two-sample t-test with n seeds per arm at this power:
    (t_{1−α/2, df} + t_{power, df}) · s · √(2/n), df = 2n − 2, s the baseline's std (the usual normal-theory
    approximation with t quantiles). None below 2 seeds."""
    from scipy import stats

    if n < 2:
        return None
    df = 2 * n - 2
    return float(stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * std * math.sqrt(2 / n)


MDE_FORMULA = "MDE = (t_{0.975,df} + t_{0.8,df}) · s_baseline · √(2/n), df = 2n − 2 (two-sided α = 0.05, 80% power)"


def steps_to_target(curve: Sequence[tuple[int, float]], target: float, higher_is_better: bool = True) -> int | None:
    """The first evaluated step whose value reaches `target` (≥, or ≤ when lower is better); None if none does."""
    for step, value in curve:
        if (value >= target) if higher_is_better else (value <= target):
            return int(step)
    return None


def median_steps(steps: Sequence[int | None]) -> float | None:
    """The median over seeds of steps-to-target, a run that never reached it counting as later than any that did;
    None when the median is such a run (or there are none)."""
    if not steps:
        return None
    ranked = sorted(steps, key=lambda s: math.inf if s is None else s)
    mid = ranked[(len(ranked) - 1) // 2], ranked[len(ranked) // 2]
    return None if None in mid else (mid[0] + mid[1]) / 2  # type: ignore[operator]


def last_quarter_change(curve: Sequence[tuple[int, float]], total_steps: int) -> float | None:
    """The curve's last value minus its value at the last evaluation at or before 3/4 of training (the convergence
    figure: how much a run still gains over its last quarter). None without an evaluation in both places."""
    before = [v for s, v in curve if s <= 0.75 * total_steps]
    if not before or not curve or curve[-1][0] <= 0.75 * total_steps:
        return None
    return curve[-1][1] - before[-1]
