"""`TableResult` (condattn/table/result.py) built from a plan and constructed run records: each family's arms with their
tests, the paper's own baseline beside each method, the verdict's basis, the lr pick's mark, the noise floor, and a
JSON serialisation that holds numbers as numbers."""

from __future__ import annotations

import json

import pytest
from helpers import experiment_raw, plan_of
from test_protocol import finish, lr_pick

from condattn.stats import Basis, Mark, Outcome, State
from condattn.table.result import table_result


def _table(tmp_path, at2: dict[str, float] | None = None):
    """Table 1's ViT row with the baseline and SCA, 4 seeds, an lr grid and (with `at2`) a length check on 4 seeds."""
    exp = experiment_raw("table1_imagenet")
    exp["methods"] = ["none", "spectral"]
    exp["scales"]["small"] = {"seeds": [0, 1, 2, 3], "rows": ["vit_base"], "lr_grid": [0.5, 1, 2],
                              "selection_seeds": [100, 101]}
    if at2:
        exp["scales"]["small"]["length_check"] = {"factor": 2, "seeds": 4}
    runs = tmp_path / "runs" / "small"
    base = {0: 0.960, 1: 0.965, 2: 0.962, 3: 0.967}
    for method, shift in (("none", 0.0), ("spectral", -0.2)):
        for seed, v in base.items():
            name = f"table1_imagenet_vit_base_{method}_small_s{seed}"
            finish(type("S", (), {"run_dir": runs / name}), {"final_test_acc": v + shift, "final_val_acc": v + shift},
                   steps=400)
            if at2:
                finish(type("S", (), {"run_dir": runs / f"{name}-2x"}), {"final_test_acc": v + shift + at2[method]},
                       steps=800)
    picks = {"vit_base/none": lr_pick({0.5: 0.90, 1.0: 0.95, 2.0: 0.94}, 1.0),
             "vit_base/spectral": lr_pick({0.5: 0.70, 1.0: 0.71, 2.0: 0.60}, 1.0)}
    longer = {f"table1_imagenet_vit_base_{m}_small_s{s}": "2x" for m in ("none", "spectral") for s in base} \
        if at2 else {}
    return plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", picks=picks, longer=longer)


def test_the_result_holds_each_family_as_numbers_and_enums(tmp_path):
    result, _, _ = table_result(_table(tmp_path))
    (fam,) = result.families
    assert fam.name == "vit_base" and fam.baseline.method == "none"
    (sca,) = fam.arms
    assert sca.at1.values == pytest.approx((76.0, 76.5, 76.2, 76.7)) and sca.at1.mean == pytest.approx(76.35)
    assert sca.test.diff == pytest.approx(-20.0) and sca.test.outcome == Outcome.WORSE
    assert sca.test.alpha_corrected == pytest.approx(0.05)  # one primary arm
    # SCA beside the SCA paper's own baseline (80.7 → 81.7), never the CET paper's 80.3
    assert (sca.claim.who, sca.claim.baseline, sca.claim.value) == ("SCA", 80.7, 81.7)
    # no length check at this scale: the basis says so
    assert fam.state is None and sca.basis == Basis.NO_CHECK
    # the same score on both selection seeds everywhere, and the runs at the pick spread 0.3 points: the baseline's
    # lead of 0.01 over ×2 is above σ √(1/2 + 1/2) (σ pooled: grid 0 over 3 df, runs at the pick s = 0.0031 over 3 df)
    assert fam.baseline.pick.mark == Mark.NONE and sca.pick.mark == Mark.NONE
    assert fam.baseline.pick.lead == pytest.approx(0.01) and fam.baseline.pick.df == 6
    # the noise floor: seeds 0-1 against 2-3 (a split of the reported seeds), one more arm beside the one primary
    # arm (Holm over m = 2, SCA with its own p)
    assert (fam.noise.seeds_a, fam.noise.seeds_b, fam.noise.m, fam.noise.splits) == ((0, 1), (2, 3), 2, 3)
    # the metric each arm's values are: table 1 reports final_test_acc at small (its metric_at), whatever the
    # experiment's heading metric (final_val_acc) says; the CSV/JSON rows name it
    from condattn.reporting.tables import arm_fields
    assert sca.metric == fam.baseline.metric == "final_test_acc"
    assert arm_fields(result, fam, sca)["metric"] == "final_test_acc"
    assert fam.noise.diff == pytest.approx(0.2)
    assert fam.reach.sd == pytest.approx(fam.baseline.at1.std) and fam.reach.alpha == pytest.approx(0.05)
    doc = json.loads(json.dumps(result.as_json()))
    arm = doc["families"][0]["arms"][0]
    assert isinstance(arm["test"]["p"], float) and arm["test"]["outcome"] == "worse"
    assert arm["at1"]["values"] == pytest.approx([76.0, 76.5, 76.2, 76.7])
    assert result.missing_runs == 0


def test_the_result_carries_its_provenance_and_its_json_round_trips_it(tmp_path):
    from datetime import datetime, timezone

    from condattn.reporting.tables import provenance_line, trained_so_far, training_time_line
    from condattn.table.provenance import Data, provenance
    from condattn.table.result import TableResult

    plan = _table(tmp_path)
    hw = {"torch_threads": 1, "cpu_capability": "AVX2", "device_type": "cpu"}
    extra = {  # what the trainer records beside the metrics, per seed (seed 3: a commit that never landed)
        0: {"commit": "aaa", "hardware_line": "1 × cpu", "hardware": hw, "code": {"model": "m1"}, "wall_time_s": 10.0},
        1: {"commit": "aaa", "hardware_line": "1 × cpu", "hardware": hw, "code": {"model": "m1"}, "wall_time_s": 20.0},
        2: {"commit": "bbb", "hardware_line": "1 × cpu", "hardware": {**hw, "torch_threads": 2},
            "code": {"model": "m2"}, "wall_time_s": 30.0, "table": "table9_readings"},
        3: {"commit": "aaa", "commit_recorded": "ccc", "hardware_line": "1 × cpu", "hardware": hw,
            "code": {"model": "m1"}, "wall_time_s": 60.0, "commit_state": "uncommitted changes"},
    }
    for method in ("none", "spectral"):
        for seed, more in extra.items():
            path = plan.runs_root / "small" / f"table1_imagenet_vit_base_{method}_small_s{seed}" / "summary.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **more}))
    result, cells, _ = table_result(plan)
    p = result.provenance
    assert (p.scale, p.data, p.seeds, p.runs) == ("small", Data.STAND_IN, (0, 1, 2, 3), 8)
    assert p.commits == (("aaa", 6), ("bbb", 2)) and p.aliased == (("ccc", "aaa", 2),)
    assert p.commit_states == (("uncommitted changes", 2),) and p.reused == (("table9_readings", 2),)
    assert (p.hardware, p.threads, p.cpu_capabilities) == (("1 × cpu",), (1, 2), ("AVX2",))
    assert (p.walls.runs, p.walls.sum_s, p.walls.median_s, p.walls.mean_s) == (8, 240.0, 25.0, 30.0)
    assert [(k, w.runs, w.median_s) for k, w in p.walls_by] == [("vit_base", 8, 25.0)]  # one family: the row
    sca = next(c for c in p.code if c.method == "spectral")
    assert (sca.row, sca.codes, sca.mixed) == ("vit_base", ("model=m1", "model=m2"), ("model",))
    assert p.spent is None and p.gpu_runs == 0  # the plan names no run it trained; no run on a GPU
    # the JSON holds it as numbers and words, and reads back as it was built
    doc = json.loads(json.dumps(result.as_json()))
    assert doc["provenance"]["commits"] == [["aaa", 6], ["bbb", 2]] and doc["provenance"]["data"] == "stand-in"
    back = TableResult.from_json(doc)
    assert back.provenance == p and back == result
    # the views format it: the provenance line and the cost lines say these facts, nothing recomputed
    at = datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc)
    line = provenance_line(provenance(plan, cells, done=[], now=at))
    assert line.startswith("Ours: scale=small, offline stand-in data (not comparable with the papers), seeds [0, 1, "
                           "2, 3], commit aaa, bbb (2 runs from uncommitted changes; 2 runs recorded as ccc, a commit "
                           "that never landed, whose code fingerprint is aaa's), hardware 1 × cpu, torch threads 1, 2, "
                           "8 finished runs, 2 of them made for table9_readings")
    assert line.endswith("; written 2026-01-02 03:04 UTC.")
    assert training_time_line(p.walls) == ("Training time of the runs shown: 8 runs, 0.07 h of run wall time summed "
                                           "(median per run 25 s), 0.03 h on two processes of one thread.")
    assert trained_so_far(provenance(plan, cells, done=[{"wall_time_s": 7200.0}]).spent) == (
        " Trained so far for this table: 1 runs (selection, reported and length runs), 2.00 h of run wall time "
        "summed, 1.0 h on two processes.")


def test_the_length_check_decides_convergence_and_each_verdicts_basis(tmp_path):
    # the baseline stopped gaining (+0.01 points at 2×) and SCA's Δ held: at convergence
    result, _, _ = table_result(_table(tmp_path / "a", at2={"none": 0.0001, "spectral": 0.0001}))
    fam = result.families[0]
    assert fam.convergence.n == 4 and fam.convergence.gain == pytest.approx(0.01)
    assert fam.state == State.CONVERGED and fam.arms[0].basis == Basis.CONVERGENCE
    # SCA's Δ moves by 5 points between 1× and 2× (far above its MDE): at a budget
    result, _, _ = table_result(_table(tmp_path / "b", at2={"none": 0.0001, "spectral": 0.05}))
    fam = result.families[0]
    assert fam.state == State.CONVERGED and fam.arms[0].basis == Basis.BUDGET
    assert fam.arms[0].trend.at2 - fam.arms[0].trend.at1 == pytest.approx(4.99)  # (0.05 − 0.0001) · 100
    # the baseline still gains a point at 2×: every verdict at a budget
    result, _, _ = table_result(_table(tmp_path / "c", at2={"none": 0.01, "spectral": 0.01}))
    assert result.families[0].state == State.LEARNING and result.families[0].arms[0].basis == Basis.BUDGET


def test_a_family_without_a_claim_of_its_own_is_judged_against_the_tables_smallest_claim():
    from condattn.stats import Claim, Scale
    from condattn.table.result import _margin

    claims = [("SCA", Claim("SCA", 80.7, 81.7)), ("CET", Claim("CET", 80.3, 81.3))]  # 5.18 % and 5.08 % relative
    base = [68.0, 69.5]  # a QK-norm baseline at 68.75 %: 31.25 % error
    margin, label, rel, own = _margin(None, claims, base, Scale())
    assert (label, own) == ("CET", False) and rel == pytest.approx(1.0 / 19.7)
    assert margin == pytest.approx(31.25 / 19.7)  # CET's relative fall at this baseline: 1.59 points
    assert _margin(None, [], base, Scale()) == (None, "", None, True)  # a table without any claim: not judged
    assert _margin(None, claims, [68.0], Scale())[0] is None  # one seed: no mean to apply it at


def _regime_table(tmp_path, conv_runs: bool = True):
    """Table 1 with two families, the baseline and SCA each on 4 seeds and a length check: `vit_base` declared the
    budget family (its baseline gains 3 points at 2×; SCA +1 point and at the baseline's final validation level in
    half its steps) and `swin_base` the converged family paired with it (its baseline gains 0.01 at 2×; SCA the same
    as the baseline there). `conv_runs` False: the converged family's runs are not trained yet."""
    exp = experiment_raw("table1_imagenet")
    exp["methods"] = ["none", "spectral"]
    exp["scales"]["small"] = {"seeds": [0, 1, 2, 3], "rows": ["vit_base", "swin_base"], "lr_grid": [0.5, 1, 2],
                              "selection_seeds": [100, 101], "length_check": {"factor": 2, "seeds": 4}}
    exp["regimes"] = {"vit_base": {"regime": "budget"}, "swin_base": {"regime": "convergence", "budget": "vit_base"}}
    runs = tmp_path / "runs" / "small"
    base = {0: 0.960, 1: 0.965, 2: 0.962, 3: 0.967}
    cells = {("vit_base", "none"): (0.0, 0.03, 1.0), ("vit_base", "spectral"): (0.01, 0.04, 0.5),
             ("swin_base", "none"): (0.0, 0.0001, 1.0), ("swin_base", "spectral"): (0.0, 0.0001, 1.0)}
    longer = {}
    for (row, method), (shift, gain, pace) in cells.items():
        if row == "swin_base" and not conv_runs:
            continue
        for seed, v in base.items():
            name = f"table1_imagenet_{row}_{method}_small_s{seed}"
            final = v + shift
            # validation curve over 400 steps: rising linearly to the run's final value at `pace` × 400, flat after
            curve = [(s, 0.5 + (final - 0.5) * min(1.0, s / (pace * 400))) for s in range(50, 401, 50)]
            finish(type("S", (), {"run_dir": runs / name}), {"final_test_acc": final, "final_val_acc": final},
                   curve=curve, steps=400)
            finish(type("S", (), {"run_dir": runs / f"{name}-2x"}), {"final_test_acc": final + gain}, steps=800)
            longer[name] = "2x"
    picks = {f"{r}/{m}": lr_pick({0.5: 0.90, 1.0: 0.95, 2.0: 0.94}, 1.0) for r, m in cells}
    return plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", picks=picks, longer=longer)


def test_the_regime_line_pairs_a_budget_family_with_its_converged_family_and_decides_one_word(tmp_path):
    from condattn.stats import Word
    from condattn.table.result import TableResult

    result, _, _ = table_result(_regime_table(tmp_path / "a"))
    (line,) = result.regimes
    assert (line.row, line.method, line.budget_family, line.convergence_family) == \
        ("vit_base", "spectral", "vit_base", "swin_base")
    assert line.budget == Outcome.BETTER and line.budget_diff == pytest.approx(1.0)
    assert line.convergence == Outcome.NONE and line.convergence_basis == Basis.CONVERGENCE
    # SCA reaches the baseline's final validation level (96.35) at step 200 on every seed, the baseline at 400
    assert line.speed.ratio == pytest.approx(0.5) and line.speed.high == pytest.approx(0.5)
    assert line.word == Word.SPEEDS
    fam = result.families[0]
    assert fam.arms[0].speed.median == 200 and fam.arms[0].speed.base_median == 400
    # the JSON round-trips the typed line (findings reads it so)
    back = TableResult.from_json(json.loads(json.dumps(result.as_json())))
    assert back.regimes == result.regimes
    # before the converged family has runs: 'no converged family yet'
    result, _, _ = table_result(_regime_table(tmp_path / "b", conv_runs=False))
    (line,) = result.regimes
    assert line.convergence is None and line.convergence_family == "" and line.word == Word.NO_FAMILY
    assert line.budget == Outcome.BETTER


def test_the_regimes_are_declared_and_checked_in_the_experiment_file():
    from helpers import typed

    from condattn.experiment import ExperimentError, FamilyRegime

    exp = experiment_raw("table1_imagenet")
    exp["regimes"] = {"vit_hard": {"regime": "budget"}, "vit_base": {"regime": "convergence", "budget": "vit_hard"}}
    assert typed(exp).regimes["vit_base"] == FamilyRegime("convergence", "vit_hard")
    for bad, said in (({"vit_hard": {"regime": "later"}}, "use one of budget, convergence"),
                      ({"vit_base": {"regime": "convergence", "budget": "vit_hard"}}, "names the family declared"),
                      ({"vit_hard": {"regime": "budget", "budget": "vit_base"}}, "a budget family pairs with none"),
                      ({"vit_hard": {"regime": "budget", "pairs": "x"}}, "unknown key 'pairs'")):
        exp["regimes"] = bad
        with pytest.raises(ExperimentError, match=said):
            typed(exp)
    # a family not among the rows (a copy of the file with rows left out) has no regime line: dropped
    exp["regimes"] = {"vit_hard": {"regime": "budget"}, "nowhere": {"regime": "convergence", "budget": "vit_hard"}}
    assert set(typed(exp).regimes) == {"vit_hard"}
