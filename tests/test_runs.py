"""The run record (condattn.runs): names built and read back in one place, the status every reader relies on, the
files of a run directory, and run directories written by the trainer before the record existed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from condattn.runs import KeptRecord, RunId, RunRecord, RunSummary, resolve_run_dir, summary_is_finished, summary_status

# frozen from real runs of `python -m condattn.train scale=smoke logger=none task=lra_listops task.steps=2` (the
# trainer before condattn.runs existed; diagnostics rows and the config trimmed to a few keys)
FIXTURES = Path(__file__).parent / "fixtures" / "runs"
REAL = "table4_lra_listops_none_smoke_s0"
FAILED = "table4_lra_listops_spectral_smoke_s0"  # the same with impl.max_loss=0.01: diverged at step 1


@pytest.fixture
def real_run(tmp_path) -> RunRecord:
    shutil.copytree(FIXTURES, tmp_path / "runs")
    return RunRecord(tmp_path / "runs" / "smoke" / REAL)


def write(path: Path, text: str | dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    return path


# ------------------------------------------------------------------------------------------------ names


def test_run_id_builds_the_names_reproduce_uses():
    run = RunId("table4_lra", "listops", "spectral+embedded", "smoke", 2)
    assert run.name == "table4_lra_listops_spectral+embedded_smoke_s2"
    assert run.dir("runs") == Path("runs/smoke/table4_lra_listops_spectral+embedded_smoke_s2")


def test_run_id_parses_names_back_with_underscores_and_prefix_methods():
    rows, methods = ["rotten_tomatoes", "mnli", "pretrain"], ["none", "embedded", "spectral+embedded"]
    for row in rows:
        for method in methods:
            for seed in (0, 11):
                run = RunId("table3_glue", row, method, "small", seed)
                assert RunId.parse(run.name, "table3_glue", rows, methods, "small") == run
    # "spectral+embedded" is not read as row "..._spectral+" with method "embedded"
    assert RunId.parse("table3_glue_mnli_spectral+embedded_small_s0", "table3_glue", rows, methods, "small").method \
        == "spectral+embedded"
    for other in ("table3_glue_mnli_none_smoke_s0",  # another scale
                  "table4_lra_mnli_none_small_s0",  # another table
                  "table3_glue_qqp_none_small_s0",  # not a row
                  "table3_glue_mnli_none_small_s",  # no seed
                  "table3_glue_mnli_none_small_s1_0"):  # not a seed
        assert RunId.parse(other, "table3_glue", rows, methods, "small") is None


# ------------------------------------------------------------------------------------------------ status


@pytest.mark.parametrize("content, status", [
    (None, "absent"),
    ('{"status": "finished", "metr', "corrupt"),  # half-written
    ("\x00\x00garbage", "corrupt"),
    ("[1, 2]", "corrupt"),  # JSON, but no summary
    ({"status": "finished", "steps": 8}, "corrupt"),  # finished without metrics
    ({"metrics": {"test_acc": 0.5}}, "corrupt"),  # no status
    ({"status": "failed", "error": "loss is nan"}, "failed"),
    ({"status": "running"}, "running"),
    ({"status": "finished", "metrics": {}}, "finished"),
])
def test_status(tmp_path, content, status):
    run = tmp_path / "run"
    if content is not None:
        write(run / "summary.json", content)
    record = RunRecord(run)
    assert record.status == status == summary_status(run)
    assert record.finished is (status == "finished")
    assert (record.summary is not None) is (status == "finished")
    assert summary_is_finished(run) == record.summary
    assert record.failure() == ("loss is nan" if status == "failed" else None)


def test_a_real_run_written_by_the_trainer_reads(real_run):
    assert real_run.status == "finished" and real_run.looks_like_run()
    s = real_run.summary
    assert s["metrics"]["test_acc"] == 0.06 and s["steps"] == 2
    view = real_run.summary_view()
    assert (view.status, view.run_name, view.steps, view.seed) == ("finished", REAL, 2, 0)
    assert view.run_id == RunId("table4_lra", "listops", "none", "smoke", 0) and view.run_id.name == REAL
    assert view.metrics["val_acc"] == pytest.approx(0.0733, abs=1e-4)
    assert view.hardware_line == "1 × cpu (x86_64, 2 cores)" and view.commit and view.wall_time_s > 0
    assert view.data["stand_in"] is True and view.raw is not None and view.raw["global_batch"] == 32
    assert [r["split"] for r in real_run.metrics_rows()] == ["diag", "grad", "train", "val", "diag"]
    assert [r["step"] for r in real_run.metrics_rows("diag")] == [0, 2]
    assert real_run.patch_report()["method"] == "none"
    assert real_run.submission() is None and real_run.final_weights() is None  # (weights not frozen)


def test_a_real_failed_run_reads_and_write_failure_writes_the_same(tmp_path, real_run):
    failed = RunRecord(real_run.dir.parent / FAILED)
    s = failed.read_summary()
    assert failed.status == "failed" and failed.summary is None and failed.failure().startswith("training loss above")
    assert failed.summary_view().run_id is None  # a failure summary carries no identity keys
    again = RunRecord(tmp_path / "again").write_failure(s["error"], s["step"], None, s["run_name"], s["config"])
    assert again == {**s, "run_dir": str(tmp_path / "again")}


def test_tables_read_the_real_runs(real_run):
    """The readers see the real runs through the record: the finished one counts, the failed one is missing
    with its error."""
    from helpers import plan_of

    from condattn.reporting.curves import _run_state
    from condattn.reporting.tables import collect

    exp = {"table": "table4_lra", "metric": "test_acc", "methods": ["none", "spectral"], "rows": {"listops": {}},
           "scales": {"smoke": {"seeds": [0]}}}
    cells = collect(plan_of(exp, "smoke", real_run.dir.parent.parent, "."))
    assert cells[("listops", "none")].values == [pytest.approx(6.0)] and cells[("listops", "none")].steps == [2]
    assert cells[("listops", "spectral")].missing == [0]
    why = _run_state(real_run.dir.parent.parent, RunId("table4_lra", "listops", "spectral", "smoke", 0))
    assert why.startswith("failed: training loss above impl.max_loss=0.01")


def test_an_old_summary_with_missing_keys_reads(tmp_path):
    record = RunRecord(write(tmp_path / "old" / "summary.json", {"status": "finished", "metrics": {"test_acc": 0.4},
                                                                 "steps": 10}).parent)
    view = record.summary_view()
    assert record.status == "finished" and view.metrics == {"test_acc": 0.4} and view.steps == 10
    assert view.commit is None and view.hardware_line is None and view.run_id is None
    assert RunSummary.from_dict({}).status is None


# ------------------------------------------------------------------------------------------------ writers


def test_write_summary_is_atomic_and_reads_back(tmp_path):
    record = RunRecord(tmp_path / "new")
    record.write_summary({"status": "finished", "metrics": {"val_acc": 0.5}})
    assert record.status == "finished" and record.summary["metrics"] == {"val_acc": 0.5}
    assert [p.name for p in record.dir.iterdir()] == ["summary.json"]  # no temporary file left behind


def test_write_failure_writes_the_trainers_failed_summary(tmp_path):
    record = RunRecord(tmp_path / "run")
    s = record.write_failure("loss is inf at step 3", 3, tmp_path / "run/checkpoints/step_0000002", "t_r_m_smoke_s0",
                             {"seed": 0})
    # the keys and values the trainer's failure summary has had since before the run record
    assert s == {"status": "failed", "error": "loss is inf at step 3", "step": 3,
                 "last_good_checkpoint": str(tmp_path / "run/checkpoints/step_0000002"), "run_name": "t_r_m_smoke_s0",
                 "run_dir": str(tmp_path / "run"), "config": {"seed": 0}}
    assert record.status == "failed" and record.summary is None and record.failure() == "loss is inf at step 3"
    assert record.write_failure("x", 1, None, "n", {})["last_good_checkpoint"] == ""


# ------------------------------------------------------------------------------------------------ files


def checkpoint(run: Path, step: int, complete: bool = True, weights: bool = True) -> Path:
    d = run / "checkpoints" / f"step_{step:07d}"
    d.mkdir(parents=True)
    if complete:
        (d / "COMPLETE").write_text(str(step))
    if weights:
        (d / "model.safetensors").write_bytes(b"w")
    return d


def test_checkpoints_and_final_weights(tmp_path):
    run = tmp_path / "run"
    record = RunRecord(run)
    assert record.checkpoints() == [] and record.latest_checkpoint() is None and record.final_weights() is None
    assert not record.looks_like_run()
    write(run / "best_model.pt", "b")
    assert record.final_weights() == run / "best_model.pt"
    c9, c10 = checkpoint(run, 9), checkpoint(run, 10)
    checkpoint(run, 11, complete=False)  # being written: not listed
    assert record.checkpoints() == [c9, c10] and record.latest_checkpoint() == c10  # numeric order
    assert record.final_weights() == c10 / "model.safetensors" and record.looks_like_run()
    (c10 / "model.safetensors").unlink()
    assert record.final_weights() == run / "best_model.pt"


def test_metrics_rows_drop_a_torn_last_line(tmp_path):
    write(tmp_path / "metrics.jsonl", '{"step": 1, "split": "val", "acc": 0.5}\n{"step": 2, "split": "train"}\n'
                                      '{"step": 3, "spl')
    record = RunRecord(tmp_path)
    assert [r["step"] for r in record.metrics_rows()] == [1, 2] and record.metrics_rows("val")[0]["acc"] == 0.5


def test_tokenizer_file_of_a_pretraining_run(tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"
    record = RunRecord(run)
    assert record.tokenizer_file() is None
    write(run / "config.yaml", yaml.safe_dump({"data": {"tokenizer": "tok/tokenizer.json"}}))
    assert record.tokenizer_file() == Path("tok/tokenizer.json")  # the config's data.tokenizer
    write(run / "summary.json", {"status": "failed", "data": {"cache": str(cache)}})
    assert record.tokenizer_file() == Path("tok/tokenizer.json")  # the cache holds no tokenizer yet
    write(cache / "tokenizer.json", '{"model": {}}')
    assert record.tokenizer_file() == cache / "tokenizer.json"  # the data cache named by the summary comes first
    from condattn.engine.setup import keep_tokenizer

    keep_tokenizer({"cache": str(cache)}, run)  # what the trainer does at the start of a run
    write(cache / "tokenizer.json", '{"model": {"retrained": 1}}')  # the cache cleared and rebuilt: other ids
    assert record.tokenizer_file() == run / "tokenizer.json" and (run / "tokenizer.json").read_text() == '{"model": {}}'
    keep_tokenizer({"cache": str(cache)}, run)  # a resumed run keeps its first copy
    assert (run / "tokenizer.json").read_text() == '{"model": {}}'
    keep_tokenizer({}, tmp_path / "other")  # a builder without a cache: nothing to keep
    assert not (tmp_path / "other").exists()


def test_submission_record(tmp_path):
    record = RunRecord(tmp_path / "run")
    record.write_submission({"launcher": "slurm", "job_id": "12"})
    assert record.submission() == {"launcher": "slurm", "job_id": "12"}
    write(record.submission_path, "{torn")
    assert record.submission() is None


def test_resolve_run_dir(tmp_path):
    runs = tmp_path / "runs"
    a = runs / "smoke" / "t_a_none_smoke_s0"
    ckpt = checkpoint(a, 4)
    assert resolve_run_dir(str(ckpt / "model.safetensors"), runs) == a
    write(a / "best_model.pt", "b")
    assert resolve_run_dir(str(a / "best_model.pt"), runs) == a
    assert resolve_run_dir(str(a), runs) == a
    assert resolve_run_dir("t_a_none_smoke_s0", runs) == a
    (runs / "small" / "t_a_none_smoke_s0").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="several runs match"):
        resolve_run_dir("t_a_none_smoke_s0", runs)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_run_dir("nothing", runs)


def test_pretrained_weights_go_through_the_record(tmp_path):
    from condattn.models.pretrained import weights_file

    run = tmp_path / "runs" / "smoke" / "t_a_none_smoke_s0"
    checkpoint(run, 4)
    with pytest.raises(FileNotFoundError, match=r"has not finished \(summary: absent\)"):
        weights_file(str(run))
    write(run / "summary.json", {"status": "finished", "steps": 4})
    with pytest.raises(FileNotFoundError, match=r"has not finished \(summary: corrupt\)"):
        weights_file(str(run))
    write(run / "summary.json", {"status": "finished", "metrics": {}})
    assert weights_file("t_a_none_smoke_s0", tmp_path / "runs") == run / "checkpoints/step_0000004/model.safetensors"


# ------------------------------------------------------------------------------------------------ kept records


def test_a_finished_run_is_kept_without_weights_and_restored_elsewhere(tmp_path, real_run):
    (real_run.dir / "best_model.pt").write_bytes(b"weights")
    (real_run.dir / "checkpoints" / "step_0000002").mkdir(parents=True)
    kept = tmp_path / "results" / "smoke" / "runs"
    assert real_run.keep_in(kept)
    copy = KeptRecord.of(kept, REAL)
    assert [p.name for p in kept.iterdir()] == [f"{REAL}.json.zst"]  # one compressed file a run, no weights
    assert sorted(copy.files) == sorted(
        f for f in ("config.yaml", "metrics.jsonl", "patch_report.json", "summary.json") if (real_run.dir / f).exists())
    assert copy.summary == real_run.summary
    before = copy.path.read_bytes()
    copy.write(copy.files)
    assert copy.path.read_bytes() == before  # the same record gives the same bytes
    assert not real_run.keep_in(kept)  # the same summary is kept already: nothing is written again

    fresh = RunRecord(tmp_path / "clone" / "runs" / "smoke" / REAL)  # a fresh clone: no runs, the kept records
    assert fresh.restore_from(copy) and fresh.finished
    assert fresh.summary["run_dir"] == str(fresh.dir) and fresh.summary["restored_from"] == str(copy.path)
    assert fresh.metrics_rows() == real_run.metrics_rows()
    assert not fresh.restore_from(copy)  # never over a run dir that exists
    assert not fresh.latest_checkpoint()  # no weights travel: the run counts as finished, nothing resumes from it


def test_an_unfinished_run_is_neither_kept_nor_restored(tmp_path):
    run = RunRecord(write(tmp_path / "runs" / "r" / "summary.json", {"status": "failed", "error": "x"}).parent)
    assert not run.keep_in(tmp_path / "kept") and not (tmp_path / "kept").exists()
    assert not RunRecord(tmp_path / "new").restore_from(KeptRecord.of(tmp_path / "kept", "r"))
    assert not (tmp_path / "new").exists()


def test_a_restored_run_is_never_kept_again_and_a_newer_record_is_never_replaced(tmp_path, real_run):
    from condattn.runs import RunLock

    kept = tmp_path / "kept"
    assert real_run.keep_in(kept)
    clone = RunRecord(tmp_path / "clone" / REAL)
    assert clone.restore_from(KeptRecord.of(kept, REAL))
    assert not clone.keep_in(kept)  # the clone's copy (another run_dir, restored_from) is not written back
    assert KeptRecord.of(kept, REAL).summary == real_run.summary

    newer = {**real_run.summary, "finished_at": "2999-01-01T00:00:00", "metrics": {"test_acc": 0.99}}
    KeptRecord.of(kept, REAL).write({**KeptRecord.of(kept, REAL).files, "summary.json": newer})  # a pull
    assert not real_run.keep_in(kept)  # the older local run does not replace it
    assert KeptRecord.of(kept, REAL).summary["metrics"] == {"test_acc": 0.99}
    lock = RunLock(clone.dir)
    assert lock.try_acquire()
    assert not clone.restore_from(KeptRecord.of(kept, REAL))  # a process holds the dir: left alone
    lock.release()
    assert clone.restore_from(KeptRecord.of(kept, REAL))  # an earlier restore gives way to the newer record
    assert clone.summary["metrics"] == {"test_acc": 0.99}
    assert not real_run.restore_from(KeptRecord.of(kept, REAL))  # a run trained here is never replaced
