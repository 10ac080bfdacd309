"""The fair protocol (issue 25): `reproduce.plan` with an lr grid plans stage 1 (the first seed at every multiplier),
picks by validation (never test) from finished stage-1 run records and then plans stage 2; the statistics the tables
report (MDE, steps-to-target, the convergence figure) against hand computations; the table 9 renderer's columns."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from helpers import experiment_raw, plan_of, typed

from condattn.config import ConfigError
from condattn.experiment import ExperimentError
from condattn.reproduce import LrPick, plan, selection_key
from condattn.runs import RunRecord
from condattn.stats import last_quarter_change, mde, median_steps, steps_to_target

REPO = Path(__file__).resolve().parents[1]


def grid_exp(rows=("vit_baseline", "vit_sca10", "listops_baseline")) -> dict:
    exp = experiment_raw("table9_readings")
    exp["rows"] = {r: exp["rows"][r] for r in rows}
    exp["scales"]["small"] = {"seeds": [0, 1, 2], "selection_seeds": [100, 101], "lr_grid": [0.5, 1, 2],
                              "lr_bound": [0.25, 4]}
    return exp


def lr_pick(scores: dict[float, float], pick: float, base_lr: float = 1e-3, bound=(0.125, 8.0)) -> LrPick:
    """A row's lr pick: both selection seeds scored `scores[m]` at each multiplier."""
    return LrPick("r", "final_val_acc", base_lr, {m: base_lr * m for m in scores}, [100, 101], bound,
                  {m: {100: v, 101: v} for m, v in scores.items()}, pick)


def finish(spec, metrics: dict, curve: list[tuple[int, float]] | None = None, steps: int = 100) -> None:
    """A finished run record for a planned cell (what the trainer leaves: metrics.jsonl val rows, summary.json)."""
    rec = RunRecord(spec.run_dir)
    rec.dir.mkdir(parents=True)
    if curve:
        rec.metrics_path.write_text("".join(json.dumps({"step": s, "split": "val", "acc": a, "loss": 2 - a}) + "\n"
                                            for s, a in curve))
    rec.write_summary({"status": "finished", "run_dir": str(rec.dir), "metrics": metrics, "steps": steps,
                       "wall_time_s": 1.0, "data": {"stand_in": True}})


def test_selection_key_is_validation_never_test():
    exp = grid_exp()
    assert selection_key(typed(exp), "vit_baseline") == "final_val_acc"  # ViT: final validation top-1
    assert selection_key(typed(exp), "listops_baseline") == "val_acc"  # ListOps: test at best val -> the best val acc
    exp["rows"]["vit_baseline"]["metrics"] = {"small": "test_acc"}  # a held-out test split at one scale
    assert selection_key(typed(exp), "vit_baseline", "small") == "val_acc"
    assert selection_key(typed(exp), "vit_baseline", "medium") == "final_val_acc"
    exp["rows"]["vit_baseline"].pop("metrics")
    exp["rows"]["vit_baseline"]["metric"] = "mcc_median"
    with pytest.raises(ConfigError, match="select_metric"):
        selection_key(typed(exp), "vit_baseline")
    exp["rows"]["vit_baseline"]["select_metric"] = "test_acc"
    with pytest.raises(ConfigError, match="no validation metric"):
        selection_key(typed(exp), "vit_baseline")


def test_lr_pick_by_mean_over_selection_seeds_ties_nearest_unit_and_waits_for_every_run():
    def pick(scores, seeds=(100, 101), bound=(0.125, 8.0)):
        return LrPick("r", "val_acc", 1e-3, {m: 1e-3 * m for m in scores}, list(seeds), bound, scores)

    p = pick({0.5: {100: 0.6, 101: 0.6}, 1.0: {100: 0.5, 101: 0.7}, 2.0: {100: 0.9, 101: math.nan}})
    assert p.best(higher_is_better=True) == 1.0  # a tie of the means goes to ×1; a failed run loses its lr
    assert pick({0.5: {100: 3.0, 101: 3.0}, 2.0: {100: 2.0, 101: 2.5}}).best(higher_is_better=False) == 2.0
    assert pick({0.5: {100: 0.9, 101: 0.9}, 1.0: {100: 0.1, 101: None}}).best(True) is None  # a run not ended
    assert pick({0.5: {100: 0.9}, 1.0: {100: 0.1, 101: 0.2}}).best(True) is None  # a selection seed missing
    # the grid grows one log2 step past an edge pick, up to the declared bound; an inner pick is final
    p = pick({0.5: {100: 0.9, 101: 0.9}, 1.0: {100: 0.1, 101: 0.2}, 2.0: {100: 0.1, 101: 0.2}}, bound=(0.25, 4))
    assert p.next_step(0.5) == 0.25 and p.next_step(1.0) is None and p.next_step(2.0) == 4.0
    p.lrs[0.25] = 2.5e-4
    assert p.next_step(0.25) is None  # at the bound
    p.pick = 0.25
    assert p.at_bound and p.as_dict()["means"][0.5] == pytest.approx(0.9)


def test_an_lr_tie_names_its_tie_break():
    from condattn.reporting.protocol import lr_text, pick_marks
    from condattn.table.lr_grid import TIE_LOWER, TIE_NEAREST
    from condattn.table.result import pick_of

    # conditioned init on vit_hard: ×0.5 and ×1 both score 0.731 (mean of the selection seeds): ×1 is nearer ×1
    p = lr_pick({0.5: 0.731, 1.0: 0.731, 2.0: 0.70}, 1.0)
    assert p.best(True) == 1.0 and p.tie_break() == ((0.5,), TIE_NEAREST)
    # ×1/2 and ×2 tie, both one log2 step from ×1: the lower lr
    q = lr_pick({0.5: 0.80, 1.0: 0.70, 2.0: 0.80, 4.0: 0.6}, 0.5)
    assert q.best(True) == 0.5 and q.tie_break() == ((2.0,), TIE_LOWER)
    assert lr_pick({0.5: 0.70, 1.0: 0.731, 2.0: 0.70}, 1.0).tie_break() == ((), "")  # no tie
    assert lr_pick({0.5: 0.1, 1.0: 0.1}, 1.0).tie_break() == ((), "")  # a flat grid is marked flat instead
    plan = type("P", (), {"picks": {"k": p}})()
    pick = pick_of(plan, "k")
    assert (pick.tied, pick.tie_break) == ((0.5,), "nearest ×1")
    assert "tied with ×0.5, picked: nearest ×1" in lr_text(pick)
    assert any("tied with ×0.5" in m and "nearest ×1" in m for m in pick_marks(pick))


def test_lr_pick_a_flat_grid_grows_each_way_to_the_bound_then_is_marked_flat():
    chance = {100: 0.1, 101: 0.1}
    p = LrPick("r", "val_acc", 1e-3, {m: 1e-3 * m for m in (0.5, 1.0, 2.0)}, [100, 101], (0.125, 8.0),
               {m: dict(chance) for m in (0.5, 1.0, 2.0)})
    assert p.flat() and p.best(True) == 1.0 and p.next_steps(1.0) == [0.25, 4.0]  # no information: grow both ways
    for m in (0.25, 4.0):
        p.lrs[m], p.scores[m] = 1e-3 * m, {100: 0.1, 101: None}
    assert not p.flat() and p.best(True) is None  # waits for every run
    p.scores[4.0][101], p.scores[0.25] = 0.1, {100: 0.3, 101: 0.5}  # ×0.25 learns: the usual edge rule takes over
    assert not p.flat() and p.next_steps(p.best(True)) == [0.125]
    p.scores[0.25] = dict(chance)
    assert p.next_steps(1.0) == [0.125, 8.0]
    for m in (0.125, 8.0):
        p.lrs[m], p.scores[m] = 1e-3 * m, dict(chance)
    assert p.next_steps(1.0) == []  # flat up to the bound: the pick is ×1, marked flat
    p.pick = 1.0
    d = p.as_dict()
    assert d["flat"] and not d["at_bound"]
    from condattn.reporting.protocol import lr_text
    from condattn.table.result import pick_of
    assert lr_text(pick_of(plan_of(grid_exp(), "small", ".", ".", picks={"r": p}), "r")) == "×1 (1e-03, flat)"
    # a grid that differs anywhere is not flat; a failed lr is not a score
    q = LrPick("r", "val_acc", 1e-3, {0.5: 5e-4, 1.0: 1e-3}, [100, 101], (0.125, 8.0),
               {0.5: {100: 0.1, 101: 0.1}, 1.0: {100: 0.1, 101: 0.12}})
    assert not q.flat() and q.next_steps(1.0) == [2.0]
    q.scores[1.0] = {100: math.nan, 101: 0.1}
    assert not q.flat()
    # a failed lr is left out of the flatness, and ends its side of the grid
    r = LrPick("r", "val_acc", 1e-3, {m: 1e-3 * m for m in (0.5, 1.0, 2.0)}, [100, 101], (0.125, 8.0),
               {0.5: dict(chance), 1.0: dict(chance), 2.0: {100: math.nan, 101: 0.1}})
    assert r.flat() and r.best(True) == 1.0 and r.next_steps(1.0) == [0.25]


@pytest.mark.slow  # composes about 40 configs (about 30 s on a loaded core)
def test_plan_lr_grid_selection_seeds_extend_at_an_edge_then_report_other_seeds(tmp_path):
    exp = grid_exp()
    extra = [f"paths.runs={tmp_path / 'runs'}", f"paths.results={tmp_path / 'results'}", "logger=none"]
    p = plan(typed(exp), "small", [0, 1, 2], extra)
    by_row = {}
    for c in p.cells:
        by_row.setdefault(c.cfg.run.row, []).append(c)
    assert {r: len(cs) for r, cs in by_row.items()} == {"vit_baseline": 6, "vit_sca10": 6, "listops_baseline": 6}
    assert {int(c.cfg.seed) for c in p.cells} == {100, 101}  # stage 1: the selection seeds only, never reported ones
    assert sorted(p.waiting) == sorted(exp["rows"])
    vit = by_row["vit_baseline"]
    base_lr = float(vit[2].cfg.optim.lr)
    want = [0.5 * base_lr] * 2 + [base_lr] * 2 + [2 * base_lr] * 2
    assert [float(c.cfg.optim.lr) for c in vit] == pytest.approx(want)
    assert vit[2].name == "table9_readings_vit_baseline_none_small_s100"  # ×1: the row's own run, its usual name
    assert [c.name for c in vit[:2]] == [vit[2].name + "-lr0.5x", vit[3].name + "-lr0.5x"]  # the grid in words
    assert not any(o.startswith("optim.lr=") for o in vit[2].overrides)
    assert len({c.run_dir for c in p.cells}) == 18

    def scores(cells, table):
        for c in cells:
            m = round(float(c.cfg.optim.lr) / base_lr, 6)
            finish(c, table(m, int(c.cfg.seed)))

    # the baseline's best mean is at ×2 (an edge): the grid grows to ×4; the SCA row's ×2 diverged on one seed and
    # its best is ×0.5: the grid grows to ×0.25 (the bound); ListOps' best *test* is at ×0.5 but its best mean
    # *validation* at ×1 (seed 101 alone would pick ×0.5), and validation decides: its pick is final
    scores(vit, lambda m, s: {"final_val_acc": {0.5: 0.5, 1: 0.6, 2: 0.7}[m]})
    sca = by_row["vit_sca10"]
    for c in sca:
        m = round(float(c.cfg.optim.lr) / base_lr, 6)
        if m == 2 and int(c.cfg.seed) == 101:
            RunRecord(c.run_dir).dir.mkdir(parents=True)
            RunRecord(c.run_dir).write_failure("loss is nan", 5, None, c.name, {})
        else:
            finish(c, {"final_val_acc": {0.5: 0.55, 1: 0.40, 2: 0.9}[m]})
    lo = by_row["listops_baseline"]
    lo_lr = float(lo[2].cfg.optim.lr)
    for c in lo:
        m = round(float(c.cfg.optim.lr) / lo_lr, 6)
        val = {(0.5, 100): 0.3, (0.5, 101): 0.45, (1, 100): 0.4, (1, 101): 0.42, (2, 100): 0.35, (2, 101): 0.35}
        finish(c, {"val_acc": val[(m, int(c.cfg.seed))], "test_acc": {0.5: 0.9, 1: 0.2, 2: 0.2}[m]})

    p2 = plan(typed(exp), "small", [0, 1, 2], extra)
    assert sorted(p2.waiting) == ["vit_baseline", "vit_sca10"]
    new = [c for c in p2.cells if c.run_dir not in {x.run_dir for x in p.cells} and c.cfg.run.row != "listops_baseline"]
    lrs = {(c.cfg.run.row, round(float(c.cfg.optim.lr) / base_lr, 6)) for c in new}
    assert lrs == {("vit_baseline", 4.0), ("vit_sca10", 0.25)}
    stage2 = [c for c in p2.cells if int(c.cfg.seed) < 100]
    assert {int(c.cfg.seed) for c in stage2} == {0, 1, 2} and {c.cfg.run.row for c in stage2} == {"listops_baseline"}
    assert not any(o.startswith("optim.lr=") for c in stage2 for o in c.overrides)  # ×1: no override
    assert p2.picks["listops_baseline"].pick == 1

    for c in new:
        m = round(float(c.cfg.optim.lr) / base_lr, 6)
        finish(c, {"final_val_acc": {4.0: 0.65, 0.25: 0.6}[m]})
    p3 = plan(typed(exp), "small", [0, 1, 2], extra)
    assert p3.waiting == []
    picks = {k: v.as_dict() for k, v in p3.picks.items()}
    assert (picks["vit_baseline"]["pick"], picks["vit_sca10"]["pick"]) == (2, 0.25)
    assert picks["vit_sca10"]["at_bound"] and not picks["vit_baseline"]["at_bound"]
    assert math.isnan(picks["vit_sca10"]["means"][2.0])
    stage2 = [c for c in p3.cells if int(c.cfg.seed) < 100]
    assert len(stage2) == 9
    for c in stage2:
        want = {"vit_baseline": 2 * base_lr, "vit_sca10": 0.25 * base_lr, "listops_baseline": lo_lr}[c.cfg.run.row]
        assert float(c.cfg.optim.lr) == pytest.approx(want)

    # --force: stage 1 runs again before anything picks; --rows: only the row's cells, the picks of all
    assert plan(typed(exp), "small", [0, 1, 2], extra, read_records=False).waiting
    only = plan(typed(exp), "small", [0, 1, 2], extra, only_rows=["vit_sca10"])
    assert {c.cfg.run.row for c in only.cells} == {"vit_sca10"} and len(only.picks) == 3

    # the length check: SCA is worse, so it runs again at 2× steps on 2 seeds; a --rows process of SCA alone (a plan
    # that only trains) plans those runs, since the verdict reads the baseline's runs too (it once planned none)
    exp["scales"]["small"]["length_check"] = {"factor": 2, "seeds": 2}
    for c in stage2:
        acc = {"vit_baseline": 0.9, "vit_sca10": 0.5}.get(c.cfg.run.row, 0.4) + 0.01 * int(c.cfg.seed)
        finish(c, {"final_val_acc": acc, "final_test_acc": acc, "val_acc": acc, "test_acc": acc})
    steps = next(int(c.cfg.task.steps) for c in stage2 if c.cfg.run.row == "vit_sca10")
    sca_only = plan(typed(exp), "small", [0, 1, 2], extra, only_rows=["vit_sca10"], full=False)
    at2 = [c for c in sca_only.cells if int(c.cfg.task.steps) == 2 * steps]
    assert [(c.cfg.run.row, int(c.cfg.seed)) for c in at2] == [("vit_sca10", 0), ("vit_sca10", 1)]
    assert at2[0].name == "table9_readings_vit_sca10_spectral_small_s0-lr0.25x-steps2x"  # at its pick, 2× steps
    assert {c.cfg.run.row for c in sca_only.cells} == {"vit_sca10"}


def test_selection_seeds_are_required_distinct_and_never_reported(tmp_path):
    exp = grid_exp(("vit_baseline",))
    for bad in ([100], [100, 100], [2, 100]):
        exp["scales"]["small"]["selection_seeds"] = bad
        with pytest.raises(ExperimentError, match="selection_seeds"):  # refused when the file is parsed
            typed(exp)
    exp["scales"]["small"]["selection_seeds"] = [100, 101]
    with pytest.raises(ConfigError, match="selection_seeds"):  # and against the seeds a command reports
        plan(typed(exp), "small", [0, 100], [f"paths.runs={tmp_path}"])


def test_plan_refuses_lr_override_beside_a_grid_and_a_bad_grid(tmp_path):
    exp = grid_exp(("vit_baseline",))
    with pytest.raises(ConfigError, match="optim.lr=0.1 conflicts with scales.small.lr_grid"):
        plan(typed(exp), "small", [0], ["optim.lr=0.1"])
    exp["scales"]["small"]["lr_grid"] = [1, -2]
    with pytest.raises(ExperimentError, match=r"lr_grid=\[1, -2\]"):
        typed(exp)
    exp["scales"]["small"]["lr_grid"] = [0.5, 1, 3]  # not log2-spaced
    with pytest.raises(ExperimentError, match="log2-spaced"):
        typed(exp)


def test_mde_against_hand_computation():
    # n = 5 per arm, s = 2: df = 8, t_{0.975,8} = 2.3060, t_{0.8,8} = 0.8889 (t tables) -> 3.1949 · 2 · √(2/5)
    assert mde(2.0, 5) == pytest.approx(3.1949 * 2 * math.sqrt(0.4), abs=2e-3)
    assert mde(1.0, 1) is None


def test_steps_to_target_and_convergence_on_a_synthetic_curve():
    curve = [(s, 1 - math.exp(-s / 200)) for s in range(0, 1001, 100)]  # 0, 0.39, 0.63, 0.78, ...
    assert steps_to_target(curve, 0.75) == 300
    assert steps_to_target(curve, 0.999) is None
    assert steps_to_target([(0, 3.0), (10, 2.0), (20, 1.0)], 1.5, higher_is_better=False) == 20
    assert median_steps([300, None, 200]) == 300 and median_steps([300, None, None]) is None
    # last quarter of 1000 steps: from step 700 (0.9698) to step 1000 (0.9933)
    assert last_quarter_change(curve, 1000) == pytest.approx(math.exp(-3.5) - math.exp(-5))


def test_a_baseline_at_its_final_level_in_the_first_half_is_called_a_plateau():
    from condattn.table.observed import plateau_step
    assert plateau_step([200, 100, 300, 200, None], 400) == 200  # the median step, in the first half
    assert plateau_step([2500, 2400, 2600], 3000) is None
    assert plateau_step([None, None, 100], 400) is None and plateau_step([], 400) is None


def test_readings_table_reports_the_protocol(tmp_path):
    from condattn.reporting.readings import write_table

    exp = grid_exp(("vit_baseline", "vit_sca10"))
    for spec in exp["rows"].values():
        spec.pop("metrics", None)  # report final_val_acc at every scale
    runs = tmp_path / "runs" / "small"
    picks = {r: lr_pick({0.5: 0.5, 1.0: 0.6, 2.0: 0.55}, 1.0) for r in exp["rows"]}
    for row, method in (("vit_baseline", "none"), ("vit_sca10", "spectral")):
        for seed in range(3):
            d = runs / f"table9_readings_{row}_{method}_small_s{seed}"
            fast = row == "vit_sca10"
            curve = [(s, min(0.6 + 0.01 * seed, s / (200 if fast else 400))) for s in range(0, 401, 100)]
            spec = type("S", (), {"run_dir": d})
            finish(spec, {"final_val_acc": curve[-1][1]}, curve, steps=400)
    md_path, md = write_table(plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", picks=picks))
    # the baseline's mean val acc at half its training (step 200) is 50.00; the baseline reaches it at 200, SCA at 100
    assert ("| baseline (no conditioning) | baseline | 61.00 ± 1.00 (n=3) | (baseline) | – | – | – | ×1 (1e-03) | – | "
            "200 |") in md
    assert "| no difference detected (MDE 3.04) | – | ×1 (1e-03) | 3.04 / 3.04 | 100 |" in md  # 1 primary: α unchanged
    assert "gains +0.00 points" in md and "a figure, not the convergence test" in md
    assert "MDE = (t_{1−α/2,df} + t_{0.8,df})" in md
    csv = md_path.with_suffix(".csv").read_text()
    assert "×0.5: 0.5000 (s100=0.5000 s101=0.5000), ×1: 0.6000 (s100=0.6000 s101=0.6000)" in csv
    assert "converged" in csv.splitlines()[0]


@pytest.mark.slow
def test_reproduce_runs_both_stages_locally_and_reuses_them(tmp_path, capsys):
    """One command: stage 1 (seed 0 at ×1 and ×2), the pick, stage 2 (seed 1 at the pick), the table; the same
    command again trains nothing."""
    import yaml
    from test_reproduce import listops_only, tiny

    from condattn.reproduce import main

    path = listops_only(tmp_path, steps=4)
    exp = yaml.safe_load(path.read_text())
    exp["methods"] = ["none"]
    exp["scales"]["smoke"].update(lr_grid=[1, 2], selection_seeds=[100, 101], lr_bound=[1, 2])
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    args = [str(path), "--scale", "smoke", "--seeds", "0 1", *tiny(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    runs = sorted(p.name for p in (tmp_path / "runs" / "smoke").iterdir() if not p.name.startswith("."))
    # ×1, ×2 at selection seeds 100 and 101; then the reported seeds 0 and 1 at the pick
    assert len(runs) == 6 and "table4_lra_listops_none_smoke_s100" in runs
    assert "[reproduce] 4 of 4 cells run" in out and "[reproduce] 2 of 2 cells run" in out
    summary = {r: RunRecord(tmp_path / "runs" / "smoke" / r).summary for r in runs}
    assert all(set(s["code"]) == {"conditioning", "model", "task", "engine", "diagnostics"} for s in summary.values())
    assert main(args) == 0
    again = capsys.readouterr().out
    assert again.count("finished earlier, skipped") == 6 and "[reproduce] 0 of 0 cells run" in again
    # the reported seeds ran at the lr with the best mean validation score of the selection seeds (ties: ×1)
    lr = {r: s["config"]["optim"]["lr"] for r, s in summary.items()}
    by_lr: dict[float, list[float]] = {}
    for r, s in summary.items():
        if "_s10" in r:
            by_lr.setdefault(lr[r], []).append(s["metrics"]["val_acc"])
    base = min(by_lr)
    best = max(by_lr, key=lambda x: (sum(by_lr[x]), x == base))
    assert {lr[r] for r in runs if r.endswith(("_s0", "_s1")) or "_s0-" in r or "_s1-" in r} == {best}
    # --report-only --force (FORCE=1 on make report-table-N) only writes the table anyway: the picks are still read
    assert main([*args, "--report-only", "--force"]) == 0
    md = (tmp_path / "results" / "smoke" / "table4_lra.seeds-0+1.md").read_text()  # not the experiment's seeds
    assert "grid unfinished" not in md and f"({best:.0e}" in md
    # a fresh clone (no runs, the kept records): one plan reads the kept stage-1 records where they lie, so the pick,
    # the other seeds and their records come in one plan and one restore, and nothing trains again
    trained = sorted(p.name for p in (tmp_path / "results" / "smoke" / "runs").iterdir())
    assert len(trained) == 6
    shutil.rmtree(tmp_path / "runs")
    capsys.readouterr()
    assert main([*args, "--report-only"]) == 0
    assert capsys.readouterr().out.count("restored 6 finished runs") == 1  # one plan, one restore
    assert {p.name for p in (tmp_path / "runs" / "smoke").iterdir() if not p.name.startswith(".")} == \
        {n.removesuffix(".json.zst") for n in trained}


@pytest.mark.slow  # composes the cells of a table (about 3 s)
def test_the_reporting_cli_is_reproduce_report_only(tmp_path, capsys, monkeypatch):
    """`python -m condattn.reporting` is one alias of `reproduce --report-only`: the experiment's renderer, one plan."""
    import runpy

    import yaml

    exp = experiment_raw("table4_lra")
    exp["rows"] = {"listops": exp["rows"]["listops"]}
    path = tmp_path / "table4_lra.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    over = [f"paths.runs={REPO / 'tests' / 'fixtures' / 'runs'}", f"paths.results={tmp_path / 'results'}"]
    monkeypatch.setattr(sys, "argv", ["condattn.reporting", str(path), "--scale", "smoke", "--seeds", "0", *over])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("condattn.reporting", run_name="__main__")
    assert done.value.code == 0 and (tmp_path / "results" / "smoke" / "table4_lra.md").is_file()
    assert "[reproduce] wrote" in capsys.readouterr().out


def test_cost_line_projects_the_whole_table_from_each_tasks_median():
    from types import SimpleNamespace

    from helpers import provenance_of

    from condattn.reporting.readings import cost_line
    from condattn.table.provenance import spent, walls_of

    def cell(wall, missing=()):
        return SimpleNamespace(wall=wall, values=[0.9] * len(wall), missing=list(missing))

    def prov(rows, done=None, table="table9_readings"):  # the walls of the runs shown, one family per task
        tasks = {r["task"]: [w for x in rows if x["task"] == r["task"] for w in x["cell"].wall] for r in rows}
        return provenance_of(walls=walls_of(w for r in rows for w in r["cell"].wall),
                             walls_by=tuple((t, walls_of(ws)) for t, ws in tasks.items() if ws),
                             spent=spent(done or [], table), runs=sum(len(r["cell"].wall) for r in rows))

    raw = {"table": "table9_readings", "metric": "final_val_acc", "methods": ["none"], "rows": {"r": {}},
           "scales": {"small": {"seeds": [0, 1, 2, 3, 4], "lr_grid": [0.5, 1, 2], "selection_seeds": [100, 101],
                                "length_check": {"factor": 2, "seeds": 5}}, "medium": {"seeds": [0]}}}
    exp = typed(raw)
    rows = [{"task": "vit", "cell": cell([100.0, 120.0, 140.0], [3, 4]), "is_baseline": True, "test": None},
            # a row not run yet costs the task's median too
            {"task": "vit", "cell": cell([], [0, 1, 2, 3, 4]), "is_baseline": False, "test": None},
            {"task": "listops", "cell": cell([200.0], [1, 2, 3, 4]), "is_baseline": True, "test": None}]
    line = cost_line(exp, "small", rows, prov(rows))
    assert "4 runs, 0.16 h" in line and "vit 120 s, listops 200 s" in line
    # 3 rows × (5 reported + 6 selection) runs, and each baseline 5 seeds at 2× its steps
    assert "33 runs" in line and "20 run-lengths of the length check" in line
    assert f"{(120 * 11 * 2 + 200 * 11 + 120 * 10 + 200 * 10) / 2 / 3600:.1f} h" in line
    # every run the table trained (selection and length runs too), measured
    done = [{"wall_time_s": 3600.0}] * 9
    assert "Trained so far for this table: 9 runs (selection, reported and length runs), 9.00 h of run wall time " \
           "summed, 4.5 h on two processes." in cost_line(exp, "small", rows, prov(rows, done))
    # runs another table made (linked twins) are counted apart, not as this table's cost
    exp = typed({**raw, "table": "table1_imagenet"})
    mixed = [{"wall_time_s": 3600.0, "table": "table1_imagenet"}] * 2 + [{"wall_time_s": 60.0, "table": "table9_x"}]
    assert "Trained so far for this table: 2 runs (selection, reported and length runs), 2.00 h of run wall time " \
           "summed, 1.0 h on two processes; 1 more reused from table9_x." in \
        cost_line(exp, "small", rows, prov(rows, mixed, "table1_imagenet"))
    rows.append({"task": "text", "cell": cell([], [0, 1, 2, 3, 4]), "is_baseline": True, "test": None})
    assert "unknown until text has a finished run" in cost_line(exp, "small", rows, prov(rows))
    assert "whole table" not in cost_line(exp, "medium", rows[:1], prov(rows[:1]))  # one GPU, not two CPU processes
    assert cost_line(exp, "small", [one := {"task": "vit", "cell": cell([], [0])}], prov([one])) == ""


def test_a_pick_at_the_declared_bound_is_marked():
    from condattn.reporting.protocol import lr_text
    from condattn.table.result import pick_of

    def exp(pick, bound=(0.5, 2.0)):
        return pick_of(plan_of(grid_exp(), "small", ".", ".", picks={"r": lr_pick({0.5: 0.9, 1.0: 0.8, 2.0: 0.7}, pick,
                                                                                      bound=bound)}), "r")

    assert lr_text(exp(0.5)) == "×0.5 (5e-04, bound binding)"  # still beats its inner neighbour
    assert lr_text(exp(2.0)) == "×2 (2e-03, bound, weak pick)"  # at the bound, behind its neighbour
    assert lr_text(exp(1.0)) == "×1 (1e-03, weak pick)"  # not a bound; behind its neighbour ×0.5
    assert lr_text(exp(2.0, bound=(0.125, 8))) == "×2 (2e-03, weak pick)"  # inside the bound: no bound mark


def test_a_generic_table_with_an_lr_grid_prints_each_methods_protocol_and_reports_metric_at(tmp_path):
    """Tables 1/3/4/5 at small: each method of a row has its own pick ("<row>/<method>"), the held-out metric of
    `metric_at` is what the table reports, and the protocol block names Δ, lr, MDE and steps-to-target."""
    from condattn.reporting.tables import write_table

    exp = experiment_raw("table4_lra")
    exp["rows"] = {"listops": exp["rows"]["listops"]}
    exp["methods"] = ["none", "spectral"]
    exp["scales"]["small"] = {"seeds": [0, 1, 2], "rows": ["listops"], "lr_grid": [0.5, 1, 2],
                              "selection_seeds": [100, 101]}
    exp["metric_at"] = {"small": "final_test_acc"}
    t = typed(exp)
    assert t.row_metric("small", "listops") == "final_test_acc" and t.row_metric("smoke") == "test_acc"
    assert selection_key(t, "listops", "small") == "final_val_acc"
    assert t.pick_key("listops", "spectral") == "listops/spectral"
    assert typed(grid_exp()).pick_key("vit_sca10", "spectral") == "vit_sca10"  # a reading: its row is its method
    picks = {f"listops/{m}": lr_pick({0.5: 0.5, 1.0: 0.6, 2.0: 0.7}, p, bound=(0.5, 2))
             for m, p in (("none", 1.0), ("spectral", 2.0))}
    runs = tmp_path / "runs" / "small"
    for method, better in (("none", 0.0), ("spectral", 0.1)):
        for seed in range(3):
            spec = type("S", (), {"run_dir": runs / f"table4_lra_listops_{method}_small_s{seed}"})
            curve = [(s, min(0.3 + 0.01 * seed + better, s / 400)) for s in range(0, 401, 100)]
            finish(spec, {"final_test_acc": curve[-1][1] + 0.05, "test_acc": 0.0}, curve, steps=400)
    _, md = write_table(plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", picks=picks))
    assert "mean ± std over seeds of final_test_acc × 100" in md
    assert "| listops | baseline | 36.00 ± 1.00 (n=3) | (baseline) | – | – | – | ×1 (1e-03, weak pick) | – | 200 |" \
        in md
    assert "| listops | SCA | 46.00 ± 1.00 (n=3) | +10.00 [" in md
    # 3 seeds: the permutation p's floor
    assert "/ 0.100 | better | – | ×2 (2e-03, bound binding) | 3.04 / 3.04 |" in md
    assert "listops: Baseline's last quarter" in md and "listops: Plateau: the baseline reaches" in md
    assert "better than the baseline: listops SCA" in md
    assert "Training time of the runs shown: 6 runs" in md  # the cost line
    planned = tuple(f"table4_lra_listops_{m}_small_s{s}" for m in ("none", "spectral") for s in range(3))
    _, md = write_table(plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", picks=picks, planned=planned))
    assert "Trained so far for this table: 6 runs (selection, reported and length runs)" in md

    # the length check (tables 1 and 5 as table 9): the baseline and SCA again at 2× steps on seeds 0-1; SCA's
    # +10 shrinks to +0.5 there, which no test on 2 seeds separates: the verdict change is said, and the baseline's
    # convergence is its gain at 2× on the same seeds against its MDE
    exp["scales"]["small"]["length_check"] = {"factor": 2, "seeds": 2}
    longer = {}
    for method, at2 in (("none", 0.40), ("spectral", 0.405)):
        for seed in range(2):
            name = f"table4_lra_listops_{method}_small_s{seed}"
            longer[name] = "2x"
            finish(type("S", (), {"run_dir": runs / f"{name}-2x"}), {"final_test_acc": at2 + 0.01 * seed},
                   steps=800)
    path, md = write_table(plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", picks=picks,
                                   longer=longer))
    assert "| (baseline) | – | – | 40.50 ± 0.71 (n=2) | ×1 (1e-03, weak pick) |" in md
    assert "| better | +0.50 [" in md and "(n=2; verdict there: no difference detected" in md
    # table 4's ListOps claims (SCA 37.1 → 37.8: a 1.1 % relative fall in error) set the effect: +5.00 is above it
    assert "Convergence (listops): at 2× its steps the baseline gains +5.00 points [" in md
    assert "still learning (its lower bound is above 0)" in md and "SCA +10.00 → +0.50 (at a budget)" in md
    rows = {r["method"]: r for r in csv.DictReader(open(path.with_suffix(".csv")))}
    assert float(rows["spectral"]["diff_2x"]) == pytest.approx(0.5) and rows["none"]["n_2x"] == "2"
    doc = json.loads(path.with_suffix(".json").read_text())  # numbers as numbers
    assert doc["rows"][1]["diff_2x"] == pytest.approx(0.5) and doc["missing_runs"] == 0


def test_floor_check_names_the_best_floor_and_the_gap():
    from condattn.reporting.protocol import floor_text
    from condattn.table.result import FloorCheck, _floor

    entry = {"floors": [{"label": "floor: majority class", "value": 0.10, "split": "test"},
                        {"label": "floor: MLP", "value": 0.942, "split": "test"}]}
    assert _floor(entry, [96.0, 96.04], 100, True) == FloorCheck("MLP", pytest.approx(94.2), "test", True,
                                                                 pytest.approx(1.82))
    below = _floor({"floors": [{"label": "floor: tf-idf", "value": 0.74, "split": "test"}]}, [70.0, 72.0], 100, True)
    assert not below.beats and below.gap == pytest.approx(3.0)
    loss = {"floors": [{"label": "floor: trigram", "value": 4.14, "split": "test"}]}
    assert _floor(loss, [4.5], 1, False).gap == pytest.approx(0.36)  # lower is better
    assert _floor(loss, [4.0], 1, False).beats
    assert _floor(entry, [], 100, True) is None and _floor(None, [1.0], 100, True) is None
    fam = type("F", (), {"floor_metric_mismatch": "", "floor": below,
                         "baseline": type("A", (), {"at1": type("V", (), {"mean": 71.0})()})()})()
    said = floor_text(fam, "small", 1)
    assert "does NOT beat its floors: the best, tf-idf, reaches 74.0 on test, a gap of 3.0" in said


def test_the_length_check_prints_delta_at_twice_the_steps_and_judges_convergence(tmp_path):
    """The baseline and a primary row with a verdict, rerun at 2× steps on 5 seeds: Δ there beside Δ, a verdict that
    changes is said, and the baseline's convergence is its gain at 2× against its MDE."""
    from condattn.reporting.readings import write_table

    exp = grid_exp(("vit_baseline", "vit_sca10", "vit_cond_init"))
    for spec in exp["rows"].values():
        spec.pop("metrics", None)
    exp["scales"]["small"]["seeds"] = list(range(6))
    runs = tmp_path / "runs" / "small"
    longer = {}
    for row, method, gain, gain2 in (("vit_baseline", "none", 0.0, 0.002), ("vit_sca10", "spectral", -0.2, -0.2),
                                     ("vit_cond_init", "conditioned_init", 0.02, 0.0)):
        for seed in range(6):
            acc = 0.9 + gain + 0.002 * (seed % 3)
            name = f"table9_readings_{row}_{method}_small_s{seed}"
            finish(type("S", (), {"run_dir": runs / name}), {"final_val_acc": acc})
            if seed < 5:
                longer[name] = "2x"
                finish(type("S", (), {"run_dir": runs / f"{name}-2x"}),
                       {"final_val_acc": 0.9 + gain2 + 0.002 * (seed % 3)})
    exp["paper"] = {"vit_cond_init": {"ci_baseline": 80.3, "ci_conditioned": 81.5}}  # 6.1 % of the error: 0.60 here
    md_path, md = write_table(plan_of(exp, "small", tmp_path / "runs", tmp_path / "results",
                                      longer=longer))
    # SCA stays worse at 2× (Δ -20.20 there); conditioned init's +2.0 vanishes there: the verdict change is said
    assert "| worse | -20.20 [" in md and "(n=5) |" in md
    assert "; verdict there: no difference detected" in md
    # the baseline gains +0.20 points at 2× on the same 5 seeds, under the paper-sized effect here: converged, and
    # SCA's Δ held (at convergence) while conditioned init's moved by 2 points (at a budget)
    assert ("Convergence (vit): at 2× its steps the baseline gains +0.20 points [+0.20, +0.20] (90 % paired interval, "
            "the same 5 seeds at 1×); equivalence test against the paper-sized effect here, 0.6 points") in md
    assert "converged (its upper bound is under the margin)" in md
    assert "SCA -20.00 → -20.20 (at convergence)" in md and "conditioned init +2.00 → -0.20 (at a budget)" in md
    assert "Reach (vit): the MDE" in md and "conditioned init 6.1 % (80.3 → 81.5; MDE" in md
    csv = md_path.with_suffix(".csv").read_text().splitlines()
    assert "diff_2x" in csv[0] and "verdict_2x" in csv[0]


def test_local_plans_on_when_a_stage_needs_no_training(monkeypatch):
    """A stage whose new cells are all finished already (finished earlier, or linked to another table's twin runs)
    does not end the command: planning goes on and trains what the next stage adds (table 1 small, linked to table
    9's runs, stopped after its grid's extension and never planned its reported seeds)."""
    from types import SimpleNamespace as NS

    import condattn.launch as launch
    import condattn.reproduce as rp
    from condattn.table.kept import NOTHING

    stage1, extension, reported = [NS(name="s100"), NS(name="s101")], [NS(name="s100-x4")], [NS(name="s0")]
    exp = NS(metric="acc")
    def no_stage(name):
        return None

    plans = iter([(NS(exp=exp, cells=stage1 + extension, waiting=["row"], needs=no_stage), NOTHING),  # linked
                  (NS(exp=exp, cells=stage1 + extension + reported, waiting=[], needs=no_stage), NOTHING),
                  (NS(exp=exp, cells=stage1 + extension + reported, waiting=[], needs=no_stage), NOTHING)])
    trained: list[str] = []

    def run_local(pending, metric, force, needs):
        trained.extend(c.name for c in pending)
        return NS(failed=[], interrupted=False, not_started=[])

    monkeypatch.setattr(launch, "run_local", run_local)
    monkeypatch.setattr(rp, "_checked", lambda p, opts, specs, kept: NS(pending=[c for c in specs if c in reported]))
    monkeypatch.setattr(rp, "length_check", lambda exp, scale: False)
    monkeypatch.setattr(rp, "report", lambda *a, **k: 0)
    planner = NS(opts=rp.Options("small"), with_kept=lambda: next(plans))
    first = NS(exp=exp, cells=stage1, waiting=["row"], needs=no_stage)
    assert rp._local(first, planner, NS(pending=stage1), NOTHING) == 0
    assert trained == ["s100", "s101", "s0"]


def test_length_column_says_missing_for_planned_runs_at_2x_not_finished():
    from condattn.reporting.protocol import length_text
    from condattn.table.result import Arm, Basis, Values

    def arm(at2):
        return Arm("swin_base", "embedded", "CET", "CET", "primary", Values((0,), (97.0,), ()), at2, None, None, None,
                   Basis.BUDGET, None, None, False, None, 0, (), ())

    assert length_text(arm(None), False) == "–"  # the row has no length check
    planned = Values((), (), (0, 1, 2, 3, 4))  # planned at 2×, none finished
    assert length_text(arm(planned), False) == "missing" and length_text(arm(planned), True) == "missing"
    one = Values((0,), (97.0,), (1, 2, 3, 4))
    assert length_text(arm(one), False) == "– (n=1, missing seeds [1, 2, 3, 4])"  # a partial check says so
