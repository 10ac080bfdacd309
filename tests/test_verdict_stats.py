"""The tests behind a verdict (reporting/stats.py) against scipy on fixed inputs and against hand computations: Welch's
p, the exact permutation p (and its floor 2/C(2n, n)), Holm and Benjamini–Hochberg adjustments, the verdict word and
the number formats that must never round a value away."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from condattn.reporting.stats import (
    DiffCI,
    Verdict,
    benjamini_hochberg,
    fmt_num,
    fmt_p,
    holm,
    mde,
    permutation_p,
    welch_p,
)

A = [96.1, 95.8, 96.4, 95.9, 96.0]
B = [96.9, 96.5, 96.8, 97.1, 96.7]


def test_welch_p_matches_scipy_and_handles_degenerate_groups():
    assert welch_p(A, B) == pytest.approx(stats.ttest_ind(B, A, equal_var=False).pvalue, rel=1e-12)
    assert welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0 and welch_p([1.0, 1.0], [2.0, 2.0]) == 0.0
    assert welch_p([1.0], B) is None


def test_exact_permutation_p_matches_scipy_and_has_the_floor_the_issue_names():
    want = stats.permutation_test((B, A), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent",
                                  n_resamples=np.inf).pvalue
    assert permutation_p(A, B) == pytest.approx(want, rel=1e-12)
    # complete separation with 5 per arm: the smallest p an exact test can give, 2/252 = 0.0079 > 0.05/14
    assert permutation_p([0, 1, 2, 3, 4], [10, 11, 12, 13, 14]) == pytest.approx(2 / 252)
    assert permutation_p(list(range(8)), list(range(100, 108))) == pytest.approx(2 / math.comb(16, 8))
    mc = permutation_p(list(range(12)), list(range(5, 17)), max_exact=10, reps=20_000)  # the Monte Carlo path
    exact = permutation_p(list(range(12)), list(range(5, 17)))
    assert mc == pytest.approx(exact, abs=0.01)


def test_holm_and_bh_against_hand_computation_and_order():
    p = [0.01, 0.04, 0.03, None, 0.002]
    # Holm, sorted 0.002·4, 0.01·3, 0.03·2, 0.04·1 -> 0.008, 0.03, 0.06, max(0.04, 0.06)
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, None, 0.008])
    # BH: 0.002·4/1, 0.01·4/2, 0.03·4/3, 0.04·4/4 -> 0.008, 0.02, 0.04, 0.04 (monotone from the top)
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, None, 0.008])
    assert holm([0.9, 0.8]) == [1.0, 1.0] and holm([]) == [] and benjamini_hochberg([None]) == [None]


def test_the_verdict_follows_the_adjusted_p_not_the_interval():
    ci = DiffCI(0.7, 0.16, 1.24, 0.95, "welch-t")  # the interval excludes zero ...
    assert Verdict(ci, 0.01, 0.10, 0.02, "holm", 0.68, 1.09).word == "no difference detected (MDE 1.09)"
    assert Verdict(ci, 0.001, 0.01, 0.01, "holm", 0.68, 1.09).word == "better"
    assert Verdict(ci, 0.001, 0.01, 0.01, "holm", 0.68, 1.09, higher_is_better=False).word == "worse"  # a loss
    down = DiffCI(-25.0, -28.0, -22.0, 0.95, "welch-t")
    assert Verdict(down, 1e-9, 1e-8, 1e-5, "holm", 0.68, 1.09).word == "worse"
    assert Verdict(None, None, None, None, "holm", None, None).word == "–"


def test_mde_at_the_corrected_alpha_is_larger_and_formats_keep_digits():
    assert mde(0.33, 10, alpha=0.05 / 8) > mde(0.33, 10) > mde(0.33, 20)
    assert fmt_num(0.0147) == "0.0147" and fmt_num(1.0912) == "1.09" and fmt_num(None) == "–"
    assert fmt_p(0.027) == "0.027" and fmt_p(0.0079) == "0.0079" and fmt_p(3.1e-6) == "3.1e-06"


def test_nan_never_wipes_a_family_and_a_declared_row_without_a_test_still_counts():
    from condattn.reporting.protocol import verdicts

    assert holm([math.nan, 0.001, 0.01]) == [None, pytest.approx(0.002), pytest.approx(0.01)]
    assert welch_p([1.0, 2.0, math.nan], [3.0, 4.0, 5.0]) == pytest.approx(welch_p([1.0, 2.0], [3.0, 4.0, 5.0]))
    base = [96.0, 96.2, 95.9, 96.1, 96.0]
    arms = [("a", [96.9, 97.0, 96.8, 97.1, 96.9], "primary"), ("b", [96.0], "primary"),
            ("c", [96.1, 96.0, 96.2, 95.9, 96.0], "primary")]
    out = verdicts(base, arms)
    assert out["b"].p is None and out["b"].p_adj is None  # one seed: no test ...
    raw_a = welch_p(base, arms[0][1])
    assert out["a"].p_adj == pytest.approx(3 * raw_a)  # ... but the family is the 3 declared rows, not 2
    assert out["a"].mde_corrected == pytest.approx(mde(statistics.stdev(base), 5, alpha=0.05 / 3))
