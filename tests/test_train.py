"""The trainer end to end on tiny generated ListOps: CLI, summary, resume after SIGTERM, determinism, bad input."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from condattn.config import compose
from condattn.engine.preflight import PreflightError, batch_split, preflight
from condattn.engine.trainer import TrainingDiverged, TrainingInterrupted, train
from condattn.launch import ConfigError, compose_cell
from condattn.utils.io import read_json, read_jsonl

REPO = Path(__file__).resolve().parents[1]


def tiny(tmp: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "scale=smoke", "logger=none", f"paths.runs={tmp}", f"paths.cache={cache}",
        "data.generate.train=256", "data.generate.val=64", "data.generate.test=64", "data.generate.max_length=120",
        "data.max_length=128", "data.seq_len=128", "task.steps=6", "task.eval_every=3", "task.log_every=1",
        "impl.checkpoint_every=2", "diagnostics.batch_size=2", *extra,
    ]


def mini(tmp: Path, cache: Path, *extra: str) -> list[str]:
    """Smaller and faster than tiny(): batch 8, length 64 (= the 64 landmarks: exact attention), 4 steps."""
    return [
        "scale=smoke", "logger=none", f"paths.runs={tmp}", f"paths.cache={cache}", "data.generate.train=64",
        "data.generate.val=24", "data.generate.test=16", "data.generate.min_length=20", "data.generate.max_length=60",
        "data.max_length=64", "data.seq_len=64", "task.batch_size=8", "task.steps=4", "task.eval_every=2",
        "task.log_every=1", "impl.checkpoint_every=2", "diagnostics.batch_size=2", *extra,
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
    # the tiny data and steps are options the readable name does not carry: a variant name (engine/identity.py)
    (run_dir,) = (tmp_path / "smoke").glob("lra_listops_spectral+embedded_smoke_s0-*")
    assert run_dir.name in out.stdout
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "finished" and s["steps"] == 6 and s["global_batch"] == 32
    assert 0.0 <= s["metrics"]["test_acc"] <= 1.0
    assert s["patch"]["counts"] == {"spectral:hf_separate_qkv": 2, "embedded:hf_encoder": 1}
    assert s["data"]["stand_in"] and len(s["data"]["checksum"]) == 64
    assert s["versions"]["torch"].startswith("2.") and s["commit"]
    # everything needed to rerun it: the resolved config, where and how it ran
    assert s["config"]["conditioning"]["method"] == "spectral+embedded" and s["config"]["seed"] == 0
    assert s["hardware"]["num_processes"] == 1 and s["launch"]["launcher"] == "local"
    assert s["launch"]["resumed_at_steps"] == []
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
    # step 0's diagnostics came back with the checkpoint (a resumed run once recorded step0 = {})
    assert resumed["diagnostics"]["step0"] == ref["diagnostics"]["step0"] and "gradnorm_wq/mean" in ref["diagnostics"][
        "step0"]
    assert resumed["diagnostics"]["final"] == ref["diagnostics"]["final"]
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
    # the launcher's wrapper: one line naming the override and the likely intended one
    with pytest.raises(ConfigError, match=r"override 'model=nope': there is no configs/model/nope.yaml; .*available: "
                                          r".*nystromformer_lra"):
        compose_cell(["model=nope"])
    with pytest.raises(ConfigError, match=r"did you mean conditioning=spectral\?"):
        compose_cell(["conditioning=spectal"])
    with pytest.raises(ConfigError, match=r"override 'conditioning.lamda=3' names no key of the config; did you mean "
                                          r"conditioning.lam\?"):
        compose_cell(["conditioning.lamda=3"])
    with pytest.raises(ConfigError, match=r"'impl.micro_batch=4' names no key .*did you mean impl.micro_batch_size\?"):
        compose_cell(["impl.micro_batch=4"])


def test_preflight_names_each_bad_value(tmp_path):
    cfg = compose(["conditioning=spectral", "conditioning.lam=x", "task.steps=abc",
                   "optim.schedule=cosinus", "impl.precision=fp64", f"paths.runs={tmp_path}"])
    msgs = [str(p) for p in preflight(cfg, check_data=False)]
    assert "conditioning.lam='x' must be a number, not a string" in msgs
    assert "task.steps='abc' must be a positive integer" in msgs
    assert any(m.startswith("unknown schedule optim.schedule='cosinus'; known: linear, cosine") for m in msgs)
    assert "impl.precision='fp64': choose no, bf16 or fp16" in msgs
    assert len(msgs) == 4


def test_bad_conditioning_value_stops_before_training(tmp_path, cache):
    with pytest.raises(ValueError, match="identity='diagonal' is invalid"):
        train(compose(tiny(tmp_path, cache, "conditioning=spectral", "conditioning.identity=diagonal")))


def test_inconsistent_batch_is_refused(tmp_path, cache):
    with pytest.raises(PreflightError, match=r"task.batch_size=0 must be a positive integer"):
        train(compose(tiny(tmp_path, cache, "task.batch_size=0")))
    # the planned process count of a launcher counts: 32 over 3 GPUs cannot split
    cfg = compose(tiny(tmp_path, cache, "launcher=slurm", "launcher.gpus_per_node=3"))
    assert [str(p) for p in preflight(cfg)] == [
        "global batch task.batch_size=32 does not split over 3 processes; use a process count that divides it "
        "(1, 2, 4, 8, 16, 32, …) or another global batch"
    ]


def test_micro_batch_is_derived_from_the_global_batch_and_the_processes():
    """impl.micro_batch_size is a cap: the largest divisor of the per-process share under it, the rest accumulated;
    every process count that divides the global batch works."""
    from omegaconf import OmegaConf

    def split(glob, cap, world):
        return batch_split(OmegaConf.create({"task": {"batch_size": glob}, "impl": {"micro_batch_size": cap}}), world)

    assert split(256, 128, 1) == (256, 128, 2)  # LRA image/pathfinder at paper scale on one GPU
    assert split(256, 128, 4) == (256, 64, 1)  # gpus_per_node=4, as in docs/cluster.md's examples
    assert split(256, 128, 8) == (256, 32, 1)
    assert split(96, 64, 1) == (96, 48, 2)
    assert split(32, 5, 1) == (32, 4, 8)
    assert split(32, None, 2) == (32, 16, 1)
    for world in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        glob, micro, accum = split(256, 128, world)
        assert micro * accum * world == glob and micro <= 128
    for bad, msg in [((32, 8, 3), "does not split over 3 processes"), ((0, None, 1), "task.batch_size=0 must be"),
                     ((32, 0, 1), "impl.micro_batch_size=0 must be")]:
        with pytest.raises(ValueError, match=msg):
            split(*bad)


def test_paper_scale_without_data_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        train(compose(["scale=paper", "logger=none", f"paths.runs={tmp_path}", f"data.root={tmp_path / 'nowhere'}"]))


@pytest.mark.slow
def test_unreadable_checkpoints_are_set_aside(tmp_path, cache):
    """The only checkpoint is unreadable: it is set aside as step_N.corrupt, and the error says a rerun starts over."""
    from condattn.engine.checkpoint import CheckpointUnreadable

    cfg = compose(tiny(tmp_path, cache, "task.steps=2"))
    ck = Path(cfg.run.dir) / "checkpoints" / "step_0000001"
    ck.mkdir(parents=True)
    (ck / "COMPLETE").write_text("1")
    (ck / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointUnreadable, match="no checkpoint of .* can be read .*start this run from step 0"):
        train(cfg)
    assert not ck.exists() and (ck.parent / "step_0000001.corrupt").is_dir()


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, cache, capsys):
    with pytest.raises(TrainingInterrupted):
        train(compose(mini(tmp_path, cache, "impl.checkpoint_every=1", "debug.interrupt_at_step=3")))
    cfg = compose(mini(tmp_path, cache, "impl.checkpoint_every=1"))
    ckpts = Path(cfg.run.dir) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_0000002", "step_0000003"]
    (ckpts / "step_0000003" / "model.safetensors").write_bytes(b"truncated")
    s = train(cfg)
    err = capsys.readouterr().err
    assert "warning: cannot resume from checkpoint" in err and "set it aside as step_0000003.corrupt" in err
    assert s["steps"] == 4 and s["launch"]["resumed_at_steps"] == [2]
    assert (ckpts / "step_0000003.corrupt").is_dir()
    steps = [r["step"] for r in read_jsonl(Path(cfg.run.dir) / "metrics.jsonl") if r["split"] == "train"]
    assert steps == [1, 2, 3, 4]  # step 3's row of the first session was dropped with its checkpoint


@pytest.mark.slow
def test_checkpoint_of_another_architecture_is_refused(tmp_path, cache):
    with pytest.raises(TrainingInterrupted):
        train(compose(mini(tmp_path, cache, "debug.interrupt_at_step=1")))  # leaves checkpoints/step_0000001
    other = compose(mini(tmp_path, cache, "model.hidden_size=32"))  # same run dir, narrower model
    # the run dir records its config: the differing key is named first
    mismatch = r"holds a run of another config: model.hidden_size is 64 there and 32 here"
    assert re.search(mismatch, "\n".join(map(str, preflight(other))))
    with pytest.raises(PreflightError, match=mismatch):
        train(other)
    # a checkpoint without its config (copied in, or from a run dir of an older version): the tensors tell
    (Path(other.run.dir) / "config.yaml").unlink()
    msg = (r"checkpoint .*step_0000001 was written by a different architecture: .* is \[\d+, 64\] there and "
           r"\[\d+, 32\] here .*choose another run.name, or resume=never")
    problems = preflight(other)  # before any job starts (the model is built on the meta device)
    assert [p.kind for p in problems] == ["checkpoint"] and __import__("re").search(msg, str(problems[0]))
    with pytest.raises(ValueError, match=msg):  # and again at start-up, against the real model
        train(other)


@pytest.mark.slow
def test_diverging_loss_names_step_and_last_good_checkpoint(tmp_path, cache):
    # lr 1e6 warmed up over 12 steps: the update of step 2 (lr 1.7e5) makes the loss NaN; the weights of
    # step 1 still gave a finite loss
    cfg = compose(mini(tmp_path, cache, "optim.lr=1e6", "optim.schedule=linear", "impl.checkpoint_every=1",
                       "task.steps=6"))  # linear warm-up from 0 (ListOps' own OneCycle starts at lr / 25)
    run_dir = Path(cfg.run.dir)
    with pytest.raises(TrainingDiverged, match=r"non-finite training loss \(nan\) at step 3 of .*\(after 2 "
                                               r"optimizer steps\); last good checkpoint: .*checkpoints/step_0000001\. "
                                               r"Lower optim.lr"):
        train(cfg)
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "failed" and s["step"] == 3 and s["last_good_checkpoint"].endswith("step_0000001")
    # an exploding (still finite) loss stops too when impl.max_loss is set
    with pytest.raises(TrainingDiverged, match=r"training loss above impl.max_loss=1.0 \(2\.\d+\) at step 1 .*last "
                                               r"good checkpoint: none"):
        train(compose(mini(tmp_path, cache, "impl.max_loss=1.0", "resume=never")))


@pytest.mark.slow
def test_deterministic_mode_gives_bit_identical_runs(tmp_path, cache):
    runs = [train(compose(mini(tmp_path / d, cache, "impl.deterministic=true", "conditioning=spectral+embedded")))
            for d in ("a", "b")]
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the run
    assert train_rows(runs[0]["run_dir"]) == train_rows(runs[1]["run_dir"])
    assert runs[0]["metrics"] == runs[1]["metrics"]
    wa, wb = (load_file(str(Path(r["run_dir"]) / "checkpoints" / "step_0000004" / "model.safetensors")) for r in runs)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert runs[0]["config"]["impl"]["deterministic"] is True


@pytest.mark.gpu
def test_bf16_training_step_on_gpu(tmp_path, cache):
    s = train(compose(tiny(tmp_path, cache, "impl.precision=bf16", "conditioning=spectral+embedded")))
    assert s["hardware"]["device_type"] == "cuda" and s["steps"] == 6


@pytest.mark.slow
def test_train_cli_bad_value_is_one_line_and_writes_nothing(tmp_path):
    """`python -m condattn.train` refuses a bad value with one message (no traceback), on every rank, and neither
    Hydra nor the trainer creates a directory for a run that never started."""
    import os

    args = [sys.executable, "-m", "condattn.train", "scale=smoke", "logger=none", "conditioning=spectral",
            "conditioning.lam=x", f"paths.runs={tmp_path / 'runs'}"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RANK": "0", "PYTHONPATH": str(REPO)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == "[condattn] conditioning.lam='x' must be a number, not a string"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no runs/, outputs/, .hydra, train.log


def test_train_cli_bad_value_is_silent_on_other_ranks(tmp_path, capsys, monkeypatch):
    """The same refusal on rank 1 (in-process: the check before Hydra is `cli`): exit 2, nothing said twice."""
    from condattn.train import cli

    monkeypatch.setenv("RANK", "1")
    monkeypatch.chdir(tmp_path)
    assert cli(["scale=smoke", "logger=none", "conditioning=spectral", "conditioning.lam=x",
                f"paths.runs={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []


def test_resumed_epoch_starts_at_its_batch_without_loading_the_skipped_samples():
    """EpochSampler.set_epoch(e, skip=k): the epoch's order from micro-batch k on, for every rank; len stays the
    epoch's (the trainer counts batches against it)."""
    from condattn.data.sampler import EpochSampler

    for world in (1, 2):
        for rank in range(world):
            s = EpochSampler(103, seed=7, rank=rank, world=world, block=4)
            s.set_epoch(3)
            full = list(s)
            s.set_epoch(3, skip=5)
            assert list(s) == full[5 * 4:] and len(s) == len(full)


@pytest.mark.slow
def test_an_interrupted_run_of_a_method_that_adds_parameters_resumes(tmp_path, cache):
    """σReparam adds σ parameters to W_Q/W_K/W_V: its checkpoints hold them, and the preflight's architecture check
    (the model on the meta device) patches the model as the trainer does, so the run resumes instead of being refused
    as another architecture."""
    with pytest.raises(TrainingInterrupted):
        train(compose(mini(tmp_path, cache, "conditioning=sigma_reparam", "debug.interrupt_at_step=2")))
    cfg = compose(mini(tmp_path, cache, "conditioning=sigma_reparam"))
    assert preflight(cfg) == []
    s = train(cfg)
    assert s["steps"] == 4 and s["launch"]["resumed_at_steps"] == [2]
