"""Launching the cells of a table: in this process, as a SLURM job array, or as local submitit jobs.

Design (see docs/cluster.md): submitit is used directly, not through Hydra's launcher plugin. `reproduce`
already expands a table into cells, validates all of them and skips finished ones; a plain executor then
submits exactly the unfinished cells as one job array, returns at once (the plugin blocks for sweep
results), and can print the exact sbatch script without submitting (a dry run needs no `sbatch`).

Each array task runs `TrainJob(overrides)`: one process per GPU (`tasks_per_node = gpus_per_node`, over
`nodes` nodes). Every task turns submitit's job environment into torch.distributed's variables (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and calls `train(compose(overrides))`, whose Accelerator
picks them up (NCCL on GPUs, gloo on CPUs). The run directory comes from the overrides, so all ranks and
every requeue of a cell share it. On preemption or near the time limit SLURM sends USR2 (submitit's
signal, `signal_delay_s` before the end) to every task; the trainer checkpoints at the next step boundary
on all ranks, then rank 0 hands over to submitit, which calls `TrainJob.checkpoint` (the same cell again)
and requeues the job; the requeued job resumes from the checkpoint (`resume=auto`).
"""

from __future__ import annotations

import copy
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import submitit
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, compose_cell, explain_override_error  # noqa: F401 (this module's names before)
from .engine.preflight import Problem, batch_split, planned_world
from .runs import RunRecord

SUBMITIT_LAUNCHERS = ("slurm", "submitit_local")
LAUNCHERS = ("local", *SUBMITIT_LAUNCHERS)
ACTIVE_SLURM_STATES = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING",
                       "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}


@dataclass(frozen=True)
class RunSpec:
    """One cell of a table as a run to launch: its run name, its overrides, and (once composed) its config. Frozen:
    `renamed` and `checked_by` return new specs."""

    name: str
    overrides: tuple[str, ...]
    cfg: DictConfig | None = None
    checked: Any = None  # the preflight's Checked (engine/preflight.py), handed to `train` so it checks nothing again

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run.dir)

    def renamed(self, name: str) -> RunSpec:
        """The same cell under the run name `name`: its run.name override and a copy of its config follow."""
        cfg = copy.deepcopy(self.cfg)
        if cfg is not None:
            cfg.run.name = name
        return replace(self, name=name, cfg=cfg,
                       overrides=tuple(f"run.name={name}" if o.startswith("run.name=") else o for o in self.overrides))

    def checked_by(self, checked: Any) -> RunSpec:
        """The same cell with the preflight's result (`train` then checks nothing again)."""
        return replace(self, checked=checked)


# --------------------------------------------------------------------------------------------- launcher config


def tasks_per_node(lc: Any) -> int:
    if lc.get("tasks_per_node"):
        return int(lc.tasks_per_node)
    return max(int(lc.get("gpus_per_node") or 0), 1)


def launcher_problems(cfg: DictConfig) -> list[Problem]:
    lc = cfg.launcher
    out = []
    if lc.name not in LAUNCHERS:
        return [Problem("launcher", f"unknown launcher {lc.name!r}; choose one of {', '.join(LAUNCHERS)}")]
    if lc.name == "local":
        return out
    for key in ("timeout_min", "signal_delay_s"):
        v = lc.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            out.append(Problem("launcher", f"launcher.{key}={v!r} must be a positive number"))
    for key in ("nodes", "tasks_per_node"):
        v = lc.get(key)
        if (v is not None or key == "nodes") and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            out.append(Problem("launcher", f"launcher.{key}={v!r} must be an integer ≥ 1"
                                           + (" (or null: one process per GPU)" if key == "tasks_per_node" else "")))
    gpus = lc.get("gpus_per_node")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        out.append(Problem("launcher", f"launcher.gpus_per_node={gpus!r} must be an integer ≥ 1 (GPUs per node)"))
    elif gpus == 0 and lc.name == "slurm" and lc.get("tasks_per_node") is None:
        out.append(Problem("launcher", "launcher.gpus_per_node=0 gives the job no GPU: set gpus_per_node ≥ 1, or "
                                       "launcher.tasks_per_node=1 too for a CPU-only job"))
    if lc.get("tasks_per_node") is not None and lc.gpus_per_node and lc.tasks_per_node != lc.gpus_per_node:
        out.append(Problem("launcher", f"launcher.tasks_per_node={lc.tasks_per_node} but gpus_per_node="
                                       f"{lc.gpus_per_node}: one process per GPU is required (leave it null)"))
    if lc.name == "submitit_local" and int(lc.get("nodes", 1)) != 1:
        out.append(Problem("launcher", "launcher=submitit_local runs on this machine: launcher.nodes must be 1"))
    if not out and lc.signal_delay_s >= 60 * lc.timeout_min:
        out.append(Problem("launcher", f"launcher.signal_delay_s={lc.signal_delay_s} is not shorter than the time "
                                       f"limit launcher.timeout_min={lc.timeout_min} min"))
    return out


def slurm_parameters(lc: Any, job_name: str) -> dict[str, Any]:
    """The `SlurmExecutor.update_parameters` keywords for a launcher config (sbatch option names)."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "partition": lc.partition,
        "account": lc.account,
        "qos": lc.qos,
        "nodes": int(lc.nodes),
        "ntasks_per_node": tasks_per_node(lc),
        "gpus_per_node": int(lc.gpus_per_node) or None,
        "cpus_per_task": lc.cpus_per_task,
        "mem": f"{node_mem_gb(lc)}GB",
        "time": int(lc.timeout_min),
        "signal_delay_s": int(lc.signal_delay_s),
        "array_parallelism": int(lc.array_parallelism),
        "constraint": lc.constraint,
        "exclude": lc.exclude,
        "comment": lc.comment,
        "setup": list(lc.setup) or None,
        "srun_args": list(lc.srun_args) or None,
        "additional_parameters": OmegaConf.to_container(lc.additional_parameters) or None,
    }
    return {k: v for k, v in params.items() if v is not None}


def node_mem_gb(lc: Any) -> int:
    """A node's `--mem`: launcher.mem_gb when set, else what its processes and their data workers need:
    processes per node × (launcher.mem_per_process_gb + (launcher.cpus_per_task - 1) × launcher.mem_per_worker_gb)."""
    if lc.get("mem_gb"):
        return int(lc.mem_gb)
    workers = max(int(lc.get("cpus_per_task") or 1) - 1, 0)
    per_process = float(lc.get("mem_per_process_gb") or 32) + workers * float(lc.get("mem_per_worker_gb") or 4)
    return int(math.ceil(tasks_per_node(lc) * per_process))


def local_parameters(lc: Any) -> dict[str, Any]:
    params = {"tasks_per_node": tasks_per_node(lc), "gpus_per_node": int(lc.gpus_per_node),
              "timeout_min": float(lc.timeout_min), "signal_delay_s": int(lc.signal_delay_s)}
    if lc.get("setup"):
        params["setup"] = list(lc.setup)
    return params


class SlurmExecutor(submitit.SlurmExecutor):
    """submitit's SLURM executor (the name tests patch); without `srun` one line says so, not submitit's traceback."""

    def __init__(self, *args: Any, **kw: Any):
        if not shutil.which("srun"):
            raise ConfigError("launcher=slurm needs SLURM (no `srun` on this machine's PATH): submit from a "
                              "cluster's login node, add --dry-run (DRY_RUN=1) to print the jobs, or use "
                              "launcher=local")
        super().__init__(*args, **kw)


class _DryRunSlurmExecutor(submitit.SlurmExecutor):
    """Builds and validates parameters like the real one but needs no `srun` on this machine."""

    @classmethod
    def affinity(cls) -> int:
        return 1


def job_folder(lc: Any, table: str) -> Path:
    return Path(str(lc.folder)).expanduser().absolute() / table / "%j"


def make_executor(lc: Any, table: str, job_name: str, dry_run: bool = False):
    python = lc.get("python") or None
    if lc.name == "slurm":
        cls = _DryRunSlurmExecutor if dry_run else SlurmExecutor
        ex = cls(folder=job_folder(lc, table), max_num_timeout=int(lc.max_num_timeout), python=python)
        ex.update_parameters(**slurm_parameters(lc, job_name))
        return ex
    ex = submitit.LocalExecutor(folder=job_folder(lc, table), max_num_timeout=int(lc.max_num_timeout), python=python)
    ex.update_parameters(**local_parameters(lc))
    return ex


def sbatch_script(executor: submitit.SlurmExecutor, n_jobs: int) -> str:
    """The exact script submitit hands to sbatch for an array of n_jobs (a single job when n_jobs == 1)."""
    params = dict(executor.parameters)
    if n_jobs > 1:
        params["map_count"] = n_jobs
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **params)


# --------------------------------------------------------------------------------------------- inside a job


def distributed_env(env: Any, master_port: int | None = None) -> dict[str, str]:
    """torch.distributed variables for this task from a submitit JobEnvironment (empty for 1 task)."""
    out = {"CONDATTN_NUM_NODES": str(env.num_nodes)}
    n = int(env.num_tasks)
    if n <= 1:
        return out
    digits = re.sub(r"\D", "", str(env.raw_job_id)) or "0"
    port = int(master_port) if master_port else 20000 + int(digits) % 20000
    addr = "127.0.0.1" if int(env.num_nodes) == 1 else env.hostnames[0]
    out.update(
        RANK=str(env.global_rank), LOCAL_RANK=str(env.local_rank), WORLD_SIZE=str(n),
        LOCAL_WORLD_SIZE=str(n // max(int(env.num_nodes), 1)), NODE_RANK=str(env.node), GROUP_RANK=str(env.node),
        MASTER_ADDR=addr, MASTER_PORT=str(port),
    )
    return out


class TrainJob(submitit.helpers.Checkpointable):
    """One cell as a submitit job. `__call__` trains it (resuming from the run dir's last checkpoint);
    `checkpoint` is submitit's requeue hook: the trainer has already written the checkpoint, so the
    requeued job is simply the same cell again."""

    def __init__(self, cwd: str, master_port: int | None = None):
        self.cwd = cwd
        self.master_port = master_port

    def __call__(self, overrides: list[str]) -> dict:
        os.chdir(self.cwd)  # relative paths in the config mean what they meant at submission
        env = submitit.JobEnvironment()
        os.environ.update(distributed_env(env, self.master_port))
        from .engine.trainer import TrainingInterrupted, train

        cfg = compose_cell(list(overrides))
        try:
            s = train(cfg)
        except TrainingInterrupted as e:
            preempt = env._usr_sig()
            if e.signum == preempt:
                # preemption / time limit: the checkpoint is written on every rank; give submitit its signal
                # back (our handler was active during training): rank 0 calls self.checkpoint, requeues and
                # exits; the other ranks end here and are restarted with the job
                handler = signal.getsignal(preempt)
                if callable(handler):
                    handler(preempt, None)
                if env.global_rank != 0:
                    sys.exit(0)
            raise  # SIGTERM / Ctrl-C (scancel, a user): stop with the checkpoint kept; rerunning resumes
        return {"run_name": s["run_name"], "run_dir": s["run_dir"], "status": s["status"], "steps": s["steps"],
                "metrics": s["metrics"]}

    def checkpoint(self, overrides: list[str]) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(TrainJob(self.cwd, self.master_port), overrides)


# --------------------------------------------------------------------------------------------- submission


def active_job(run_dir: Path) -> str | None:
    """'<job id> (<state>)' when this cell's recorded SLURM job is still queued or running, else None."""
    rec = RunRecord(run_dir).submission()
    if rec is None or rec.get("launcher") != "slurm" or not rec.get("job_id"):
        return None
    states = squeue_states(str(rec["job_id"])) & ACTIVE_SLURM_STATES
    return f"{rec['job_id']} ({', '.join(sorted(states))})" if states else None


def squeue_states(job_id: str) -> set[str]:
    """SLURM states of a job (empty when it has left the queue, or without squeue)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {s.strip() for s in out.stdout.split()} if out.returncode == 0 else set()


def cell_time_min(cfg: Any) -> int:
    """A cell's SLURM `--time`: its cost estimate's wall time, evaluation included (engine/cost.py: a step time measured
    by `make bench` on launcher.gpu_type where there is one, else the assumed MFU and launcher.min_step_ms) ×
    launcher.time_margin + 15 min, at least 30 min, at most launcher.timeout_min (a longer cell checkpoints at the limit
    and requeues itself); the cap when there is no estimate."""
    lc = cfg.launcher
    cap = int(lc.timeout_min)
    c = _cost(cfg)
    if c is None or c.gpu_hours is None:
        return cap
    wall_min = c.gpu_hours / max(c.gpus, 1) * 60
    return int(min(cap, max(30, math.ceil(wall_min * float(lc.get("time_margin") or 1.5) + 15))))


def _cost(cfg: Any) -> Any:
    from .engine.cost import cell_cost

    try:
        return cell_cost(str(cfg.run.name), cfg)
    except Exception:  # noqa: BLE001 - no estimate (a model the FLOP counter cannot trace)
        return None


def time_source(cfg: Any) -> str:
    """Where a cell's --time comes from, in words: a measured step time, or the assumed constants (a fallback)."""
    c = _cost(cfg)
    if c is None or c.gpu_hours is None:
        return "no estimate: the cap"
    if c.measured:
        return c.measured
    parts = c.note.split("; ")
    bound = next((x.split(" (assumed")[0] for x in parts if "-bound" in x), None)
    what = bound or f"{float(cfg.launcher.get('assumed_mfu') or 0.4):.0%} MFU (launcher.assumed_mfu)"
    return (f"assumed, a fallback (no `make bench` result for {cfg.model.get('name')} on "
            f"{cfg.launcher.get('gpu_type')} in launcher.bench_dir): {what}")


def gpu_warning(cfg: Any) -> str | None:
    """A line when the plan's own estimates say several GPUs per cell barely shorten it: the cell's wall time on its
    GPUs against one GPU (engine/cost.py, the same estimate the total and --time use) gives less than half the ideal
    speed-up, so the extra GPUs mostly add GPU-hours (a cell set by per-step overheads). A cell whose loader or FLOPs
    scale with its processes gets no warning."""
    if cfg.launcher.name == "local" or (gpus := planned_world(cfg)) <= 1:
        return None
    one = OmegaConf.merge(cfg, {"launcher": {"nodes": 1, "gpus_per_node": 1, "tasks_per_node": None}})
    many, single = _cost(cfg), _cost(one)
    if many is None or single is None or many.wall_hours is None or single.wall_hours is None:
        return None
    speedup = single.wall_hours / many.wall_hours
    if speedup >= gpus / 2:
        return None
    parts = many.note.split("; ")
    why = next((x for x in parts if "-bound" in x), parts[-1])
    return (f"{gpus} GPUs per cell: the estimate gives {_duration(many.wall_hours)} a cell ({many.gpu_hours:,.2f} "
            f"GPU-hours) against {_duration(single.wall_hours)} on one GPU ({single.gpu_hours:,.2f} GPU-hours): "
            f"{speedup:.1f}× faster for {many.gpu_hours / single.gpu_hours:.1f}× the GPU-hours ({why}); set "
            "launcher.gpus_per_node=1 (launcher.nodes=1)")


def _duration(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:,.1f} h"


FAILED_SLURM_STATES = {"FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
                       "DEADLINE"}


def sacct_state(job_id: str) -> str | None:
    """The job's final SLURM state from sacct ('FAILED', 'CANCELLED by 123', ...); None without sacct or a record."""
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []
    return lines[-1] if lines else None


def cell_state(run_dir: Path) -> tuple[str, str]:
    """(queued | running | failed | finished | unfinished | not started, detail) of one cell: its run record, and
    for a SLURM submission squeue (queued / running) and sacct (how an ended job ended)."""
    record = RunRecord(run_dir)
    status = record.status
    if status == "finished":
        return "finished", ""
    sub = record.submission() or {}
    if sub.get("launcher") == "slurm" and sub.get("job_id"):
        job = str(sub["job_id"])
        states = squeue_states(job) & ACTIVE_SLURM_STATES
        if states & {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}:
            return "running", f"job {job}"
        if states:
            return "queued", f"job {job} ({', '.join(sorted(states))})"
        ended = sacct_state(job)
        if ended and ended.split()[0] in FAILED_SLURM_STATES:
            return "failed", f"job {job}: {ended}"
    if status in ("failed", "corrupt"):
        error = ((record.read_summary() or {}).get("error") or status) if status == "failed" else "corrupt summary"
        return "failed", str(error).splitlines()[0][:120]
    return ("unfinished", "started, no final summary") if Path(run_dir).is_dir() else ("not started", "")


def status_lines(cells: list[RunSpec]) -> list[str]:
    """`reproduce --status`: one line per cell, then the count per state."""
    states = [(c, *cell_state(c.run_dir)) for c in cells]
    width = max((len(c.name) for c in cells), default=0)
    lines = [f"  {c.name:<{width}}  {state}{f'  ({detail})' if detail else ''}" for c, state, detail in states]
    counts: dict[str, int] = {}
    for _, state, _ in states:
        counts[state] = counts.get(state, 0) + 1
    order = ("finished", "running", "queued", "failed", "unfinished", "not started")
    return lines + ["[reproduce] " + ", ".join(f"{counts[k]} {k}" for k in order if k in counts)]


def train_command(overrides: list[str]) -> str:
    return "python -m condattn.train " + " ".join(shlex.quote(o) for o in overrides)


def describe_plan(cells: list[RunSpec], lc: Any, executor: Any, say: Callable[[str], None]) -> None:
    world = planned_world(cells[0].cfg)
    splits = {c.name: batch_split(c.cfg, world) for c in cells}
    nodes, tpn = int(lc.get("nodes", 1)), tasks_per_node(lc)
    dev = f"{lc.gpus_per_node} GPU{'s' if lc.gpus_per_node != 1 else ''} per node" if lc.gpus_per_node else "no GPU"
    line = (f"  each job: {nodes} node{'s' if nodes > 1 else ''} × {tpn} process{'es' if tpn > 1 else ''} per node "
            f"({dev}) = {world} process{'es' if world > 1 else ''}")
    if len(set(splits.values())) == 1:
        glob, micro, accum = next(iter(splits.values()))
        line += (f"; global batch {glob} = {micro} per process × {world} × {accum} accumulation "
                 f"step{'s' if accum > 1 else ''}")
    say(line)
    say(f"  submitit: {type(executor).__name__.lstrip('_').replace('DryRun', '')}(folder={executor.folder}, "
        f"max_num_timeout={executor.max_num_timeout}, python={executor.python})")
    say(f"  parameters: {executor.parameters}")
    say("  jobs (array index, run dir, equivalent command):")
    for i, c in enumerate(cells):
        glob, micro, accum = splits[c.name]
        batch = f"  (global batch {glob} = {micro} × {world} × {accum})" if len(set(splits.values())) > 1 else ""
        say(f"    [{i}] {c.run_dir}{batch}")
        say(f"        {train_command(c.overrides)}")


def submit(cells: list[RunSpec], lc: Any, table: str, scale: str, *, dry_run: bool, stop: Any,
           say: Callable[[str], None] = print) -> list[str]:
    """Submit the cells (all validated, none finished) with a submitit launcher. Returns the names of cells
    whose job failed (when waiting)."""
    job_name = f"condattn_{table}_{scale}"
    executor = make_executor(lc, table, job_name, dry_run=dry_run)
    job = TrainJob(os.getcwd(), lc.get("master_port"))
    # SLURM: one job array per --time (each cell's from its cost estimate, engine/cost.py), so a 0.1 GPU-hour cell
    # does not reserve the cap; a cell longer than the cap checkpoints at the limit and requeues itself
    groups: dict[int | None, list[RunSpec]] = {}
    for c in cells:
        groups.setdefault(cell_time_min(c.cfg) if lc.name == "slurm" else None, []).append(c)
    warned: dict[str, list[str]] = {}
    for c in cells:
        if w := gpu_warning(c.cfg):
            warned.setdefault(w, []).append(c.name)
    for w, names in warned.items():
        say(f"[reproduce] warning: {len(names)} cell(s) ({names[0]}{', …' if len(names) > 1 else ''}): {w}")
    pairs: list[tuple[RunSpec, Any]] = []
    for minutes, group in sorted(groups.items(), key=lambda kv: kv[0] or 0):
        if minutes is not None:
            executor.update_parameters(time=minutes)
        kind = "one SLURM job array" if lc.name == "slurm" and len(group) > 1 else (
            "one SLURM job" if lc.name == "slurm" else "local submitit jobs, one after another")
        when = (f", --time={minutes} min: the estimate ({time_source(group[0].cfg)}; evaluation included) × "
                f"launcher.time_margin + 15 min, capped at launcher.timeout_min={lc.timeout_min}"
                if minutes is not None else "")
        say(f"[reproduce] {len(group)} cell{'s' if len(group) != 1 else ''} to submit as {kind} "
            f"(launcher={lc.name}{when}{', dry run: nothing is submitted' if dry_run else ''})")
        describe_plan(group, lc, executor, say)
        if lc.name == "slurm":
            script = sbatch_script(executor, len(group))
            say("  sbatch script (the exact text submitit passes to sbatch):")
            for line in script.splitlines():
                say("    " + line)
        if dry_run or lc.name != "slurm":
            continue
        jobs = executor.map_array(job, [c.overrides for c in group])
        for c, j in zip(group, jobs):
            RunRecord(c.run_dir).write_submission({
                "launcher": "slurm", "job_id": j.job_id, "folder": str(executor.folder), "overrides": c.overrides,
                "submitted_at": time.strftime("%Y-%m-%d %H:%M:%S"), "time_min": minutes,
            })
            say(f"[reproduce] submitted {c.name}: job {j.job_id}")
        pairs += list(zip(group, jobs))
    if dry_run:
        return []

    if lc.name == "slurm":
        jobs = [j for _, j in pairs]
        if not lc.get("wait"):
            say(f"[reproduce] {len(jobs)} jobs submitted; logs in {executor.folder.parent}. When they end, "
                f"`make report-table-N SCALE={scale}` writes the table (rerunning reproduce skips queued cells).")
            return []
        return _wait(pairs, stop, say)
    failed = []
    for i, c in enumerate(cells, 1):  # submitit_local: one cell at a time on this machine
        if stop.requested:
            failed += [x.name for x in cells[i - 1:]]
            break
        say(f"[reproduce] {i}/{len(cells)} {c.name}: local submitit job, {tasks_per_node(lc)} process(es)")
        j = executor.submit(job, c.overrides)
        failed += _wait([(c, j)], stop, say)
    return failed


def _wait(pairs: list[tuple[RunSpec, Any]], stop: Any, say: Callable[[str], None]) -> list[str]:
    forwarded = False
    while not all(j.done() for _, j in pairs):
        if stop.requested and not forwarded:  # pass the stop on: each job checkpoints and ends
            forwarded = True
            for _, j in pairs:
                if not j.done():
                    proc = getattr(j, "_process", None)
                    if proc is not None:
                        proc.send_signal(signal.SIGTERM)
                    else:
                        j.cancel(check=False)
        time.sleep(0.5)
    failed = []
    for c, j in pairs:
        exc = j.exception()
        if exc is not None:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            errs = [ln for ln in lines if re.search(r"(Error|Exception|Interrupted|Diverged)\b.*:", ln)]
            why = (errs or lines or [repr(exc)])[-1]
            say(f"[reproduce] {c.name}: job {j.job_id} failed: {why} (log: {j.paths.stderr})")
            failed.append(c.name)
    return failed


# --------------------------------------------------------------------------------------------- in this process


@dataclass
class LocalResult:
    failed: list[str] = field(default_factory=list)  # cells that failed or were interrupted
    not_started: list[str] = field(default_factory=list)
    interrupted: bool = False  # a stop request (Ctrl-C, SIGTERM) ended the table
    ran: int = 0


def run_local(cells: list[RunSpec], metric: str, *, force: bool = False,
              needs: Callable[[str], str | None] = lambda name: None, say: Callable[..., None] = print) -> LocalResult:
    """Train the cells here, one after another (launcher=local). A failed cell is reported and the next one runs; a
    cell whose pretraining run (`needs(name)`) failed here is skipped; a stop request checkpoints the running cell
    and ends the loop. `force`: start every cell over (resume=never). A cell that another process trains now (its
    RunLock) moves behind the free ones, unless a later cell needs it: two `reproduce` of one table then share its
    cells, each training different ones (when only held cells are left, the next one waits for its holder)."""
    from .engine.signals import StopFlag
    from .engine.trainer import TrainingDiverged, TrainingInterrupted, train
    from .runs import RunLock

    out = LocalResult()
    t_all = time.time()
    queue, i = list(cells), 0
    with StopFlag() as stop:
        while queue:
            c = queue.pop(0)
            if not force and RunLock(c.run_dir).held_elsewhere() and \
                    not any(needs(x.name) == c.name for x in queue) and \
                    any(not RunLock(x.run_dir).held_elsewhere() for x in queue):
                say(f"[reproduce] {c.name}: another process trains it now; moved to the end", flush=True)
                queue.append(c)
                continue
            i += 1
            if stop.requested:
                out.interrupted, out.not_started = True, [x.name for x in [c, *queue]]
                say(f"[reproduce] stop requested ({stop.name})")
                break
            if (first_stage := needs(c.name)) in out.failed:
                say(f"[reproduce] {i}/{len(cells)} {c.name}: skipped, its pretraining run {first_stage} failed "
                    "(reported as missing)", flush=True)
                out.failed.append(c.name)
                continue
            if force:
                c.cfg.resume = "never"
            say(f"[reproduce] {i}/{len(cells)} {c.name}", flush=True)
            out.ran += 1
            t0 = time.time()
            try:
                s = train(c.cfg, c.checked)
                key = metric if metric in s["metrics"] else next(iter(s["metrics"]))  # (a pretraining cell)
                say(f"[reproduce]   {key}={s['metrics'][key]:.4f} in {time.time() - t0:.0f} s", flush=True)
            except (TrainingInterrupted, KeyboardInterrupt) as e:
                why = str(e).split("; run the same command")[0] if str(e) else "KeyboardInterrupt"
                say(f"[reproduce] stopped at {c.name}: {why}", flush=True)
                out.interrupted = True
                out.failed.append(c.name)
                out.not_started = [x.name for x in queue]
                break
            except Exception as e:
                if not isinstance(e, TrainingDiverged):  # its message says it all
                    traceback.print_exc()
                say(f"[reproduce] {c.name} FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                    "(reported as missing in the table); continuing", flush=True)
                out.failed.append(c.name)
    say(f"[reproduce] {out.ran} of {len(cells)} cells run in {time.time() - t_all:.0f} s")
    return out
