"""Step 0 recomputed without training (condattn.engine.step0): it equals what the run measured, and a committed
record whose step 0 a resume lost gets it back, marked as recomputed; one that would not match is left alone."""

import json
import math
import re
from pathlib import Path

import pytest

from condattn.config import compose
from condattn.engine import step0
from condattn.engine.trainer import train
from condattn.runs import METRICS, SUMMARY, KeptRecord, RunRecord

LOGGED = [{"step": 0, "split": "diag", "kappa_wq/mean": 2.5, "entropy/mean": 1.25},
          {"step": 0, "split": "grad", "gradnorm_wq/mean": 0.5}, {"step": 1, "split": "train", "loss": 2.0},
          {"step": 2, "split": "diag", "kappa_wq/mean": 9.0}]


def record(root: Path, name: str = "t_r_none_smoke_s0", step0_values: dict | None = None) -> KeptRecord:
    rec = KeptRecord.of(root, name)
    summary = {"status": "finished", "metrics": {"val_acc": 0.5}, "run_name": name, "finished_at": "2026-01-01",
               "hardware": {"torch_threads": 1}, "diagnostics": {"step0": step0_values or {}, "final": {"k": 1.0}}}
    rec.write({"config.yaml": "seed: 0\n", METRICS: "".join(json.dumps(r) + "\n" for r in LOGGED),
               "patch_report.json": "{}", SUMMARY: summary})
    return KeptRecord(rec.path)


def test_logged_step0_is_the_union_of_the_step0_diag_and_grad_rows():
    text = "".join(json.dumps(r) + "\n" for r in LOGGED)
    assert step0.logged_step0(text) == {"kappa_wq/mean": 2.5, "entropy/mean": 1.25, "gradnorm_wq/mean": 0.5}


def test_difference_compares_over_the_reference_keys():
    ref = {"a": 1.0, "b": 100.0, "n": math.nan}
    assert step0.difference({**ref, "extra": 3.0}, ref) == (0.0, 0.0)  # a later version's extra key: not compared
    assert step0.difference({"a": 1.0, "b": 100.5, "n": math.nan}, ref) == (0.5, 0.005)
    assert step0.difference({"a": 1.0}, ref) == (math.inf, math.inf)
    assert step0.difference({"a": math.nan, "b": 100.0, "n": math.nan}, ref)[0] == math.inf


def test_fill_writes_the_recomputed_values_and_says_how(tmp_path, monkeypatch):
    rec = record(tmp_path)
    got = {"kappa_wq/mean": 2.5, "entropy/mean": 1.25, "gradnorm_wq/mean": 0.5, "self_logit_unit/mean": 7.0}
    monkeypatch.setattr(step0, "recompute", lambda config, threads: dict(got))
    assert step0.empty_step0([rec]) == [rec]
    line = step0.fill(rec, "abc1234")
    assert "step 0 written (3 values; largest difference to its logged step-0 rows 0)" in line
    back = KeptRecord(rec.path).summary
    d = back["diagnostics"]
    assert d["step0"] == {"kappa_wq/mean": 2.5, "entropy/mean": 1.25, "gradnorm_wq/mean": 0.5}  # what its run measured
    assert d["step0_recomputed"]["commit"] == "abc1234" and "without training" in d["step0_recomputed"]["how"]
    assert d["final"] == {"k": 1.0} and back["finished_at"] == "2026-01-01" and back["metrics"] == {"val_acc": 0.5}
    assert step0.empty_step0([KeptRecord(rec.path)]) == []


@pytest.mark.parametrize("got, why", [
    ({"kappa_wq/mean": 2.5, "entropy/mean": 1.3, "gradnorm_wq/mean": 0.5}, "differs from its logged step-0 rows by"),
    ({"kappa_wq/mean": 2.5, "gradnorm_wq/mean": 0.5}, "lacks ['entropy/mean']"),
])
def test_fill_refuses_a_recompute_that_does_not_match_the_logged_rows(tmp_path, monkeypatch, got, why):
    rec = record(tmp_path)
    before = rec.path.read_bytes()
    monkeypatch.setattr(step0, "recompute", lambda config, threads: dict(got))
    with pytest.raises(step0.NotWritten, match=re.escape(why)):
        step0.fill(rec, "abc1234")
    assert rec.path.read_bytes() == before
    line, ok = step0.guarded(step0.fill, rec, "abc1234")
    assert not ok and line.startswith(f"{rec.name}: not written, ") and why in line


def test_the_cli_names_a_missing_folder(tmp_path, capsys):
    assert step0.main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such folder; give results/<scale>/runs" in capsys.readouterr().err


@pytest.mark.slow
def test_recompute_equals_the_step0_an_uninterrupted_run_recorded(tmp_path, monkeypatch):
    """Through the real trainer: a tiny ListOps run's step 0 is recomputed bit for bit from its config.yaml; the
    run's committed record, its step 0 blanked as a resumed run's was, gets the same values back from the CLI."""
    overrides = ["scale=smoke", "logger=none", f"paths.runs={tmp_path / 'runs'}", f"paths.cache={tmp_path / 'cache'}",
                 "data.generate.train=64", "data.generate.val=24", "data.generate.test=16",
                 "data.generate.min_length=20", "data.generate.max_length=60", "data.max_length=64",
                 "data.seq_len=64", "task.batch_size=8", "task.steps=2", "task.eval_every=2", "impl.checkpoint_every=2",
                 "diagnostics.batch_size=2", "conditioning=spectral"]
    ref = train(compose(overrides))
    measured = ref["diagnostics"]["step0"]
    assert measured and "gradnorm_wq/mean" in measured and "kappa_wq/mean" in measured
    run = RunRecord(ref["run_dir"])
    assert step0.recompute(run.config_path.read_text()) == measured
    kept = tmp_path / "kept"
    assert run.keep_in(kept)
    rec = KeptRecord.of(kept, run.dir.name)
    files = rec.files
    blank = {**files[SUMMARY], "diagnostics": {**files[SUMMARY]["diagnostics"], "step0": {}}}
    rec.write({**files, SUMMARY: blank})
    assert step0.main([str(kept)]) == 0
    back = KeptRecord(rec.path).summary
    assert back["diagnostics"]["step0"] == measured
    assert back["diagnostics"]["step0_recomputed"]["max_abs_diff_to_logged_rows"] == 0.0


def test_a_run_that_cannot_be_rebuilt_is_named_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    a, b = record(tmp_path, "t_r_none_smoke_s0"), record(tmp_path, "t_r_none_smoke_s1")

    def recompute(config, threads):  # the first record (by name: s0) cannot be rebuilt
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError("model.init_from='pretrain_s0': it is no file or run dir")
        return {"kappa_wq/mean": 2.5, "entropy/mean": 1.25, "gradnorm_wq/mean": 0.5}

    calls: list[int] = []
    monkeypatch.setattr(step0, "recompute", recompute)
    monkeypatch.setattr("condattn.engine.provenance.git_commit", lambda: "abc1234")
    assert step0.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "2 of 2 records have an empty step 0" in out
    assert f"{a.name}: not recomputed, the run cannot be rebuilt here: FileNotFoundError: model.init_from=" in out
    assert f"{b.name}: step 0 written (3 values" in out
    assert [r.name for r in step0.empty_step0([KeptRecord(a.path), KeptRecord(b.path)])] == [a.name]
