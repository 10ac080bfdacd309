"""The one trainer: every task and table goes through `train(cfg)`.

Build (engine/setup.py: model from the zoo, conditioning patch asserted against the config, data, task) ->
accelerate -> the step loop (engine/loop.py: optimizer steps with gradient accumulation, clipping, schedule) and its
parts (engine/parts: periodic eval and the best model, checkpoints, diagnostics, budget, stop signals, divergence,
progress) -> the test protocol -> summary.json (engine/summary.py). Preemption (SIGTERM / SIGUSR1 / SIGUSR2 / first
Ctrl-C) saves a checkpoint at the next step boundary; `resume=auto` continues from it with the same data order and
RNG state.

Distributed (one process per device, started by `accelerate launch`, torchrun or a submitit job): the run
directory comes from the config, so every rank agrees on it; rank 0 alone writes files (accelerate's
checkpoint also stores each rank's RNG state); the stop request and the loss are reduced over ranks at
every step, so all ranks checkpoint, stop or fail at the same step.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ..runs import RunLock, summary_is_finished
from ..utils.ranks import launcher_rank
from . import preflight, provenance
from .artefacts import repair
from .errors import TrainingDiverged, TrainingInterrupted
from .identity import config_mismatch
from .loop import StepLoop
from .preflight import Checked, PreflightError, Problem
from .runcost import CpuLedger, cpu
from .setup import build_run, process_settings
from .state import TrainState

__all__ = ["TrainState", "TrainingDiverged", "TrainingInterrupted", "train"]

_FIRST = [True]  # the first run of a process is charged its imports and config (its CPU from the process's start)


def train(cfg: Any, checked: Checked | None = None) -> dict:
    """Train the run `cfg` names. Its config is checked first (PreflightError: nothing written), unless the caller
    passes its own check of it (`checked`: the preflight of the train CLI or of reproduce); then the run
    directory's lock is taken (a second process on the same run waits for the first, then finds it finished); a
    directory that records another science config is refused (engine/identity.py), a finished one is returned."""
    ledger = CpuLedger(0.0 if _FIRST[0] else cpu())  # the CPU time by cause (engine/runcost.py)
    _FIRST[0] = False
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # one line per checkpoint file otherwise
    run_dir = Path(cfg.run.dir)
    checked = (checked or preflight.check_config(cfg)).raise_problems()
    lock = RunLock(run_dir) if launcher_rank() == 0 else None  # the other ranks follow rank 0 through accelerate
    if lock is not None:
        lock.acquire()
    try:
        if cfg.resume == "auto":
            if why := config_mismatch(cfg, run_dir):
                raise PreflightError([Problem("run", why)])
            if lock is not None:  # a corrupt summary.json, best_model.pt or tokenizer copy: set aside, named, repaired
                repair(run_dir)
            if done := summary_is_finished(run_dir):
                print(f"[condattn] {run_dir} already finished; nothing to do (resume=never reruns it)")
                return done
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        deterministic = process_settings(cfg)
        try:
            loop = StepLoop(build_run(cfg, run_dir, deterministic, checked, ledger))
            provenance.at_start()  # the commit and code fingerprint the summary records: what this process loaded
            return loop.train()
        finally:  # a process that trains several cells (reproduce, tests) gets its global setting back
            torch.use_deterministic_algorithms(was_deterministic)
    finally:
        if lock is not None:
            lock.release()
