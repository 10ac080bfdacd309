"""The run's summary.json: what a finished run reports (metrics, steps, budget, throughput, provenance, data,
patch, diagnostics, config) or why it failed, and how a run directory's status is read back. The one place of the
engine that writes or reads summary.json."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..runs import RunRecord
from . import provenance
from .optim import scaled_lr


def write_summary(run: Any, summary: dict) -> None:
    RunRecord(run.run_dir).write_summary(summary)


def write_failure(run: Any, error: str, step: int, last_good: Path | None) -> None:
    RunRecord(run.run_dir).write_failure(error, step, last_good, run.cfg.run.name, run.config)


def launch_info(cfg: Any) -> dict[str, Any]:
    """Where this session ran: launcher, SLURM job / array ids, node count, requeue count."""
    env = os.environ
    info: dict[str, Any] = {"launcher": str((cfg.get("launcher") or {}).get("name", "local"))}
    for key, var in (("slurm_job_id", "SLURM_JOB_ID"), ("slurm_array_job_id", "SLURM_ARRAY_JOB_ID"),
                     ("slurm_array_task_id", "SLURM_ARRAY_TASK_ID"), ("slurm_restart_count", "SLURM_RESTART_COUNT"),
                     ("slurm_nodelist", "SLURM_JOB_NODELIST"), ("submitit_job_id", "SUBMITIT_LOCAL_JOB_ID")):
        if env.get(var):
            info[key] = env[var]
    info["num_nodes"] = int(env.get("SLURM_JOB_NUM_NODES") or env.get("CONDATTN_NUM_NODES") or 1)
    return info


def _throughput(run: Any, ramp: bool) -> dict[str, Any]:
    state, info = run.state, run.data.info
    samples = state.samples if ramp else run.glob * state.step  # (a checkpoint from before `samples` existed)
    per_s = samples / max(state.train_time, 1e-9)
    return {
        "wall_time_s": round(state.wall_time, 2),
        "train_time_s": round(state.train_time, 2),
        "train_samples_per_s": round(per_s, 2),
        **({"train_tokens_per_s": round(samples * int(info["seq_len"]) / max(state.train_time, 1e-9), 1)}
           if info.get("seq_len") else {}),
        "train_samples": samples,
    }


def build_summary(run: Any, metrics: dict, budget: dict, diagnostics: dict) -> dict:
    """The finished run's summary (the keys and their order as every earlier summary.json)."""
    cfg, state = run.cfg, run.state
    hw = provenance.hardware(run.accelerator.device, run.world, launch_info(cfg)["num_nodes"])
    return {
        "status": "finished",
        "run_name": cfg.run.name,
        "run_dir": str(run.run_dir),
        "table": cfg.run.table,
        "row": cfg.run.row,
        "method": run.report.method,
        "scale": cfg.scale.name,
        "seed": int(cfg.seed),
        "metrics": metrics,
        "steps": state.step,
        "budget": budget,
        "global_batch": run.glob,
        "micro_batch": run.micro,
        "grad_accum": run.accum,
        "lr": scaled_lr(cfg, run.glob),
        **_throughput(run, bool(run.budget.ramp)),
        "execution": run.execution.to_dict() if run.execution is not None else None,
        **({"performance": run.performance} if run.performance else {}),
        "hardware": hw,
        "hardware_line": provenance.describe(hw),
        "launch": {**launch_info(cfg), "resumed_at_steps": list(state.resumes)},
        "versions": provenance.versions(),
        **provenance.run_provenance(run.report.method),  # commit, and the fingerprint of the code this run executed
        "data": {"checksum": run.data.checksum, **run.data.info},
        "patch": run.report.to_dict(),
        "diagnostics": diagnostics,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": run.config,
    }
