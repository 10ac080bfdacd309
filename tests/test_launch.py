"""Launchers: the SLURM submission a table generates (mocked executor, no sbatch here), its dry run, the
submitit job protocol (distributed environment, checkpoint/requeue hook), launcher validation."""

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
    assert ex.updates == [EXPECTED_PARAMETERS]
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


def test_dry_run_prints_the_exact_sbatch_script_and_submits_nothing(tmp_path, fake_executor, capsys):
    exp = str(listops_only(tmp_path))
    args = [exp, "--scale", "paper", "--dry-run", *SLURM, f"paths.runs={tmp_path / 'runs'}",
            f"paths.data_root={tmp_path / 'nodata'}"]
    assert main(args) == 0  # missing data is a warning in a dry run (it may exist only on the cluster)
    out = capsys.readouterr().out
    assert "warnings (a real submission would refuse these):" in out and "paper-scale data missing" in out
    assert "9 cells to submit as one SLURM job array (launcher=slurm, dry run: nothing is submitted)" in out
    folder = (tmp_path / "runs" / "paper" / ".submitit" / "table4_lra").absolute()
    script = out[out.index("    #!/bin/bash"):]
    for line in ("#SBATCH --account=proj", "#SBATCH --array=0-8%2", "#SBATCH --cpus-per-task=10",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --job-name=condattn_table4_lra_paper", "#SBATCH --mem=128GB",
                 "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --qos=high",
                 "#SBATCH --signal=USR2@300", "#SBATCH --time=600", "module load cuda/12.4",
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
    assert problems("launcher.gpus_per_node=-1") == ["launcher.gpus_per_node=-1 must be an integer ≥ 0"]
    assert problems("launcher.gpus_per_node=4", "launcher.tasks_per_node=1") == [
        "launcher.tasks_per_node=1 but gpus_per_node=4: one process per GPU is required (leave it null)"]
    assert problems("launcher.timeout_min=1", "launcher.signal_delay_s=90") == [
        "launcher.signal_delay_s=90 is not shorter than the time limit launcher.timeout_min=1 min"]
    assert [str(p) for p in launch.launcher_problems(compose(["launcher=submitit_local", "launcher.nodes=2"]))] == [
        "launcher=submitit_local runs on this machine: launcher.nodes must be 1"]
    # an sbatch option submitit does not know is refused by its own parameter check
    with pytest.raises(ValueError, match=r"Unavailable parameter\(s\): \['gpus'\]"):
        launch.make_executor(compose(["launcher=slurm"]).launcher, "t", "j", dry_run=True).update_parameters(gpus=3)
