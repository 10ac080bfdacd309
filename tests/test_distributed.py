"""A real 2-process gloo run on the CPU through the SLURM code path (submitit's local executor: one task
per process, torch.distributed variables from the job environment), preempted half-way with submitit's
signal, requeued, resumed: one run dir, rank 0 the only writer, and the same numbers as one process."""

import json
from pathlib import Path

import pytest
import yaml
from test_reproduce import listops_only

from condattn.config import compose
from condattn.engine.identity import is_science_key
from condattn.engine.trainer import train
from condattn.reproduce import main
from condattn.utils.io import read_json, read_jsonl

# dropout off: dropout masks are drawn per process, everything else must match one process exactly
SMALL = ["logger=none", "data.generate.train=64", "data.generate.val=23", "data.generate.test=16",
         "data.generate.min_length=20", "data.generate.max_length=60", "data.max_length=64", "data.seq_len=64",
         "task.batch_size=8", "task.steps=4", "task.eval_every=2", "task.log_every=1", "impl.checkpoint_every=2",
         "diagnostics.batch_size=2", "impl.threads=1", "model.dropout=0"]


def rows(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] in ("train", "val")]


@pytest.mark.slow
def test_two_process_gloo_job_preempted_requeued_and_equal_to_one_process(tmp_path, capsys):
    exp = listops_only(tmp_path)
    spec = yaml.safe_load(exp.read_text())
    spec["methods"] = ["none"]
    # the tiny settings are the experiment's own (extra overrides that change a result would name a variant run)
    spec["scales"]["smoke"]["overrides"] = [o for o in SMALL if is_science_key(o.split("=")[0])]
    exp.write_text(yaml.safe_dump(spec, sort_keys=False))
    paths = [f"paths.runs={tmp_path / 'runs'}", f"paths.cache={tmp_path / 'cache'}",
             f"paths.results={tmp_path / 'results'}"]
    code = main([str(exp), "--seeds", "0", "--launcher", "submitit_local", "launcher.tasks_per_node=2", *SMALL, *paths,
                 # preempted at step 2 with submitit's signal (USR2, as SLURM sends it signal_delay_s before the end)
                 "debug.interrupt_at_step=2", "debug.interrupt_signal=SIGUSR2"])
    out = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "smoke" / "table4_lra_listops_none_smoke_s0"
    logs = sorted((tmp_path / "runs" / "smoke" / ".submitit" / "table4_lra").glob("*/*_0_log.out"))
    log0 = "\n".join(p.read_text() for p in logs)
    assert code == 0, out + log0 + "\n".join(p.read_text()[-3000:] for p in logs[0].parent.glob("*_log.err"))
    assert "n = 1 (no spread)" in out

    s = read_json(run_dir / "summary.json")
    assert s["status"] == "finished" and s["steps"] == 4
    assert s["hardware"]["num_processes"] == 2 and s["global_batch"] == 8 and s["micro_batch"] == 4
    assert s["launch"]["launcher"] == "submitit_local" and s["launch"]["resumed_at_steps"] == [2]
    assert "Requeued job" in log0 and "resumed table4_lra_listops_none_smoke_s0 from step_0000002" in log0

    # one run dir shared by both ranks; only rank 0 wrote files (each rank's RNG state lives in the checkpoint)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "best_model.pt", "checkpoints", "config.yaml", "metrics.jsonl", "patch_report.json", "summary.json"]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step_0000004").iterdir()) == [
        "COMPLETE", "custom_checkpoint_0.pkl", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
        "random_states_1.pkl", "scheduler.bin"]
    lines = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], r["split"]) for r in lines]
    assert len(keys) == len(set(keys))  # no row written twice (by two ranks, or before and after the requeue)
    assert all(r["n"] == 23 for r in lines if r["split"] == "val")  # gather_for_metrics drops the padding duplicates

    # the same run in one process: same global batches (the sampler deals micro-batch blocks to ranks), same
    # schedule (one scheduler step per optimizer step), same numbers up to float reduction order
    one = train(compose(["scale=smoke", f"paths.runs={tmp_path / 'one'}", f"paths.cache={tmp_path / 'cache'}",
                         *SMALL]))
    a, b = rows(Path(one["run_dir"])), rows(run_dir)
    assert [(r["step"], r["split"]) for r in a] == [(r["step"], r["split"]) for r in b]
    for ra, rb in zip(a, b):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5, abs=1e-6)
        assert ra["acc"] == rb["acc"] and ra.get("lr") == rb.get("lr") and ra.get("n") == rb.get("n")
    assert one["metrics"]["test_acc"] == s["metrics"]["test_acc"]
