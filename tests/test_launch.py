"""Launchers: the SLURM submission a table generates (mocked executor, no sbatch here), its dry run, the
submitit job protocol (distributed environment, checkpoint/requeue hook), launcher validation."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit
from test_reproduce import listops_only, tiny

from condattn import launch
from condattn.config import compose
from condattn.reproduce import main
from condattn.utils.io import read_json, write_json_atomic

SLURM = ["--launcher", "slurm", "launcher.partition=gpu", "launcher.account=proj", "launcher.qos=high",
         "launcher.nodes=2", "launcher.gpus_per_node=4", "launcher.timeout_min=600", "launcher.array_parallelism=2",
         "launcher.signal_delay_s=300", "launcher.cpus_per_task=10", "launcher.mem_gb=128",
         "launcher.setup=[module load cuda/12.4,source .venv/bin/activate]"]
EXPECTED_PARAMETERS = {
    "job_name": "condattn_table4_lra_smoke", "partition": "gpu", "account": "proj", "qos": "high", "nodes": 2,
    "ntasks_per_node": 4, "gpus_per_node": 4, "cpus_per_task": 10, "mem": "128GB", "time": 600,
    "signal_delay_s": 300, "array_parallelism": 2, "setup": ["module load cuda/12.4", "source .venv/bin/activate"],
}


class FakeSlurmExecutor(launch._DryRunSlurmExecutor):
    """submitit's executor with real parameter checking, recording what would be submitted."""

    instances: list = []

    def __init__(self, **kw):
        super().__init__(**kw)
        self.init_kwargs, self.updates, self.submitted = kw, [], []
        FakeSlurmExecutor.instances.append(self)

    def update_parameters(self, **kw):
        self.updates.append(kw)
        super().update_parameters(**kw)

    def map_array(self, fn, overrides):
        self.submitted.append((fn, list(overrides)))
        return [SimpleNamespace(job_id=f"4242_{i}") for i in range(len(overrides))]


@pytest.fixture
def fake_executor(monkeypatch):
    FakeSlurmExecutor.instances = []
    monkeypatch.setattr(launch, "SlurmExecutor", FakeSlurmExecutor)
    return FakeSlurmExecutor


@pytest.mark.slow
def test_slurm_submission_parameters_with_mocked_executor(tmp_path, fake_executor, capsys, monkeypatch):
    exp = str(listops_only(tmp_path))
    runs = tmp_path / "runs" / "smoke"
    # one cell already finished: it is not submitted again
    done = runs / "table4_lra_listops_spectral_smoke_s0"
    write_json_atomic(done / "summary.json", {"status": "finished", "metrics": {"test_acc": 0.5}, "steps": 4,
                                              "wall_time_s": 1.0, "run_dir": str(done)})
    assert main([exp, "--seeds", "0", *SLURM, *tiny(tmp_path)]) == 0
    out = capsys.readouterr().out
    (ex,) = fake_executor.instances
    assert ex.init_kwargs == {"folder": (runs / ".submitit" / "table4_lra" / "%j").absolute(),
                              "max_num_timeout": 20, "python": None}
    assert ex.updates == [EXPECTED_PARAMETERS, {"time": 30}]  # --time from the cells' estimate (the 30 min floor)
    (fn, overrides), = ex.submitted
    assert isinstance(fn, launch.TrainJob) and fn.cwd == str(Path.cwd())
    names = [o[o.index("run.name=") + 9:] for ov in overrides for o in ov if o.startswith("run.name=")]
    assert names == ["table4_lra_listops_none_smoke_s0", "table4_lra_listops_embedded_smoke_s0"]
    assert all("launcher=slurm" in ov and "launcher.gpus_per_node=4" in ov for ov in overrides)
    assert "table4_lra_listops_spectral_smoke_s0: finished earlier, skipped" in out
    assert "#SBATCH --array=0-1%2" in out and "submitted table4_lra_listops_embedded_smoke_s0: job 4242_1" in out
    assert "each job: 2 nodes × 4 processes per node (4 GPUs per node) = 8 processes; global batch 8 = 1 per " \
           "process × 8 × 1 accumulation step" in out
    rec = read_json(runs / "table4_lra_listops_none_smoke_s0" / "submission.json")
    assert rec["job_id"] == "4242_0" and rec["launcher"] == "slurm"

    # submitting again while the jobs are still queued submits nothing (squeue says PENDING)
    monkeypatch.setattr(launch, "squeue_states", lambda job_id: {"PENDING"})
    assert main([exp, "--seeds", "0", *SLURM, *tiny(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "table4_lra_listops_none_smoke_s0: job 4242_0 (PENDING) is still queued or running, skipped" in out
    assert "nothing to submit" in out and len(fake_executor.instances) == 1


@pytest.mark.slow
def test_dry_run_prints_the_exact_sbatch_script_and_submits_nothing(tmp_path, fake_executor, capsys):
    exp = str(listops_only(tmp_path))
    args = [exp, "--scale", "paper", "--dry-run", *SLURM, f"paths.runs={tmp_path / 'runs'}",
            f"paths.data_root={tmp_path / 'nodata'}"]
    assert main(args) == 0  # missing data is a warning in a dry run (it may exist only on the cluster)
    out = capsys.readouterr().out
    assert "warnings (a real submission would refuse these):" in out and "paper-scale data missing" in out
    assert ("9 cells to submit as one SLURM job array (launcher=slurm, --time=30 min: the estimate (assumed, a "
            "fallback (no `make bench` result for nystromformer_lra on H100 in launcher.bench_dir): step-bound: "
            "launcher.min_step_ms=25 per step; evaluation included) × launcher.time_margin + 15 min, capped at "
            "launcher.timeout_min=600, dry run: nothing is submitted)") in out
    assert ("warning: 9 cell(s) (table4_lra_listops_none_paper_s0, …): 8 GPUs per cell: the estimate gives ") in out
    assert "1.0× faster for 8.0× the GPU-hours (step-bound: launcher.min_step_ms=25 per step (assumed" in out
    folder = (tmp_path / "runs" / "paper" / ".submitit" / "table4_lra").absolute()
    script = out[out.index("    #!/bin/bash"):]
    for line in ("#SBATCH --account=proj", "#SBATCH --array=0-8%2", "#SBATCH --cpus-per-task=10",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --job-name=condattn_table4_lra_paper", "#SBATCH --mem=128GB",
                 "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --qos=high",
                 "#SBATCH --signal=USR2@300", "#SBATCH --time=30", "module load cuda/12.4",
                 f"#SBATCH --output={folder}/%A_%a/%A_%a_0_log.out", "export SUBMITIT_EXECUTOR=slurm",
                 f"-u -m submitit.core._submit {folder}/%j"):
        assert line in script, line
    assert "[8] " in out and "python -m condattn.train model=nystromformer_lra" in out
    assert all(not ex.submitted for ex in fake_executor.instances)
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    # without the dry run, the missing data refuses the submission
    assert main(args[:3] + args[4:]) == 2
    assert "paper-scale data missing" in capsys.readouterr().err


def test_distributed_environment_from_submitit():
    env = SimpleNamespace(num_tasks=8, num_nodes=2, global_rank=5, local_rank=1, node=1, raw_job_id="1234567",
                          hostnames=["gpu-a01", "gpu-a02"])
    assert launch.distributed_env(env) == {
        "CONDATTN_NUM_NODES": "2", "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1", "GROUP_RANK": "1", "MASTER_ADDR": "gpu-a01", "MASTER_PORT": str(20000 + 1234567 % 20000),
    }
    single = SimpleNamespace(num_tasks=1, num_nodes=1, raw_job_id="7")
    assert launch.distributed_env(single) == {"CONDATTN_NUM_NODES": "1"}  # no torch.distributed for one task
    one_node = SimpleNamespace(num_tasks=2, num_nodes=1, global_rank=0, local_rank=0, node=0, raw_job_id="9",
                               hostnames=["vm"])
    assert launch.distributed_env(one_node, master_port=29400)["MASTER_ADDR"] == "127.0.0.1"
    assert launch.distributed_env(one_node, master_port=29400)["MASTER_PORT"] == "29400"


def test_train_job_requeues_the_same_cell():
    job = launch.TrainJob("/somewhere", 29400)
    again = job.checkpoint(["seed=1", "run.name=x"])
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert isinstance(again.function, launch.TrainJob) and again.function.cwd == "/somewhere"
    assert again.args == (["seed=1", "run.name=x"],) and again.function.master_port == 29400


def test_launcher_values_are_checked():
    def problems(*ov):
        return [str(p) for p in launch.launcher_problems(compose(["launcher=slurm", *ov]))]

    assert problems() == []
    assert problems("launcher.gpus_per_node=-1") == ["launcher.gpus_per_node=-1 must be an integer ≥ 1 (GPUs per node)"]
    assert problems("launcher.gpus_per_node=0") == ["launcher.gpus_per_node=0 gives the job no GPU: set gpus_per_node "
                                                    "≥ 1, or launcher.tasks_per_node=1 too for a CPU-only job"]
    assert problems("launcher.gpus_per_node=0", "launcher.tasks_per_node=1") == []  # the documented CPU-only job
    assert problems("launcher.nodes=0") == ["launcher.nodes=0 must be an integer ≥ 1"]
    assert problems("launcher.gpus_per_node=4", "launcher.tasks_per_node=1") == [
        "launcher.tasks_per_node=1 but gpus_per_node=4: one process per GPU is required (leave it null)"]
    assert problems("launcher.timeout_min=1", "launcher.signal_delay_s=90") == [
        "launcher.signal_delay_s=90 is not shorter than the time limit launcher.timeout_min=1 min"]
    assert [str(p) for p in launch.launcher_problems(compose(["launcher=submitit_local", "launcher.nodes=2"]))] == [
        "launcher=submitit_local runs on this machine: launcher.nodes must be 1"]
    # an sbatch option submitit does not know is refused by its own parameter check
    with pytest.raises(ValueError, match=r"Unavailable parameter\(s\): \['gpus'\]"):
        launch.make_executor(compose(["launcher=slurm"]).launcher, "t", "j", dry_run=True).update_parameters(gpus=3)


def test_time_per_cell_from_its_estimate_with_a_margin_and_the_cap(monkeypatch):
    from condattn.engine import cost

    cfg = compose(["task=imagenet_vit", "scale=paper", "launcher=slurm", "run.name=x"])
    estimate = cost.cell_cost("x", cfg)
    wall_min = estimate.gpu_hours / estimate.gpus * 60
    assert launch.cell_time_min(cfg) == min(1440, max(30, math.ceil(wall_min * 1.5 + 15)))
    monkeypatch.setattr(cost, "cell_cost", lambda name, cfg: SimpleNamespace(gpu_hours=0.1, gpus=1, note=""))
    assert launch.cell_time_min(cfg) == 30  # 6 min × 1.5 + 15: the 30 min floor
    monkeypatch.setattr(cost, "cell_cost", lambda name, cfg: SimpleNamespace(gpu_hours=10.0, gpus=1, note=""))
    assert launch.cell_time_min(cfg) == 915
    monkeypatch.setattr(cost, "cell_cost", lambda name, cfg: SimpleNamespace(gpu_hours=30.0, gpus=1, note=""))
    assert launch.cell_time_min(cfg) == 1440  # capped: requeue covers the rest
    monkeypatch.setattr(cost, "cell_cost", lambda name, cfg: SimpleNamespace(gpu_hours=None, gpus=1, note=""))
    assert launch.cell_time_min(cfg) == 1440  # no estimate: the cap


def test_gpu_warning_only_for_several_gpus_on_an_overhead_bound_cell():
    lra = ["scale=paper", "launcher=slurm", "run.name=x"]
    w = launch.gpu_warning(compose([*lra, "launcher.gpus_per_node=4"]))
    assert w.startswith("4 GPUs per cell: the estimate gives ")
    assert "1.0× faster for 4.0× the GPU-hours (step-bound" in w
    assert launch.gpu_warning(compose(lra)) is None  # one GPU
    assert launch.gpu_warning(compose(["task=imagenet_vit", *lra, "launcher.gpus_per_node=4",
                                       "launcher.cpus_per_task=64"])) is None  # FLOP-bound: the GPUs are used


def test_gpu_advice_follows_the_plans_own_estimates():
    """ImageNet ViT-B on 8 GPUs: each process feeds its own loader workers, so the plan's own estimate (the same one
    its total and --time use) gives 8× the speed for the same GPU-hours: no advice to drop to one GPU (today's main
    advised it, "about 8× the GPU-hours for little speed-up", against its own numbers)."""
    from condattn.engine.cost import cell_cost

    vit = ["task=imagenet_vit", "scale=paper", "launcher=slurm", "run.name=x"]
    eight, one = (compose([*vit, f"launcher.gpus_per_node={n}"]) for n in (8, 1))
    c8, c1 = cell_cost("x", eight), cell_cost("x", one)
    assert c8.gpu_hours == pytest.approx(c1.gpu_hours) and c8.wall_hours == pytest.approx(c1.wall_hours / 8)
    assert launch.gpu_warning(eight) is None
    assert launch.cell_time_min(eight) < launch.cell_time_min(one)  # --time follows the same estimate


def _bench_file(folder: Path, step_ms: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "gpu01_cuda_bf16.json"
    write_json_atomic(f, {"hardware": {"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}, "results": [
        {"model": "nystromformer_lra_listops", "batch": 32, "precision": "bf16",
         "arms": {"baseline": {"step_ms": step_ms}, "SCA": {"step_ms": 1.5 * step_ms}}}]})
    return f


def test_time_limits_come_from_a_measured_step_time_with_evaluation(tmp_path):
    """`make bench` on the target GPU writes step times (results/bench/*.json); the plan reads them, says so, and counts
    the evaluations; without one the assumed constants are a labelled fallback."""
    from condattn.engine.cost import cell_cost

    pf = ["task=lra_pathfinder32", "model=nystromformer_lra", "data=lra_pathfinder", "scale=paper", "launcher=slurm",
          "run.name=x", f"launcher.bench_dir={tmp_path / 'bench'}"]
    assert launch.time_source(compose(pf)) == (
        "assumed, a fallback (no `make bench` result for nystromformer_lra on H100 in launcher.bench_dir): step-bound: "
        "launcher.min_step_ms=25 per step")
    f = _bench_file(tmp_path / "bench", step_ms=100.0)
    cfg = compose(pf)
    c = cell_cost("x", cfg)
    assert c.measured == ("measured: 100.0 ms a step at batch 32 (nystromformer_lra_listops, baseline) on NVIDIA "
                          f"H100 80GB HBM3, {f.name}")
    per_sample = 0.100 / 32 * 1024 / 2048  # timed at length 2048, the cell is 1024 long
    train_h = 62400 * 256 * per_sample / 3600
    evals = 62400 // int(cfg.task.eval_every) + 1
    assert c.eval_hours == pytest.approx(train_h * evals * 20000 / (3 * 62400 * 256))
    assert c.gpu_hours == pytest.approx(train_h + c.eval_hours)
    assert launch.cell_time_min(cfg) == math.ceil(c.gpu_hours * 60 * 1.5 + 15)
    assert launch.time_source(cfg) == c.measured
    sca = cell_cost("x", compose([*pf, "conditioning=spectral"]))
    assert "(nystromformer_lra_listops, SCA)" in sca.measured and sca.gpu_hours == pytest.approx(1.5 * c.gpu_hours)
    assert cell_cost("x", compose([*pf, "launcher.gpu_type=A100"])).measured is None  # measured on another GPU


@pytest.mark.slow
def test_the_cluster_guides_slurm_examples_are_ones_the_tool_approves():
    """Each `DRY_RUN=1` example of the cluster guide (docs/cluster.md): the first cell of each of its table's rows, with
    the example's ARGS, gets no GPU advice (the guide used to show gpus_per_node=4 on LRA, which the tool warns
    against)."""
    import re

    from condattn.experiment import load
    from condattn.reproduce import cells

    guide = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()
    examples = re.findall(r"make reproduce-table-(\d) SCALE=paper LAUNCHER=slurm DRY_RUN=1 \\\n\s+ARGS=\"([^\"]*)\"",
                          guide)
    assert len(examples) >= 2
    for table, args in examples:
        exp = load(next((Path(__file__).resolve().parents[1] / "experiments").glob(f"table{table}_*.yaml")))
        for name, overrides in cells(exp, "paper", [0], args.split(), "slurm"):
            if "_none_paper_" in name:  # the baseline cell of each row
                assert launch.gpu_warning(compose(overrides)) is None, (table, name)


def test_node_memory_scales_with_processes_and_workers():
    def mem(*ov):
        return launch.slurm_parameters(compose(["launcher=slurm", *ov]).launcher, "j")["mem"]

    assert mem() == "60GB"  # 1 process: 32 GB + 7 workers × 4 GB
    assert mem("launcher.gpus_per_node=4") == "240GB"
    assert mem("launcher.gpus_per_node=4", "launcher.cpus_per_task=2") == "144GB"
    assert mem("launcher.gpus_per_node=4", "launcher.mem_gb=128") == "128GB"  # as given


@pytest.mark.slow
def test_without_srun_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    exp = str(listops_only(tmp_path))
    assert main([exp, "--seeds", "0", "--launcher", "slurm", *tiny(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["[reproduce] refused before starting any job: launcher=slurm needs SLURM (no `srun` on this "
                   "machine's PATH): submit from a cluster's login node, add --dry-run (DRY_RUN=1) to print the jobs, "
                   "or use launcher=local"]


def test_cpus_per_task_advice_is_capped_at_a_node(monkeypatch):
    from condattn.engine.cost import loader_warning

    ov = ["task=imagenet_vit", "scale=medium", "launcher=slurm", "impl.worker_samples_per_s.images=5"]
    w = loader_warning(compose([*ov, "launcher.cpus_per_task=8"]), 1e9)
    assert "set launcher.cpus_per_task=64 (all of a 64-core node's cores per process" in w and "it needs" in w
    w = loader_warning(compose([*ov, "launcher.cpus_per_task=8", "launcher.gpus_per_node=4"]), 1e9)
    assert "set launcher.cpus_per_task=16 (all of a 64-core node" in w
    w = loader_warning(compose([*ov, "launcher.cpus_per_task=64"]), 1e9)
    assert "a node's cores are all in use" in w


@pytest.mark.slow
def test_status_lists_each_cell_from_records_squeue_and_sacct(tmp_path, capsys, monkeypatch):
    exp = str(listops_only(tmp_path))
    runs = tmp_path / "runs" / "smoke"
    cells = {m: runs / f"table4_lra_listops_{m}_smoke_s0" for m in ("none", "spectral", "embedded")}
    write_json_atomic(cells["none"] / "summary.json", {"status": "finished", "metrics": {"test_acc": 0.5},
                                                       "steps": 4, "wall_time_s": 1.0, "run_dir": str(cells["none"])})
    for m, job in (("spectral", "77_1"), ("embedded", "77_2")):
        write_json_atomic(cells[m] / "submission.json", {"launcher": "slurm", "job_id": job})
    cells1 = {m: runs / f"table4_lra_listops_{m}_smoke_s1" for m in ("none", "spectral")}
    write_json_atomic(cells1["none"] / "submission.json", {"launcher": "slurm", "job_id": "77_3"})
    write_json_atomic(cells1["spectral"] / "summary.json", {"status": "failed", "error": "TrainingDiverged: loss nan",
                                                            "run_dir": str(cells1["spectral"])})
    monkeypatch.setattr(launch, "squeue_states",
                        lambda job: {"77_1": {"RUNNING"}, "77_2": {"PENDING"}}.get(job, set()))
    monkeypatch.setattr(launch, "sacct_state", lambda job: {"77_3": "TIMEOUT"}.get(job))
    assert main([exp, "--seeds", "0,1", "--status", *tiny(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  table4")}
    assert lines["table4_lra_listops_none_smoke_s0"].split()[1] == "finished"
    assert "running  (job 77_1)" in lines["table4_lra_listops_spectral_smoke_s0"]
    assert "queued  (job 77_2 (PENDING))" in lines["table4_lra_listops_embedded_smoke_s0"]
    assert "failed  (job 77_3: TIMEOUT)" in lines["table4_lra_listops_none_smoke_s1"]
    assert "failed  (TrainingDiverged: loss nan)" in lines["table4_lra_listops_spectral_smoke_s1"]
    assert "not started" in lines["table4_lra_listops_embedded_smoke_s1"]
    assert "[reproduce] 1 finished, 1 running, 1 queued, 2 failed, 1 not started" in out
    assert not (runs / "table4_lra_listops_embedded_smoke_s1").exists()  # --status trains nothing


def test_run_local_leaves_a_cell_another_process_trains_for_last(tmp_path, monkeypatch):
    """Two `reproduce` of one table share its cells: a cell whose lock another process holds moves behind the free
    ones (never ahead of a cell that needs it); once only held cells are left, the next one is trained (waits)."""
    from types import SimpleNamespace as NS

    import condattn.engine.trainer as trainer
    from condattn.launch import run_local
    from condattn.runs import RunLock

    cells = [NS(name=n, run_dir=tmp_path / "small" / n, cfg=NS(resume="auto"), checked=None) for n in "abcd"]
    held = [RunLock(tmp_path / "small" / n) for n in "ac"]
    assert all(h.try_acquire() for h in held)  # "another process" trains a and c now
    order: list[str] = []

    def train(cfg, checked):
        order.append(next(c.name for c in cells if c.cfg is cfg))
        if order[-1] in "ac":
            held["ac".index(order[-1])].release()  # (the real train waits for the holder here)
        return {"metrics": {"acc": 1.0}}

    monkeypatch.setattr(trainer, "train", train)
    said: list[str] = []
    out = run_local(cells, "acc", needs=lambda name: "c" if name == "d" else None, say=lambda m, **k: said.append(m))
    # a is held: it goes behind b; c is held but d needs it, so c is not moved; a comes back after d
    assert order == ["b", "c", "d", "a"] and out.ran == 4 and not out.failed
    assert sum("another process trains it now" in m for m in said) == 1
