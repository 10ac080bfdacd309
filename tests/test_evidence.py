"""What a verdict can rule out (reporting/evidence.py, pure functions): relative effects in the papers' terms, seeds a
paper-sized effect needs, the convergence rule tied to the effect, Δ's trend from 1× to 2×, lr pick strength, and the
project-wide Holm family; checked against hand computations and scipy."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats

from condattn.reporting.evidence import (
    Arm,
    Claim,
    PrimaryTest,
    Scale,
    convergence_text,
    delta_trend,
    paired_gain,
    pick_strength,
    pooled_sd,
    project_holm,
    reach,
    reach_text,
    seeds_needed,
    speaks_to,
)


def test_relative_effects_in_the_papers_terms():
    acc = Scale()
    # the papers' ImageNet claim: +1.0 top-1 at 80.3 % (19.7 % error) is a 5.1 % relative fall in error
    assert Claim("CET", 80.3, 81.3).relative == pytest.approx(1.0 / 19.7)
    assert acc.absolute(1.0 / 19.7, 96.77) == pytest.approx(3.23 / 19.7)
    loss = Scale(higher_is_better=False)
    assert Claim("CET", 2.41, 2.36, loss).effect == pytest.approx(0.05)
    assert Claim("CET", 2.41, 2.36, loss).relative == pytest.approx(0.05 / 2.41)
    assert Scale(False, floor=2.0).room(2.5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no room for improvement at 100"):
        acc.relative(0.1, 100.0)


def test_seeds_needed_is_the_two_sample_normal_approximation():
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert seeds_needed(0.16, 0.38) == math.ceil(2 * (z * 0.38 / 0.16) ** 2)
    assert seeds_needed(10.0, 0.1) == 2  # never fewer than 2
    assert seeds_needed(0.0, 1.0) is None and seeds_needed(-1.0, 1.0) is None
    # halving the effect quadruples the seeds (up to rounding)
    assert seeds_needed(0.05, 1.0) == pytest.approx(4 * seeds_needed(0.1, 1.0), abs=4)


def test_pooled_sd():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    want = math.sqrt((2 * statistics.variance(a) + 3 * statistics.variance(b)) / 5)
    assert pooled_sd(a, b) == pytest.approx(want)
    assert pooled_sd([1.0], b) is None


def test_reach_translates_each_claim_and_says_what_no_difference_rules_out():
    base = [96.4, 96.8, 97.1, 96.5, 96.9, 97.2, 96.3, 96.7, 97.0, 96.8]
    arm = [v - 0.05 for v in base]
    r = reach("vit_base", base, 0.6, [Arm("CET", arm, Claim("CET", 80.3, 81.3)), Arm("QK-norm", arm)], Scale())
    err = 100 - statistics.fmean(base)
    assert r.relative_mde == pytest.approx(0.6 / err)
    assert [a.label for a, _, _ in r.rows] == ["CET"]  # a rival method has no claim
    arm_, here, n = r.rows[0]
    assert here == pytest.approx(err / 19.7)
    assert n == seeds_needed(here, pooled_sd(base, arm))
    assert r.ratio(arm_) == pytest.approx((0.6 / err) / (1 / 19.7))
    text = reach_text(r)
    assert text.startswith("Reach (vit_base): the MDE 0.6 is a 19 % relative fall in error at this baseline's 3.")
    assert "CET 5.1 % (80.3 → 81.3; MDE 3.7× it)" in text and f"→ {n} seeds" in text
    assert speaks_to(r, {"CET": "no difference detected (MDE 0.6)"}) == ([], ["CET (MDE 3.7× the claim)"])
    assert speaks_to(r, {"CET": "worse"}) == (["CET (worse)"], [])
    small = reach("t", base, 0.1, [Arm("CET", arm, Claim("CET", 80.3, 81.3))], Scale())
    assert speaks_to(small, {"CET": "no difference detected"}) == (["CET (no difference, MDE within the claim)"], [])


def test_paired_gain_and_the_convergence_rule_judge_the_interval_against_the_effect():
    one = {0: 96.0, 1: 96.5, 2: 96.2, 3: 96.8}
    two = {0: 97.0, 1: 97.3, 2: 97.4, 3: 97.6, 9: 99.0}  # seed 9 has no 1× run: left out
    g = paired_gain(one, two)
    d = [1.0, 0.8, 1.2, 0.8]
    half = stats.t.ppf(0.975, 3) * statistics.stdev(d) / 2
    assert (g.diff, g.low, g.high) == pytest.approx((0.95, 0.95 - half, 0.95 + half))
    assert paired_gain(one, two, higher_is_better=False).diff == pytest.approx(-0.95)  # a loss rising is no gain
    assert paired_gain({0: 1.0}, {0: 2.0}) is None
    trend = delta_trend("CET", one, two, {s: v - 1.6 for s, v in one.items()},
                        {s: v - 1.0 for s, v in two.items() if s != 9})
    assert (trend.at1, trend.at2) == pytest.approx((-1.6, -1.0))
    assert trend.change.diff == pytest.approx(0.6)
    late = convergence_text("vit", g, 4, 0.16, "why", [trend])
    assert "NOT under the paper-sized effect here, 0.16 points (why): NOT converged" in late
    assert "CET -1.60 → -1.00 (change +0.60" in late
    assert convergence_text("vit", g, 4, 5.0, "why", [trend]).endswith("under the paper-sized effect here, 5 points "
                                                                        "(why): converged.")
    # converged needs the whole interval under the effect, not only the mean
    assert "NOT converged" in convergence_text("vit", g, 4, g.high - 1e-9, "why", [])
    assert "convergence not judged" in convergence_text("vit", g, 4, None, "", [])


def test_pick_strength_weak_pick_and_bound_binding():
    clear = {0.5: [90.0, 90.2], 1.0: [95.0, 95.2], 2.0: [93.0, 93.1]}
    assert pick_strength(clear, 1.0) == ""
    close = {0.5: [90.0, 90.2], 1.0: [95.0, 95.6], 2.0: [94.9, 95.5]}  # lead 0.1, SE ≈ 0.42
    assert pick_strength(close, 1.0) == "weak pick"
    assert pick_strength({m: [-v for v in s] for m, s in close.items()}, 1.0, higher_is_better=False) == "weak pick"
    edge = {4.0: [95.0, 95.2], 8.0: [96.0, 96.1]}
    assert pick_strength(edge, 8.0, at_bound=True) == "bound binding"
    assert pick_strength(edge, 8.0) == ""  # not at the bound: the grid grows instead
    failed = {0.5: [math.nan, math.nan], 1.0: [95.0, 95.2]}
    assert pick_strength(failed, 1.0) == ""  # no finite neighbour to compare with


def test_project_holm_names_the_verdicts_that_depend_on_the_family():
    tests = [PrimaryTest("a", 1e-6, "worse"), PrimaryTest("b", 0.02, "worse"),
             PrimaryTest("c", 0.5, "no difference detected"), PrimaryTest("d", None, "–")]
    out = project_holm(tests)
    # "d" has no p yet and counts as p = 1: the family is every declared test
    assert [adj for _, adj, _ in out] == pytest.approx([4e-6, 0.06, 1.0, None])
    assert [flip for _, _, flip in out] == [False, True, False, False]
