"""Pure statistics on numbers: mean ± sample std over seeds; a confidence interval for the difference of two groups'
means (Welch's t interval; a seeded bootstrap when scipy is absent); the tests behind a verdict (Welch's p, an exact
permutation p) and their corrections for the comparisons made beside them (Holm within a family of declared hypotheses,
Benjamini–Hochberg q for exploratory rows); the minimum detectable effect at a given α; steps-to-target on a curve.
Nothing here reads a file or formats text."""

from __future__ import annotations

import functools
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1); std is 0.0 for a single value. Empty: ValueError."""
    if not values:
        raise ValueError("mean_std of no values")
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclass(frozen=True)
class DiffCI:
    diff: float  # mean(b) − mean(a)
    low: float
    high: float
    level: float
    method: str  # "welch-t" | "bootstrap" | "paired-t"

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


def finite(values: Sequence[float]) -> list[float]:
    """The finite values (a diverged run's NaN or inf is not a measurement)."""
    return [float(v) for v in values if math.isfinite(v)]


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The two-sided p of Welch's t-test for mean(b) ≠ mean(a) over the finite values; None with < 2 in a group; 1.0
    when both groups are constant and equal, 0.0 when constant and different."""
    from scipy import stats

    a, b = finite(a), finite(b)
    if len(a) < 2 or len(b) < 2:
        return None
    if statistics.pvariance(a) == 0 and statistics.pvariance(b) == 0:
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    with warnings.catch_warnings():  # nearly identical groups: scipy warns of precision loss, the p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(b, a, equal_var=False).pvalue)


def permutation_p(a: Sequence[float], b: Sequence[float], max_exact: int = 200_000, reps: int = 100_000,
                  seed: int = 0) -> float | None:
    """The two-sided permutation p of |mean(b) − mean(a)|: exact over every relabelling of the pooled values while
    there are at most `max_exact` of them (C(10+10, 10) = 184,756), else a seeded Monte Carlo estimate (the observed
    labelling counted). Its smallest possible value is 2/C(na+nb, na) (with 5 per arm: 2/252 = 0.0079)."""
    import numpy as np

    a, b = finite(a), finite(b)
    if len(a) < 2 or len(b) < 2:
        return None
    pooled = np.asarray([*a, *b], dtype=float)
    n, nb = len(pooled), len(b)
    total = pooled.sum()
    observed = abs(float(np.mean(b)) - float(np.mean(a)))
    tol = 1e-12 * max(1.0, float(np.abs(pooled).max()))

    def diffs(sum_b):
        return np.abs(sum_b / nb - (total - sum_b) / (n - nb))

    if math.comb(n, nb) <= max_exact:
        sums = pooled[_combinations(n, nb)].sum(1)
        return float(np.mean(diffs(sums) >= observed - tol))
    rng = np.random.default_rng(seed)
    sums = np.array([pooled[rng.permutation(n)[:nb]].sum() for _ in range(reps)])
    return float((np.sum(diffs(sums) >= observed - tol) + 1) / (reps + 1))


@functools.lru_cache(maxsize=8)
def _combinations(n: int, k: int):
    """Every k-subset of range(n) as rows of an index array (shared by every test of the same group sizes)."""
    import itertools

    import numpy as np

    return np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), k)),
                       dtype=np.int64).reshape(-1, k)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order; None (or NaN) entries are left out
    of the family and stay None (callers that declared them count them as p = 1 first: see protocol.verdicts)."""
    pvalues = [p if p is not None and math.isfinite(p) else None for p in pvalues]
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[arg-type,return-value]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))  # type: ignore[arg-type]
        out[i] = running
    return out


def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg q-values (false discovery rate), in the input order; None (or NaN) entries are left out."""
    pvalues = [p if p is not None and math.isfinite(p) else None for p in pvalues]
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[arg-type,return-value]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = idx[rank]
        running = min(running, m * float(pvalues[i]) / (rank + 1))  # type: ignore[arg-type]
        out[i] = running
    return out


def mde(std: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The minimum detectable effect of a two-sided two-sample t-test with n seeds per arm at this power:
    (t_{1−α/2, df} + t_{power, df}) · s · √(2/n), df = 2n − 2, s the baseline's std (the usual normal-theory
    approximation with t quantiles). None below 2 seeds."""
    from scipy import stats

    if n < 2:
        return None
    df = 2 * n - 2
    return float(stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * std * math.sqrt(2 / n)


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


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float | None:
    """√(((n_a − 1)s_a² + (n_b − 1)s_b²) / (n_a + n_b − 2)); None with fewer than 2 values in a group."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a), statistics.variance(b)
    return math.sqrt(((len(a) - 1) * va + (len(b) - 1) * vb) / (len(a) + len(b) - 2))
