"""Fault injection (issue 36): a truncated, empty or wrong-format summary.json, best_model.pt or tokenizer copy is set
aside as <name>.corrupt, named in one line, and the run is repaired from what remains (engine/artefacts.py)."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from condattn.config import compose
from condattn.engine.artefacts import repair
from condattn.runs import RunRecord

sys.path.insert(0, str(Path(__file__).parent))
from helpers import mini_listops  # noqa: E402

FAULTS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: max(p.stat().st_size // 2, 1)]),
    "zero bytes": lambda p: p.write_bytes(b""),
    "wrong format": lambda p: p.write_text("[1, 2, 3]\n" if p.suffix == ".json" else "<html>not weights</html>\n"),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished 4-step run (checkpoints at steps 3 and 4, the best validation at step 4) and its summary."""
    from condattn.engine.trainer import train

    tmp = tmp_path_factory.mktemp("artefacts")
    cfg = compose(mini_listops(tmp, "impl.checkpoint_every=1", "task.eval_every=4"))
    return tmp, cfg, train(cfg)


def _copy(finished, tmp_path):
    """The finished run copied under tmp_path: (its config there, its run dir, the original summary)."""
    src, cfg, summary = finished
    shutil.copytree(src / "runs", tmp_path / "runs")
    cfg = compose(mini_listops(tmp_path, "impl.checkpoint_every=1", "task.eval_every=4",
                               f"paths.cache={src / 'cache'}"))
    return cfg, Path(cfg.run.dir), summary


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_corrupt_summary_is_set_aside_and_the_run_evaluated_again(finished, tmp_path, capsys, fault):
    from condattn.engine.trainer import train

    cfg, run, before = _copy(finished, tmp_path)
    FAULTS[fault](run / "summary.json")
    s = train(cfg)
    err = capsys.readouterr().err
    assert f"[condattn] {run / 'summary.json'} is unreadable (" in err
    assert "set it aside as summary.json.corrupt; evaluating the run again from its last checkpoint step_0000004" in err
    assert (run / "summary.json.corrupt").is_file() and RunRecord(run).finished
    assert s["steps"] == 4 and s["metrics"]["test_acc"] == before["metrics"]["test_acc"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_corrupt_best_model_is_rebuilt_from_the_best_steps_checkpoint(finished, tmp_path, capsys, fault):
    """An unfinished run (its summary gone) whose best_model.pt broke: on today's main every rerun failed with torch's
    "PytorchStreamReader failed reading zip archive" and no file named."""
    from condattn.engine.trainer import train

    cfg, run, before = _copy(finished, tmp_path)
    (run / "summary.json").unlink()
    FAULTS[fault](run / "best_model.pt")
    s = train(cfg)
    err = capsys.readouterr().err
    assert f"[condattn] {run / 'best_model.pt'} is unreadable (" in err
    assert "set it aside as best_model.pt.corrupt; rebuilt it from step_0000004 (the best-validation step 4)" in err
    assert (run / "best_model.pt.corrupt").is_file()
    assert s["metrics"]["test_acc"] == before["metrics"]["test_acc"]
    assert s["metrics"]["test_loss"] == pytest.approx(before["metrics"]["test_loss"], abs=1e-6)


@pytest.mark.slow
def test_a_corrupt_best_model_of_a_finished_run_is_rebuilt_and_the_summary_stands(finished, tmp_path, capsys):
    """`train` on a finished run: rebuilt from the best step's checkpoint, as for a run still training (and as
    `reproduce` does: tests/test_artefacts.py::test_reproduce_rebuilds_a_zero_byte_best_model_as_train_does)."""
    from condattn.engine.trainer import train

    cfg, run, before = _copy(finished, tmp_path)
    good = torch.load(run / "best_model.pt", weights_only=True)
    FAULTS["zero bytes"](run / "best_model.pt")
    s = train(cfg)
    err = capsys.readouterr().err
    assert (f"[condattn] {run / 'best_model.pt'} is unreadable (it is empty (0 bytes)); set it aside as "
            "best_model.pt.corrupt; rebuilt it from step_0000004 (the best-validation step 4)") in err
    assert s["metrics"] == before["metrics"]
    assert all(torch.equal(good[k], v) for k, v in torch.load(run / "best_model.pt", weights_only=True).items())


def test_a_finished_run_without_its_best_steps_checkpoint_keeps_its_summary(tmp_path):
    run = tmp_path / "run"
    for step in (6, 8):
        _ckpt(run, step, 4)
    (run / "summary.json").write_text(json.dumps({"status": "finished", "metrics": {"test_acc": 0.5}}))
    (run / "best_model.pt").write_bytes(b"")
    lines = repair(run, say=lambda m: None)
    assert len(lines) == 1 and lines[0].endswith(
        "the run had finished, so its summary stands (its test metric was taken with those weights before the file "
        "broke); no checkpoint of its best-validation step is kept, so those weights are lost (resume=never trains "
        "the run again)"), lines
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000006", "step_0000008"]


@pytest.mark.slow
def test_reproduce_rebuilds_a_zero_byte_best_model_as_train_does(tmp_path, capsys):
    """A table's finished cell with a zero-byte best_model.pt: `make reproduce-table-N` says so in one line and
    rebuilds it from the best step's checkpoint (it used to skip the cell silently), then skips the cell."""
    from test_reproduce import listops_only, tiny

    from condattn.reproduce import main

    args = [str(listops_only(tmp_path)), "--seeds", "0", *tiny(tmp_path)]
    assert main(args) == 0
    run = tmp_path / "runs" / "smoke" / "table4_lra_listops_none_smoke_s0"
    good = torch.load(run / "best_model.pt", weights_only=True)
    table = (tmp_path / "results" / "smoke" / "table4_lra.csv").read_text()
    (run / "best_model.pt").write_bytes(b"")
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "best_model.pt" in ln and "unreadable" in ln]
    assert len(said) == 1 and said[0].startswith(f"[reproduce] {run / 'best_model.pt'} is unreadable (it is empty "
                                                 "(0 bytes)); set it aside as best_model.pt.corrupt; rebuilt it from "
                                                 "step_"), out
    assert "table4_lra_listops_none_smoke_s0: finished earlier, skipped" in out
    assert all(torch.equal(good[k], v) for k, v in torch.load(run / "best_model.pt", weights_only=True).items())
    assert (tmp_path / "results" / "smoke" / "table4_lra.csv").read_text() == table


def _ckpt(run: Path, step: int, best: int) -> None:
    d = run / "checkpoints" / f"step_{step:07d}"
    d.mkdir(parents=True)
    (d / "COMPLETE").write_text(str(step))
    torch.save({"step": step, "best_val": 0.5, "best_step": best}, d / "custom_checkpoint_0.pkl")
    (d / "model.safetensors").write_bytes(b"")  # never read: the best step has no checkpoint in these cases


@pytest.mark.parametrize("kept,best,left,said", [
    ((2, 6, 8), 4, ["step_0000002"], "resuming from step_0000002, before it, so training reaches that step again"),
    ((6, 8), 4, [], "no checkpoint at or before the best-validation step 4 is kept: training the run again from step 0 "
                    "(forced by the corrupt best_model.pt)"),
])
def test_without_the_best_steps_checkpoint_the_run_trains_that_step_again(tmp_path, kept, best, left, said):
    run = tmp_path / "run"
    for step in kept:
        _ckpt(run, step, best)
    (run / "best_model.pt").write_bytes(b"PK\x03\x04 truncated")
    lines = repair(run, say=lambda m: None)
    assert len(lines) == 1 and said in lines[0] and str(run / "best_model.pt") in lines[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == left


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_corrupt_tokenizer_copy_is_set_aside_and_the_cache_read(tmp_path, capsys, fault):
    run, cache = tmp_path / "run", tmp_path / "cache"
    run.mkdir()
    cache.mkdir()
    good = json.dumps({"version": "1.0", "model": {"type": "WordPiece", "vocab": {"[PAD]": 0}}})
    (cache / "tokenizer.json").write_text(good)
    (run / "tokenizer.json").write_text(good)
    (run / "summary.json").write_text(json.dumps({"status": "finished", "metrics": {}, "data": {"cache": str(cache)}}))
    FAULTS[fault](run / "tokenizer.json")
    assert RunRecord(run).tokenizer_file() == cache / "tokenizer.json"
    assert (run / "tokenizer.json.corrupt").is_file() and not (run / "tokenizer.json").exists()
    assert f"warning: {run / 'tokenizer.json'} is unreadable (" in capsys.readouterr().err
    (run / "tokenizer.json").write_text("{}")  # the trainer's check before it resumes: the copy is made again
    assert repair(run, say=lambda m: None) == [
        f"{run / 'tokenizer.json'} is unreadable (a JSON object without a tokenizer 'model'); set it aside as "
        "tokenizer.json.corrupt1; the data cache's tokenizer is copied in again when the run's data is built"]
