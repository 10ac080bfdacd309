"""Twins (engine/twins.py): a finished run of the same science config under another table's name is linked and reused
by `reproduce`, never one of another config (the thread count is how a run is run, not which run it is); `--force`
trains the cell in its own dir and leaves the twin as it was; the tables' provenance counts the runs made for another
table."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from condattn.engine.twins import TwinIndex, link, made_elsewhere
from condattn.runs import RunRecord


def cfg(name: str, lr: float = 1e-3, threads: int = 1, table: str = "table9_readings") -> dict:
    return {"run": {"name": name, "table": table}, "paths": {"runs": "/somewhere"}, "seed": 0,
            "optim": {"lr": lr}, "conditioning": {"method": "none"}, "impl": {"threads": threads}}


def make_run(root, name: str, config: dict, finished: bool = True):
    rec = RunRecord(root / name)
    rec.dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), rec.config_path)
    if finished:
        rec.write_summary({"status": "finished", "run_dir": str(rec.dir), "table": config["run"]["table"],
                           "metrics": {"val_acc": 0.5}, "steps": 10, "wall_time_s": 1.0,
                           "hardware": {"torch_threads": config["impl"]["threads"]}})
    return rec.dir


def test_a_twin_is_a_finished_run_of_the_same_science_config_only(tmp_path):
    twin = make_run(tmp_path, "table9_readings_a_none_small_s0", cfg("table9_readings_a_none_small_s0"))
    make_run(tmp_path, "table9_readings_b_none_small_s0", cfg("b", lr=2e-3))  # another lr
    other_threads = make_run(tmp_path, "table9_readings_c_none_small_s0", cfg("c", lr=3e-3, threads=2))
    make_run(tmp_path, "table9_readings_d_none_small_s0", cfg("d", lr=5e-4), finished=False)
    index = TwinIndex(tmp_path)
    here = tmp_path / "table1_imagenet_vit_base_none_small_s0"
    assert index.find(cfg(here.name, table="table1_imagenet"), here) == twin  # run.* and paths.* are no science
    assert index.find(cfg(here.name, lr=4e-3), here) is None
    assert index.find(cfg(here.name, lr=5e-4), here) is None  # its only run of that lr has not finished
    assert TwinIndex(tmp_path).find(cfg(here.name, threads=2), here) == twin  # threads: how it ran, not what
    assert TwinIndex(tmp_path).find(cfg(here.name, lr=3e-3), here) == other_threads
    assert index.find(cfg(twin.name), twin) is None  # a run is not its own twin

    link(here, twin)
    assert here.is_symlink() and not here.readlink().is_absolute()  # relative: the runs root can move
    assert RunRecord(here).finished and RunRecord(here).summary["table"] == "table9_readings"
    assert TwinIndex(tmp_path).find(cfg("e", table="table4_lra"), tmp_path / "e") == twin  # links are not indexed


def test_made_elsewhere_counts_the_runs_of_other_tables():
    sums = [{"table": "table9_readings"}, {"table": "table9_readings"}, {"table": "table1_imagenet"},
            {"config": {"run": {"table": "table4_lra"}}}, {}]
    assert made_elsewhere(sums, "table1_imagenet") == {"table9_readings": 2, "table4_lra": 1}


@pytest.mark.slow  # trains one ListOps cell of a few steps
def test_reproduce_reuses_another_tables_run_and_force_trains_its_own(tmp_path, capsys):
    from test_reproduce import listops_only, tiny

    from condattn.reproduce import main

    path = listops_only(tmp_path, steps=2)
    exp = yaml.safe_load(path.read_text())
    exp["methods"] = ["none"]
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    copy = tmp_path / "copy.yaml"
    copy.write_text(yaml.safe_dump({**exp, "table": "table4_copy"}, sort_keys=False))
    args = ["--scale", "smoke", "--seeds", "0", *tiny(tmp_path)]
    assert main([str(path), *args]) == 0
    capsys.readouterr()
    runs = tmp_path / "runs" / "smoke"
    original = runs / "table4_lra_listops_none_smoke_s0"
    before = (original / "summary.json").read_text()

    assert main([str(copy), *args]) == 0
    out = capsys.readouterr().out
    mine = runs / "table4_copy_listops_none_smoke_s0"
    # the original's record is kept (stored once): the copy's cell is linked to it, not trained again
    assert "1 of them linked to the record of the same science config made under another name" in out
    assert mine.is_symlink() and "0 of 0 cells run" in out
    md = (tmp_path / "results" / "smoke" / "table4_copy.md").read_text()
    assert "1 of them made for table4_lra (the same science config, reused" in md

    assert main([str(copy), *args, "--force", "--dry-run"]) == 0 and mine.is_symlink()  # a dry run changes nothing
    assert main([str(copy), *args, "--force"]) == 0
    assert not mine.is_symlink() and RunRecord(mine).finished
    assert (original / "summary.json").read_text() == before  # the twin is untouched

    # the owner's run is no longer finished (retrained or removed): a link to it goes, and the cell reuses another
    # finished run of its config (here the copy's own, trained above) or trains
    (mine_too := runs / "table4_copy2_listops_none_smoke_s0").parent.mkdir(parents=True, exist_ok=True)
    from condattn.engine.twins import link

    link(mine_too, original)
    (original / "summary.json").rename(original / "summary.json.bak")
    copy2 = tmp_path / "copy2.yaml"
    copy2.write_text(yaml.safe_dump({**exp, "table": "table4_copy2"}, sort_keys=False))
    assert main([str(copy2), *args]) == 0
    assert mine_too.resolve() == mine.resolve() and RunRecord(mine_too).finished
    assert (original / "summary.json.bak").read_text() == before and not (original / "summary.json").exists()
    capsys.readouterr()
    assert main([str(copy), *args, "--no-reuse", "task.steps=3"]) == 0  # a new config: its own run, no twin
    assert "reused (linked)" not in capsys.readouterr().out
