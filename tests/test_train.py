"""The trainer end to end on tiny generated ListOps: CLI, summary, resume after SIGTERM, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from condattn.config import compose
from condattn.engine.io import read_jsonl
from condattn.engine.trainer import TrainingInterrupted, train

REPO = Path(__file__).resolve().parents[1]


def tiny(tmp: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "scale=smoke", "logger=none", f"paths.runs={tmp}", f"paths.cache={cache}",
        "data.generate.train=256", "data.generate.val=64", "data.generate.test=64", "data.generate.max_length=120",
        "data.max_length=128", "data.seq_len=128", "task.steps=6", "task.eval_every=3", "task.log_every=1",
        "impl.checkpoint_every=2", "diagnostics.batch_size=2", *extra,
    ]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data_cache")


def final_weights(run_dir: str) -> dict:
    return load_file(str(Path(run_dir) / "checkpoints" / "step_0000006" / "model.safetensors"))


def train_rows(run_dir: str) -> list[dict]:
    return [r for r in read_jsonl(Path(run_dir) / "metrics.jsonl") if r["split"] in ("train", "val")]


@pytest.mark.slow
def test_cli_run_writes_summary_metrics_and_diagnostics(tmp_path, cache):
    cmd = [sys.executable, "-m", "condattn.train", *tiny(tmp_path, cache, "conditioning=spectral+embedded")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "test_acc=" in out.stdout
    run_dir = tmp_path / "smoke" / "lra_listops_spectral+embedded_smoke_s0"
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "finished" and s["steps"] == 6 and s["global_batch"] == 32
    assert 0.0 <= s["metrics"]["test_acc"] <= 1.0
    assert s["patch"]["counts"] == {"spectral:hf_separate_qkv": 2, "embedded:hf_encoder": 1}
    assert s["data"]["stand_in"] and len(s["data"]["checksum"]) == 64
    assert s["versions"]["torch"].startswith("2.") and s["commit"]
    d0 = s["diagnostics"]["step0"]
    assert d0["kappa_x/b0"] <= 2.0 + 1e-3  # CET at the first block's input
    assert d0["kappa_wq/l0"] < 1.5  # SCA's λ = 10 dominates W_Q
    assert d0["gradnorm_wq/l0"] >= 0.0
    splits = {r["split"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert {"train", "val", "diag", "grad"} <= splits
    assert (run_dir / "config.yaml").exists() and (run_dir / "checkpoints" / "step_0000006").is_dir()
    assert len(list((run_dir / "checkpoints").iterdir())) == 2  # keep_checkpoints=2


@pytest.mark.slow
def test_interrupt_and_resume_equals_uninterrupted_run(tmp_path, cache):
    ref = train(compose(tiny(tmp_path / "a", cache)))
    cfg = compose(tiny(tmp_path / "b", cache, "debug.interrupt_at_step=3"))
    with pytest.raises(TrainingInterrupted, match="step 3"):
        train(cfg)
    run_dir = Path(cfg.run.dir)
    assert not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoints" / "step_0000003").is_dir()
    resumed = train(compose(tiny(tmp_path / "b", cache)))
    assert resumed["steps"] == 6 and resumed["metrics"] == ref["metrics"]
    assert train_rows(ref["run_dir"]) == train_rows(resumed["run_dir"])
    wa, wb = final_weights(ref["run_dir"]), final_weights(resumed["run_dir"])
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # a finished run is not trained again
    again = train(compose(tiny(tmp_path / "b", cache)))
    assert again["finished_at"] == resumed["finished_at"]


@pytest.mark.slow
def test_same_seed_same_numbers_and_other_seed_differs(tmp_path, cache):
    a = train(compose(tiny(tmp_path / "a", cache, "conditioning=embedded")))
    b = train(compose(tiny(tmp_path / "b", cache, "conditioning=embedded")))
    c = train(compose(tiny(tmp_path / "c", cache, "conditioning=embedded", "seed=1")))
    assert train_rows(a["run_dir"]) == train_rows(b["run_dir"])
    assert train_rows(a["run_dir"]) != train_rows(c["run_dir"])


def test_bad_overrides_are_refused_with_their_name():
    with pytest.raises(Exception, match="nope"):
        compose(["model=nope"])
    with pytest.raises(Exception, match="lamda"):
        compose(["conditioning.lamda=3"])


def test_bad_conditioning_value_stops_before_training(tmp_path, cache):
    with pytest.raises(ValueError, match="identity='diagonal' is invalid"):
        train(compose(tiny(tmp_path, cache, "conditioning=spectral", "conditioning.identity=diagonal")))


def test_inconsistent_batch_is_refused(tmp_path, cache):
    with pytest.raises(ValueError, match="not divisible by impl.micro_batch_size=5"):
        train(compose(tiny(tmp_path, cache, "impl.micro_batch_size=5")))


def test_paper_scale_without_data_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        train(compose(["scale=paper", "logger=none", f"paths.runs={tmp_path}", f"data.root={tmp_path / 'nowhere'}"]))


def test_corrupt_checkpoint_is_reported(tmp_path, cache):
    cfg = compose(tiny(tmp_path, cache, "task.steps=2"))
    ck = Path(cfg.run.dir) / "checkpoints" / "step_0000001"
    ck.mkdir(parents=True)
    (ck / "COMPLETE").write_text("1")
    (ck / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="cannot resume from checkpoint .*step_0000001"):
        train(cfg)


@pytest.mark.gpu
def test_bf16_training_step_on_gpu(tmp_path, cache):
    s = train(compose(tiny(tmp_path, cache, "impl.precision=bf16", "conditioning=spectral+embedded")))
    assert s["hardware"]["device_type"] == "cuda" and s["steps"] == 6
