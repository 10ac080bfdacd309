"""A table's committed run records (results/<scale>/runs/) and what reads them: a dry run reads them and writes nothing,
how a run is run (impl.threads) never makes a cell another run, an unreadable record is named in one line and nothing
that depends on it is rewritten without FORCE=1, and the advice after a stopped FORCE=1 run does not restart it."""

import shutil
from pathlib import Path

import pytest
from helpers import plan_of, typed
from omegaconf import OmegaConf

from condattn.launch import RunSpec
from condattn.reproduce import main
from condattn.runs import KeptRecord, RunRecord
from condattn.table.kept import restore_kept

REPO = Path(__file__).resolve().parents[1]
TABLE4 = REPO / "experiments" / "table4_lra.yaml"
EXP = {"table": "t", "metric": "acc", "rows": {"r": {}}, "methods": ["none"], "scales": {"small": {"seeds": [0, 1]}}}


def _cells(runs: Path, names: list[str]) -> tuple[RunSpec, ...]:
    return tuple(RunSpec(n, [], OmegaConf.create({"run": {"dir": str(runs / n)}})) for n in names)


def _keep(kept: Path, name: str) -> Path:
    rec = KeptRecord.of(kept, name)
    rec.write({"summary.json": {"status": "finished", "metrics": {"acc": 1.0}, "run_dir": "elsewhere"}})
    return rec.path


def test_a_dry_run_reads_the_kept_records_and_writes_nothing(tmp_path, capsys):
    """`reproduce-all SCALE=small DRY_RUN=1` wrote 750 run dirs (44 MB) into runs/ by restoring: the same answer is
    read where the records lie."""
    names = ["t_r_none_small_s0", "t_r_none_small_s1"]
    runs, kept = tmp_path / "runs" / "small", tmp_path / "results" / "small" / "runs"
    plan = plan_of(typed(EXP), "small", tmp_path / "runs", tmp_path / "results", cells=_cells(runs, names))
    _keep(kept, names[0])
    dry = restore_kept(plan, write=False)
    assert dry.own == (names[0],) and dry.finished == {names[0]} and not (tmp_path / "runs").exists()
    assert "would restore (dry run: nothing written) 1 finished runs" in capsys.readouterr().out
    real = restore_kept(plan)
    assert real == dry and RunRecord(runs / names[0]).finished and not (runs / names[1]).exists()


def test_an_unreadable_kept_record_is_named_never_restored_nor_stood_in_for(tmp_path):
    names = ["t_r_none_small_s0", "t_r_none_small_s1"]
    runs, kept = tmp_path / "runs" / "small", tmp_path / "results" / "small" / "runs"
    plan = plan_of(typed(EXP), "small", tmp_path / "runs", tmp_path / "results", cells=_cells(runs, names))
    _keep(kept, names[0])
    bad = _keep(kept, names[1])
    bad.write_bytes(bad.read_bytes()[:20])  # truncated
    got = restore_kept(plan)
    assert got.own == (names[0],) and set(got.corrupt) == {names[1]} and not (runs / names[1]).exists()
    u = got.corrupt[names[1]]
    assert u.record == bad and u.run_dir == runs / names[1]
    assert u.why == "not a whole zstd file (ZstdError: decompression error: did not decompress full frame)"
    bad.write_bytes(b"not zstd at all")
    assert restore_kept(plan).corrupt[names[1]].why == \
        "not a whole zstd file (ZstdError: cannot get frame parameters: Unknown frame descriptor)"


def test_after_ctrl_c_of_a_forced_run_the_advice_is_to_rerun_without_force(tmp_path, capsys, monkeypatch):
    """The same command with --force again would start the interrupted cell over from step 0 (resume=never)."""
    import condattn.launch
    import condattn.reproduce as reproduce
    from condattn.launch import LocalResult
    from condattn.table.kept import NOTHING

    plan = plan_of(typed(EXP), "small", tmp_path / "runs", tmp_path / "results")
    monkeypatch.setattr(condattn.launch, "run_local",
                        lambda *a, **kw: LocalResult(failed=["t_r_none_small_s0"], interrupted=True, ran=1))
    monkeypatch.setattr(reproduce, "report", lambda *a, **kw: 0)
    for force, advice in ((True, "rerun the same command without FORCE=1 (--force) to finish the missing ones: with "
                                 "it, the interrupted cells would start over from step 0"),
                          (False, "rerun the same command to finish the missing ones")):
        planner = reproduce.Planner(plan.exp, (0,), "t", reproduce.Options("small", force=force))
        assert reproduce._local(plan, planner, reproduce.Todo(), NOTHING) == 3
        assert f"Finished cells are kept; {advice} (interrupted cells resume" in capsys.readouterr().out


def test_a_dry_run_projects_the_time_on_this_machine_from_runs_measured_on_its_kind_of_device(tmp_path, monkeypatch):
    import torch

    from condattn.engine.cost import machine_projection

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = {"model": {"name": "m"}, "data": {"name": "d"}, "conditioning": {"method": "none"}}
    for name, device, wall in (("a", "cpu", 100.0), ("b", "cpu", 300.0), ("c", "cuda", 1.0)):
        KeptRecord.of(tmp_path, name).write({"summary.json": {
            "status": "finished", "metrics": {}, "steps": 100, "wall_time_s": wall, "config": config,
            "hardware": {"device_type": device}, "hardware_line": f"1 × {device} (here)"}})
    cell = OmegaConf.create({**config, "task": {"steps": 3600}})
    other = OmegaConf.create({**config, "model": {"name": "unmeasured"}, "task": {"steps": 10}})
    line = machine_projection([("x", cell), ("y", other)], [tmp_path])
    # the median of the two CPU runs' 1 s and 3 s per step (the CUDA run is not this kind of device) × 3600 steps
    assert line.startswith("[reproduce] on this machine (cpu, ") and "≈ 3.00 h for 1 of 2 cells" in line
    assert "on cpu, which ran on 1 × cpu (here); " in line
    assert line.endswith("; 1 cell(s) of recipes no finished run on cpu has measured, not counted")


def test_a_dry_run_counts_each_runs_fixed_cost_measured_from_its_records(tmp_path, monkeypatch):
    """A run's wall time beyond its training clock (evaluations, checkpoints, diagnostics) is a fixed cost per run:
    a projection of short runs (an override's smoke cells) counts it once per run, never as a share of each step."""
    import torch

    from condattn.engine.cost import machine_projection, measured_steps

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = {"model": {"name": "m"}, "data": {"name": "d"}, "conditioning": {"method": "none"}}
    for name, wall, train in (("a", 100.0, 40.0), ("b", 120.0, 40.0), ("c", 110.0, 60.0)):  # 100 steps each
        KeptRecord.of(tmp_path, name).write({"summary.json": {
            "status": "finished", "metrics": {}, "steps": 100, "wall_time_s": wall, "train_time_s": train,
            "config": config, "hardware": {"device_type": "cpu"}, "hardware_line": "1 × cpu (here)"}})
    step, fixed, _ = measured_steps([tmp_path], "cpu")[("m", "d", "none")]
    assert (step, fixed) == (pytest.approx(0.4), pytest.approx(60.0))  # medians of 0.4/0.4/0.6 s and 60/80/50 s
    cell = OmegaConf.create({**config, "task": {"steps": 60}})
    line = machine_projection([("x", cell), ("y", cell), ("z", cell)], [tmp_path])
    # 3 runs × (60 s fixed + 60 steps × 0.4 s) = 252 s = 0.07 h; per step alone (1.1 s × 60 × 3) it would be 198 s
    assert "≈ 0.07 h for 3 of 3 cells" in line and "fixed cost" in line


def _committed_table4(tmp_path: Path) -> Path:
    """Table 4's committed smoke records and table, copied where the test may change them: a fresh clone's results."""
    results = tmp_path / "results" / "smoke"
    shutil.copytree(REPO / "results" / "smoke" / "runs", results / "runs")
    for f in (REPO / "results" / "smoke").glob("table4_lra.*"):
        shutil.copy(f, results / f.name)
    return results


@pytest.mark.slow  # plans table 4 three times (no training): about 30 s
def test_threads_in_args_restores_the_committed_runs_and_trains_nothing(tmp_path, capsys):
    """`make reproduce-table-4 SCALE=smoke ARGS="impl.threads=2"` linked 15 "twins" from "another table", then refused
    every cell (impl.threads is 1 there and 2 here). Now its dry run writes nothing and the real one restores the 15
    committed records, trains nothing and leaves the committed table as it was."""
    results = _committed_table4(tmp_path)
    before = {f.name: f.read_bytes() for f in results.glob("table4_lra.*")}
    args = [str(TABLE4), "--scale", "smoke", f"paths.runs={tmp_path / 'runs'}", f"paths.results={tmp_path / 'results'}",
            "impl.threads=2"]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would restore (dry run: nothing written) 15 finished runs" in out and "twin" not in out
    assert "dry run: 0 of 15 cells would train here" in out and not (tmp_path / "runs").exists()
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "restored 15 finished runs" in out and "twin" not in out and "0 of 0 cells run" in out, err
    assert {f.name: f.read_bytes() for f in results.glob("table4_lra.*")} == before
    assert all(not d.is_symlink() for d in (tmp_path / "runs" / "smoke").iterdir())


@pytest.mark.slow  # plans table 4 twice (no training): about 20 s
def test_a_truncated_committed_record_is_one_line_and_leaves_the_table_as_it_was(tmp_path, capsys):
    results = _committed_table4(tmp_path)
    before = {f.name: f.read_bytes() for f in results.glob("table4_lra.*")}
    bad = results / "runs" / "table4_lra_text_spectral_smoke_s0.json.zst"
    bad.write_bytes(bad.read_bytes()[:1000])
    args = [str(TABLE4), "--scale", "smoke", f"paths.runs={tmp_path / 'runs'}", f"paths.results={tmp_path / 'results'}"]
    for _ in range(2):  # a fresh clone, then again where runs/ exists: said each time, the file never taken as a run
        assert main(args) == 1
        out, err = capsys.readouterr()
        assert err.splitlines() == [
            f"[reproduce] {bad}, the committed record of table4_lra_text_spectral_smoke_s0, is unreadable (not a whole "
            "zstd file (ZstdError: decompression error: did not decompress full frame)); its cell is not "
            f"trained and the table not rewritten: put the committed file back (git checkout -- {bad}), or retrain the "
            "cell with FORCE=1 ROWS=text (the row's cells)"]
        assert "0 of 0 cells run" in out and "the table is not written" in out
        assert {f.name: f.read_bytes() for f in results.glob("table4_lra.*")} == before
        assert len(bad.read_bytes()) == 1000
        assert not (tmp_path / "runs" / "smoke" / bad.name.removesuffix(".json.zst")).exists()
