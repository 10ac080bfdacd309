"""The statistics module (condattn/stats/), each rule on constructed values with the answer worked out here: Welch's p,
the exact permutation p, Holm and Benjamini–Hochberg, the verdict, the MDE, seeds for a paper-sized effect (baseline
spread, corrected α), the convergence rule (an equivalence test that a flat baseline passes with the length check's 5
seeds), the verdict's basis (at convergence / at a budget), the weak lr pick, the noise floor and the project-wide
Holm family on unrounded p."""

from __future__ import annotations

import math
import statistics
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from condattn.stats import (
    Basis,
    Claim,
    DiffCI,
    Mark,
    Outcome,
    Scale,
    Speaks,
    Speed,
    State,
    Trend,
    Verdict,
    Word,
    benjamini_hochberg,
    convergence,
    delta_trend,
    holm,
    mde,
    noise_floor,
    paired_gain,
    permutation_p,
    pick_strength,
    pooled_sd,
    project_holm,
    reach,
    regime_word,
    seeds_needed,
    speaks_to,
    speed_ratio,
    verdict_basis,
    verdicts,
    welch_p,
)

A = [96.1, 95.8, 96.4, 95.9, 96.0]
B = [96.9, 96.5, 96.8, 97.1, 96.7]


def test_welch_p_matches_scipy_and_handles_degenerate_groups():
    assert welch_p(A, B) == pytest.approx(stats.ttest_ind(B, A, equal_var=False).pvalue, rel=1e-12)
    assert welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0 and welch_p([1.0, 1.0], [2.0, 2.0]) == 0.0
    assert welch_p([1.0], B) is None


def test_exact_permutation_p_matches_scipy_and_has_its_floor():
    want = stats.permutation_test((B, A), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent",
                                  n_resamples=np.inf).pvalue
    assert permutation_p(A, B) == pytest.approx(want, rel=1e-12)
    assert permutation_p([0, 1, 2, 3, 4], [10, 11, 12, 13, 14]) == pytest.approx(2 / 252)  # 2/C(10, 5)
    mc = permutation_p(list(range(12)), list(range(5, 17)), max_exact=10, reps=20_000)
    assert mc == pytest.approx(permutation_p(list(range(12)), list(range(5, 17))), abs=0.01)


def test_holm_and_bh_against_hand_computation_and_order():
    p = [0.01, 0.04, 0.03, None, 0.002]
    # Holm, sorted 0.002·4, 0.01·3, 0.03·2, 0.04·1 -> 0.008, 0.03, 0.06, max(0.04, 0.06)
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, None, 0.008])
    # BH: 0.002·4/1, 0.01·4/2, 0.03·4/3, 0.04·4/4 -> 0.008, 0.02, 0.04, 0.04 (monotone from the top)
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, None, 0.008])
    assert holm([0.9, 0.8]) == [1.0, 1.0] and holm([]) == [] and benjamini_hochberg([None]) == [None]
    assert holm([math.nan, 0.001, 0.01]) == [None, pytest.approx(0.002), pytest.approx(0.01)]


def test_the_verdict_follows_the_adjusted_p_not_the_interval():
    ci = DiffCI(0.7, 0.16, 1.24, 0.95, "welch-t")  # the interval excludes zero ...
    assert Verdict(ci, 0.01, 0.10, 0.02, "holm", 0.68, 1.09).outcome == Outcome.NONE
    assert Verdict(ci, 0.001, 0.01, 0.01, "holm", 0.68, 1.09).outcome == Outcome.BETTER
    assert Verdict(ci, 0.001, 0.01, 0.01, "holm", 0.68, 1.09, higher_is_better=False).outcome == Outcome.WORSE
    assert Verdict(None, None, None, None, "holm", None, None).outcome == Outcome.UNTESTED


def test_a_declared_row_without_a_test_still_counts_and_the_mde_is_at_the_corrected_alpha():
    base = [96.0, 96.2, 95.9, 96.1, 96.0]
    arms = [("a", [96.9, 97.0, 96.8, 97.1, 96.9], "primary"), ("b", [96.0], "primary"),
            ("c", [96.1, 96.0, 96.2, 95.9, 96.0], "primary")]
    out = verdicts(base, arms)
    assert out["b"].p is None and out["b"].p_adj is None
    assert out["a"].p_adj == pytest.approx(3 * welch_p(base, arms[0][1]))  # the family is the 3 declared rows
    assert out["a"].alpha_corrected == pytest.approx(0.05 / 3)
    # MDE = (t_{1−α/2, 8} + t_{0.8, 8}) · s · √(2/5)
    s = statistics.stdev(base)
    want = (stats.t.ppf(1 - 0.05 / 6, 8) + stats.t.ppf(0.8, 8)) * s * math.sqrt(2 / 5)
    assert out["a"].mde_corrected == pytest.approx(want)
    assert mde(0.33, 10, alpha=0.05 / 8) > mde(0.33, 10) > mde(0.33, 20)


def test_relative_effects_in_the_papers_terms():
    # +1.0 top-1 at 80.3 % (19.7 % error) is a 5.1 % relative fall in error
    assert Claim("CET", 80.3, 81.3).relative == pytest.approx(1.0 / 19.7)
    loss = Scale(higher_is_better=False)
    assert Claim("CET", 2.41, 2.36, loss).relative == pytest.approx(0.05 / 2.41)
    with pytest.raises(ValueError, match="no room for improvement at 100"):
        Scale().relative(0.1, 100.0)


def test_seeds_for_a_paper_sized_effect_use_the_baselines_spread_at_the_corrected_alpha():
    # table 1's ViT: a baseline of std 0.38 around 96.77 (10 seeds), SCA broke the model (std 2.74)
    base = [96.77 + (0.36 if i % 2 else -0.36) for i in range(10)]  # std = 0.36 · √(10/9) = 0.3795
    broken = [69.63 + (2.6 if i % 2 else -2.6) for i in range(10)]
    sd = 0.36 * math.sqrt(10 / 9)
    assert statistics.stdev(base) == pytest.approx(sd)
    sca = Claim("SCA", 80.7, 81.7)  # 1.0 / 19.3 = 5.18 % relative; here 5.18 % of 3.23 % error = 0.1674
    r = reach("vit_base", base, 0.595, [("SCA", sca)], Scale(), alpha=0.05 / 3)
    (row,) = r.rows
    assert row.here == pytest.approx(3.23 / 19.3, rel=1e-3)
    # the normal approximation ⌈2 (z_{1−α/2} + z_{0.8})² sd² / effect²⌉ at α = 0.05/3: z = 2.394 + 0.842 = 3.236,
    # 2·(3.236·0.3795/0.1674)² → 108; the t distribution's (df = 2n − 2) quantiles are larger: the smallest n with
    # (t_{1−α/2,2n−2} + t_{0.8,2n−2}) · sd · √(2/n) ≤ effect is 110
    z = NormalDist().inv_cdf(1 - 0.05 / 6) + NormalDist().inv_cdf(0.8)
    assert z == pytest.approx(3.236, abs=1e-3)
    assert math.ceil(2 * (z * sd / row.here) ** 2) == 108
    assert row.seeds == 110
    assert mde(sd, 110, alpha=0.05 / 3) <= row.here < mde(sd, 109, alpha=0.05 / 3)
    assert (r.sd, r.alpha) == (pytest.approx(sd), pytest.approx(0.05 / 3))  # the result says both
    # the old rule (pooled with the broken row, α 0.05) asked for about 2,000 seeds
    assert seeds_needed(row.here, pooled_sd(base, broken)) > 1500
    assert seeds_needed(10.0, 0.1) == 2 and seeds_needed(0.0, 1.0) is None


def test_seeds_needed_come_from_the_t_distribution_not_the_normal_approximation():
    # vit_hard's baseline (σ 0.928, α 0.05/3) and a 1.7-point effect (CET's claimed 5.1 % relative fall at 33.1 %
    # error): z says ⌈2·(3.236·0.928/1.7)²⌉ = 7; with t at df = 2n − 2 the MDE at n = 7 is
    # (t_{0.99167,12} + t_{0.8,12})·0.928·√(2/7) = (2.779 + 0.873)·0.496 = 1.81 > 1.7, at n = 8 it is 1.66 ≤ 1.7
    sd, effect, alpha = 0.928, 1.7, 0.05 / 3
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(0.8)
    assert math.ceil(2 * (z * sd / effect) ** 2) == 7
    t7 = (stats.t.ppf(1 - alpha / 2, 12) + stats.t.ppf(0.8, 12)) * sd * math.sqrt(2 / 7)
    t8 = (stats.t.ppf(1 - alpha / 2, 14) + stats.t.ppf(0.8, 14)) * sd * math.sqrt(2 / 8)
    assert t7 == pytest.approx(1.81, abs=0.01) and t8 == pytest.approx(1.66, abs=0.01)
    assert seeds_needed(effect, sd, alpha) == 8
    # at large n t and z agree (the search starts at z's count and ends within a seed or two of it)
    assert seeds_needed(0.1, 1.0) - math.ceil(2 * ((NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)) / 0.1)
                                             ** 2) in (0, 1, 2)
    assert seeds_needed(1.0, 0.0) == 2


def test_speaks_to_reads_the_outcome_against_the_claims_size():
    base = [96.4, 96.8, 97.1, 96.5, 96.9, 97.2, 96.3, 96.7, 97.0, 96.8]
    r = reach("vit", base, 0.6, [("CET", Claim("CET", 80.3, 81.3))], Scale())
    assert [k for _, k in speaks_to(r, {"CET": Outcome.NONE})] == [Speaks.TOO_WIDE]
    assert [k for _, k in speaks_to(r, {"CET": Outcome.WORSE})] == [Speaks.VERDICT]
    small = reach("vit", base, 0.1, [("CET", Claim("CET", 80.3, 81.3))], Scale())
    assert [k for _, k in speaks_to(small, {"CET": Outcome.NONE})] == [Speaks.WITHIN]
    assert r.ratio(r.rows[0]) == pytest.approx((0.6 / (100 - statistics.fmean(base))) / (1 / 19.7))


def test_a_flat_baseline_is_called_converged_with_the_length_checks_five_seeds():
    one = {0: 96.0, 1: 96.5, 2: 96.2, 3: 96.8, 4: 96.4}
    d = [0.02, -0.03, 0.01, 0.0, -0.01]  # it stopped gaining: 2× minus 1× per seed
    two = {s: one[s] + x for s, x in zip(one, d)}
    c = convergence(one, two, margin=0.16)
    # mean −0.002, sd 0.019235 (Σ(d − mean)² = 0.00148, /4), se 0.008602; t_{0.95, 4} = 2.1318:
    # one-sided 95 % upper bound −0.002 + 2.1318 · 0.008602 = 0.01634 < 0.16
    assert (c.gain, c.sd, c.high) == pytest.approx((-0.002, 0.019235, 0.01634), abs=1e-5)
    assert c.state == State.CONVERGED and c.converged is True and c.n == 5
    # power at this spread: Φ(0.16 · √5 / 0.019235 − 2.1318) = Φ(16.47) ≈ 1; 2 seeds already give 0.8
    assert c.power == pytest.approx(1.0) and c.seeds_for_power == 2


def test_convergence_learning_undetermined_and_its_power():
    one = {0: 96.0, 1: 96.5, 2: 96.2, 3: 96.8, 4: 96.4}
    learning = convergence(one, {s: v + 1.0 + 0.1 * (s % 2) for s, v in one.items()}, margin=0.16)
    assert learning.state == State.LEARNING and learning.converged is False
    # XCiT-like: gain +0.2, paired sd 0.3, margin 0.076: neither bound decides
    d = [0.2 + x for x in (-0.3, 0.3, -0.2, 0.2, 0.0)]
    c = convergence(one, {s: one[s] + x for s, x in zip(one, d)}, margin=0.076)
    assert c.state == State.UNDETERMINED
    sd = statistics.stdev(d)
    assert c.power == pytest.approx(NormalDist().cdf(0.076 * math.sqrt(5) / sd - stats.t.ppf(0.95, 4)))
    k = c.seeds_for_power  # the smallest n with Φ(0.076·√n/sd − t_{0.95, n−1}) ≥ 0.8
    assert NormalDist().cdf(0.076 * math.sqrt(k) / sd - stats.t.ppf(0.95, k - 1)) >= 0.8
    assert NormalDist().cdf(0.076 * math.sqrt(k - 1) / sd - stats.t.ppf(0.95, k - 2)) < 0.8
    assert convergence(one, two := {s: v + 1 for s, v in one.items()}, None).state == State.NOT_JUDGED and two
    assert convergence({0: 1.0}, {0: 2.0}, 0.1) is None
    # a loss: a fall is a gain
    assert paired_gain({0: 4.5, 1: 4.6}, {0: 4.4, 1: 4.5}, higher_is_better=False).diff == pytest.approx(0.1)


def test_a_verdict_is_at_convergence_only_when_the_baseline_converged_and_its_delta_held():
    held = Trend(-1.60, -1.55, None, 5)
    moved = Trend(0.015, 0.083, None, 5)  # GPT-2's SCA: Δ grows by 0.068
    assert verdict_basis(State.CONVERGED, held, 0.6) == Basis.CONVERGENCE
    assert verdict_basis(State.CONVERGED, moved, 0.0094) == Basis.BUDGET
    assert verdict_basis(State.UNDETERMINED, held, 0.6) == Basis.BUDGET
    assert verdict_basis(State.CONVERGED, None, 0.6) == Basis.BUDGET  # no run at 2×: never at convergence
    assert verdict_basis(None, held, 0.6) == Basis.NO_CHECK
    one = {0: 96.0, 1: 96.5, 2: 96.2, 3: 96.8}
    two = {0: 97.0, 1: 97.3, 2: 97.4, 3: 97.6}
    t = delta_trend(one, two, {s: v - 1.6 for s, v in one.items()}, {s: v - 1.0 for s, v in two.items()})
    assert (t.at1, t.at2, t.change.diff) == pytest.approx((-1.6, -1.0, 0.6))


def test_a_weak_pick_is_judged_by_the_standard_error_of_the_selection_means():
    # QK-norm's grid (2 selection seeds per lr) and 10 reported runs at the pick whose val scores spread ±0.0046
    grid = {0.5: [0.960, 0.964], 1.0: [0.970, 0.972], 2.0: [0.970, 0.968]}
    at_pick = [0.971 + (0.0046 if i % 2 else -0.0046) for i in range(10)]
    s = pick_strength(grid, 1.0, at_pick=at_pick)
    # pooled SS: grid 8e-6 + 2e-6 + 2e-6 (3 df), reported 10 · 0.0046² = 2.116e-4 (9 df): σ = √(2.236e-4/12) = 0.004317;
    # SE of the lead = σ √(1/2 + 1/2) = 0.004317 > lead 0.971 − 0.969 = 0.002: weak
    assert (s.lead, s.sigma, s.se, s.df) == pytest.approx((0.002, 0.004317, 0.004317, 12), abs=1e-6)
    assert s.mark == Mark.WEAK
    # the one-degree-of-freedom rule of before: √(s_p²/2 + s_q²/2) = √(1e-6 + 1e-6) = 0.00141 < 0.002: not weak
    assert math.sqrt(statistics.variance(grid[1.0]) / 2 + statistics.variance(grid[2.0]) / 2) < 0.002
    clear = {0.5: [0.90, 0.902], 1.0: [0.95, 0.952], 2.0: [0.93, 0.931]}
    assert pick_strength(clear, 1.0).mark == Mark.NONE
    lower = pick_strength({m: [-v for v in vs] for m, vs in grid.items()}, 1.0, higher_is_better=False,
                          at_pick=[-v for v in at_pick])
    assert lower.mark == Mark.WEAK
    edge = {4.0: [0.95, 0.952], 8.0: [0.96, 0.961]}
    assert pick_strength(edge, 8.0, at_bound=True).mark == Mark.BINDING
    assert pick_strength({0.5: [math.nan, math.nan], 1.0: [0.95, 0.952]}, 1.0).mark == Mark.NONE


def test_the_noise_floor_tests_the_baseline_against_itself_on_a_split_of_its_seeds():
    same = {s: 96.0 + 0.1 * (s % 5) for s in range(10)}  # seeds 0-4 and 5-9 hold the same values
    nf = noise_floor(same, [0.5, 0.7])
    assert (nf.seeds_a, nf.seeds_b) == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
    assert nf.diff == pytest.approx(0.0) and nf.p == pytest.approx(1.0) and nf.outcome == Outcome.NONE
    assert nf.splits == math.comb(9, 4) == 126  # every split into two halves once
    assert nf.m == 3  # the split and the family's 2 primary arms
    shifted = {s: v + (5.0 if s >= 5 else 0.0) for s, v in same.items()}
    nf = noise_floor(shifted, [None, 1.0])  # arms without a test count as p = 1
    p = welch_p([shifted[s] for s in range(5)], [shifted[s] for s in range(5, 10)])
    assert nf.p_adj == pytest.approx(min(1.0, 3 * p))  # Holm's first step among 3
    assert nf.outcome == Outcome.BETTER and nf.called_different >= 1 and 0 < nf.rate <= 1
    assert noise_floor({0: 1.0, 1: 2.0, 2: 3.0}) is None


def test_the_noise_floors_rate_is_counted_under_holm_with_the_familys_own_p():
    # a split whose Welch p is 0.02 in a family of 2 real arms: p × m (m = 3 with the split) = 0.06 calls it the same;
    # Holm with the real arms' own p (1e-6 and 1e-5, both far below) judges the split at the last step, 0.02 · 1 < 0.05
    base = {s: 96.0 + 0.1 * (s % 5) for s in range(10)}
    nf = noise_floor(base, [1e-6, 1e-5])
    rate_holm = nf.called_different
    # recompute by hand: every split's Welch p, then Holm over [p, 1e-6, 1e-5] versus p × 3
    seeds = sorted(base)
    import itertools
    holm_calls = pm_calls = 0
    for first in itertools.combinations(seeds[1:], 4):
        left = {0, *first}
        p = welch_p([base[s] for s in left], [base[s] for s in seeds if s not in left])
        holm_calls += holm([p, 1e-6, 1e-5])[0] < 0.05
        pm_calls += min(1.0, 3 * p) < 0.05
    assert rate_holm == holm_calls and holm_calls > pm_calls  # the real arms' small p lower the split's step
    # with the arms at p = 1 the two counts agree (Holm's first step is p × m)
    assert noise_floor(base, [1.0, 1.0]).called_different == pm_calls
    # a constructed split p of 0.02: Holm with the real arms far below calls it; p × 3 does not
    assert holm([0.02, 1e-6, 1e-5])[0] == pytest.approx(0.02) and min(1.0, 3 * 0.02) > 0.05


def test_project_holm_uses_the_unrounded_p():
    p = 0.012495  # rounded to 3 digits, 0.0125 · 4 = 0.05 would flip it
    out = project_holm([("a", p, Outcome.WORSE), ("b", 0.5, Outcome.NONE), ("c", 0.6, Outcome.NONE),
                        ("d", None, Outcome.UNTESTED)])
    assert out[0].p_project == pytest.approx(4 * p) and out[0].p_project < 0.05 and not out[0].flips
    assert out[3].p_project is None
    flip = project_holm([("a", 1e-6, Outcome.WORSE), ("b", 0.03, Outcome.WORSE), ("c", 0.5, Outcome.NONE)])  # 0.03 · 2
    assert [t.flips for t in flip] == [False, True, False]


def test_the_speed_ratio_is_median_steps_to_the_level_over_the_baselines_with_a_bootstrap_interval():
    base = [400, 400, 350, 400, None]  # one baseline seed never reaches its own final mean: later than any
    arm = [200, 250, 200, 150, 200]
    sp = speed_ratio(base, arm)
    assert (sp.median, sp.base_median, sp.ratio) == (200, 400, pytest.approx(0.5))
    assert sp.low <= sp.ratio <= sp.high < 1 and (sp.n, sp.n_base) == (5, 5)
    assert speed_ratio(base, arm) == sp  # seeded: the same interval every time
    slow = speed_ratio(base, [None, None, None, 400, 350])  # the arm's median run never reaches it
    assert slow.ratio is None and slow.high is None
    assert speed_ratio([None, None, 400], arm) is None  # the baseline's median never does: no ratio
    assert speed_ratio([], arm) is None


def test_one_word_per_method_from_its_two_regimes_and_its_speed():
    fast = Speed(0.6, 0.5, 0.7, 240, 400, 10, 10)
    same = Speed(1.0, 0.8, 1.2, 400, 400, 10, 10)
    B, N, W, U = Outcome.BETTER, Outcome.NONE, Outcome.WORSE, Outcome.UNTESTED
    assert regime_word(B, None, False, fast) == Word.NO_FAMILY  # the converged family has no runs yet
    assert regime_word(B, B, True, fast) == Word.HELPS
    assert regime_word(N, B, True, same) == Word.HELPS
    assert regime_word(B, W, True, fast) == Word.HURTS
    assert regime_word(W, N, True, same) == Word.HURTS  # worse at a budget, no gain at convergence: it slows training
    # better at a budget, no difference at convergence, fewer steps to the baseline's level: only speeds training up
    assert regime_word(B, N, True, fast) == Word.SPEEDS
    assert regime_word(B, N, True, Speed(0.9, 0.7, 1.1, 360, 400, 10, 10)) == Word.SPEEDS  # fewer steps (point)
    assert regime_word(N, N, True, fast) == Word.SPEEDS  # its whole interval under 1
    assert regime_word(B, N, True, same) == Word.NEITHER  # better at a budget but not faster there
    assert regime_word(N, N, True, same) == Word.NEITHER
    assert regime_word(U, N, True, None) == Word.NEITHER
    # a 'converged' family whose verdict is not at convergence (its baseline did not pass, or the Δ moved): undecided
    assert regime_word(B, N, False, fast) == Word.NOT_AT_CONVERGENCE
    assert regime_word(B, U, True, fast) == Word.NOT_AT_CONVERGENCE
