"""The one trainer: every task and table goes through `train(cfg)`.

Build (model from the zoo, conditioning patch asserted against the config, data, task) -> accelerate ->
optimizer steps with gradient accumulation, clipping, schedule, periodic eval and checkpoints ->
summary.json. Preemption (SIGTERM / SIGUSR1 / SIGUSR2 / first Ctrl-C) saves a checkpoint at the next step
boundary; `resume=auto` continues from it with the same data order and RNG state.

Distributed (one process per device, started by `accelerate launch`, torchrun or a submitit job): the run
directory comes from the config, so every rank agrees on it; rank 0 alone writes files (accelerate's
checkpoint also stores each rank's RNG state); the stop request and the loss are reduced over ranks at
every step, so all ranks checkpoint, stop or fail at the same step.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device, set_seed
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..conditioning import apply_conditioning
from ..data.build import build_datasets
from ..data.sampler import EpochSampler
from ..models import build_model
from ..runs import summary_is_finished
from ..tasks import build_task
from ..utils.io import write_json_atomic
from . import provenance
from .budget import Budget
from .checkpoint import architecture_mismatch, latest_checkpoint, load_checkpoint, save_checkpoint
from .logging import RunLogger
from .optim import build_optimizer, scaled_lr
from .preflight import PreflightError, batch_split, preflight
from .signals import StopFlag


class TrainingInterrupted(Exception):
    """Raised after a preemption checkpoint was written; rerunning the same command resumes."""

    def __init__(self, message: str, signum: int | None = None, checkpoint: Path | None = None):
        super().__init__(message)
        self.signum = signum
        self.checkpoint = checkpoint


class TrainingDiverged(FloatingPointError):
    """The training loss became non-finite or exceeded `impl.max_loss`; names the step and the last good
    checkpoint."""


class TrainState:
    """Loop counters saved with every checkpoint (accelerate `register_for_checkpointing`)."""

    def __init__(self):
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.best_val = -math.inf
        self.best_step = -1
        self.train_time = 0.0  # seconds in training steps, summed over resumes (the wall-clock budget's clock)
        self.samples = 0  # training samples consumed (differs from steps × global batch under a batch ramp)
        self.budget_stopped = False  # the run ended because task.budget_hours was used up
        self.wall_time = 0.0
        self.resumes: list[int] = []  # the step of every resume (preemption, requeue, crash)

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, d: dict) -> None:
        vars(self).update(d)


def _launch_info(cfg: Any) -> dict[str, Any]:
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


def _loader(ds, batch_size: int, sampler=None, workers: int = 0, pin: bool = False, collate=None) -> DataLoader:
    # a private generator: building an iterator must not draw from the global RNG (dropout masks would
    # then differ between a resumed and an uninterrupted run)
    return DataLoader(
        ds, batch_size=batch_size, sampler=sampler, shuffle=False, num_workers=workers, pin_memory=pin,
        drop_last=sampler is not None, generator=torch.Generator().manual_seed(0), collate_fn=collate,
    )


def _first(ds, n: int, collate=None) -> Any:
    items = [ds[i] for i in range(min(n, len(ds)))]
    if collate is not None:
        return collate(items)
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def train(cfg: Any) -> dict:
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # one line per checkpoint file otherwise
    run_dir = Path(cfg.run.dir)
    if cfg.resume == "auto" and (done := summary_is_finished(run_dir)):
        print(f"[condattn] {run_dir} already finished; nothing to do (resume=never reruns it)")
        return done
    deterministic = bool(cfg.impl.deterministic)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if deterministic:  # cuBLAS needs this before its first call to be deterministic (no effect on CPU)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        return _train(cfg, run_dir, deterministic)
    finally:  # a process that trains several cells (reproduce, tests) gets its global setting back
        torch.use_deterministic_algorithms(was_deterministic)


def _train(cfg: Any, run_dir: Path, deterministic: bool) -> dict:
    if cfg.impl.threads:
        torch.set_num_threads(int(cfg.impl.threads))
    torch.set_flush_denormal(bool(cfg.impl.get("flush_denormal", True)))

    # step_scheduler_with_optimizer=False: our schedule counts optimizer steps of the global batch; accelerate's
    # default steps a prepared scheduler num_processes times per step (it assumes per-process batches), which
    # ran the warmup and decay twice as fast with 2 processes
    accelerator = Accelerator(mixed_precision=str(cfg.impl.precision), cpu=not torch.cuda.is_available(),
                              step_scheduler_with_optimizer=False)
    world, rank, main = accelerator.num_processes, accelerator.process_index, accelerator.is_main_process
    problems = preflight(cfg, world, check_data=False, check_run_dir=False)  # the data loader names missing files
    if problems:
        raise PreflightError(problems)
    glob, micro, accum = batch_split(cfg, world)
    if cfg.resume == "never" and main and run_dir.exists():
        shutil.rmtree(run_dir)
    accelerator.wait_for_everyone()
    set_seed(int(cfg.seed), deterministic=deterministic)
    if deterministic:
        torch.backends.cudnn.benchmark = False

    with accelerator.main_process_first():  # rank 0 generates/caches the data files, the others then read them
        data = build_datasets(cfg)
    model = build_model(cfg.model)
    cond = OmegaConf.to_container(cfg.conditioning, resolve=True)
    report = apply_conditioning(model, cond.pop("method"), **cond)
    report.check(attention_layers=cfg.model.get("attention_layers"))
    task = build_task(cfg)
    # the task's selection metric and its direction (classification: acc, higher is better; lm: loss, lower is
    # better). state.best_val holds sign × value, so "larger is better" and the checkpoints' -inf start stay valid.
    sel_key = str(getattr(task, "metric", "acc"))
    sel_sign = 1.0 if getattr(task, "higher_is_better", True) else -1.0
    steps = int(cfg.task.steps)
    budget = Budget.from_cfg(cfg.task, steps)  # wall-clock budget + batch ramp (engine/budget.py); off by default
    optimizer, scheduler = build_optimizer(model, cfg, glob, steps, progress=budget.progress)
    if cfg.impl.compile:
        model = torch.compile(model)

    make_sampler = data.sampler_factory or EpochSampler  # e.g. repeated augmentation for ImageNet recipes
    sampler = make_sampler(len(data.train), int(cfg.seed), rank, world, block=micro)
    collate = data.collate_fn
    train_loader = _loader(data.train, micro, sampler, cfg.impl.num_workers, cfg.impl.pin_memory, collate)
    if len(train_loader) < accum:
        raise ValueError(f"the training split has {len(data.train)} samples, fewer than one global batch ({glob})")
    eval_bs = max(micro, 1)
    val_loader = _loader(data.val, eval_bs, workers=cfg.impl.num_workers, collate=collate)
    test_loader = (_loader(data.test, eval_bs, workers=cfg.impl.num_workers, collate=collate)
                   if data.test is not None else None)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    val_loader = accelerator.prepare(val_loader)
    test_loader = accelerator.prepare(test_loader) if test_loader is not None else None
    state = TrainState()
    budget.bind(state)
    accelerator.register_for_checkpointing(state)
    raw = accelerator.unwrap_model(model)

    ckpt = latest_checkpoint(run_dir) if cfg.resume == "auto" else None
    if ckpt is not None:
        why = architecture_mismatch(ckpt, {k: tuple(v.shape) for k, v in raw.state_dict().items()})
        if why:
            raise ValueError(why)
        load_checkpoint(accelerator, ckpt)
        state.resumes.append(state.step)
        if main:
            print(f"[condattn] resumed {run_dir.name} from {ckpt.name} (step {state.step}/{steps})", flush=True)
    config = OmegaConf.to_container(cfg, resolve=True)
    logger = RunLogger(run_dir, cfg, main, state.step if ckpt else None, config)
    if main:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        write_json_atomic(run_dir / "patch_report.json", report.to_dict())

    from ..diagnostics import cheap_diagnostics, grad_diagnostics

    diag_batch = _first(data.val, int(cfg.diagnostics.batch_size), collate)
    diag_every = int(cfg.diagnostics.every or 0)
    step0_diag: dict[str, Any] = {}
    diag_jacobian = bool(cfg.diagnostics.get("jacobian", False))

    def run_diagnostics(step: int) -> dict:
        if not main:
            return {}
        batch = send_to_device(diag_batch, accelerator.device)
        flat = cheap_diagnostics(raw, task.forward, batch, mask=batch.get("attention_mask"))["flat"]
        if diag_jacobian:  # κ(J) of layer 0; restores train/eval modes and the RNG state (training is unchanged)
            from ..diagnostics import jacobian_diagnostics

            d, tokens = cfg.diagnostics, cfg.diagnostics.get("jacobian_tokens")
            flat.update(jacobian_diagnostics(raw, task.forward, batch, batch.get("attention_mask"),
                                             int(tokens) if tokens else None,
                                             iters=int(d.get("jacobian_iters") or 300),
                                             exact_max_entries=int(d.get("jacobian_exact_entries") or 4_000_000)))
        logger.log(step, "diag", flat)
        return flat

    if state.step == 0:
        step0_diag.update(run_diagnostics(0))

    def checkpoint() -> Path:
        return save_checkpoint(accelerator, run_dir, state.step, int(cfg.impl.keep_checkpoints))

    def evaluate(loader) -> dict:
        return task.evaluate(model, loader, accelerator)

    def any_rank(flag: bool) -> bool:
        """True on every rank when it is true on one (a signal may reach the ranks at different steps)."""
        if world == 1:
            return flag
        return bool(accelerator.reduce(torch.tensor([float(flag)], device=accelerator.device), "sum").item() > 0)

    def fail(loss_value: float, reason: str) -> None:
        good = good_ckpt if good_ckpt is not None and good_ckpt.exists() else None
        msg = (
            f"{reason} ({loss_value}) at step {state.step + 1} of {run_dir} (after {state.step} optimizer steps); "
            f"last good checkpoint: {good or 'none'}. Lower optim.lr, set optim.clip_grad_norm, or resume from "
            "that checkpoint after deleting the later ones."
        )
        if main:
            write_json_atomic(run_dir / "summary.json", {
                "status": "failed", "error": msg, "step": state.step + 1, "last_good_checkpoint": str(good or ""),
                "run_name": cfg.run.name, "run_dir": str(run_dir), "config": config,
            })
        logger.finish()
        raise TrainingDiverged(msg)

    clip = cfg.optim.get("clip_grad_norm")
    max_loss = cfg.impl.get("max_loss")
    eval_every, log_every = int(cfg.task.eval_every), int(cfg.task.log_every)
    ckpt_every = int(cfg.impl.checkpoint_every)
    interrupt_at = cfg.debug.get("interrupt_at_step")
    interrupt_sig = getattr(signal, str(cfg.debug.get("interrupt_signal") or "SIGTERM"))
    # a checkpoint is "good" once the loss computed from its weights was finite
    good_ckpt: Path | None = None
    pending_ckpt: Path | None = ckpt
    started = time.time()
    session_steps = 0
    tty = sys.stderr.isatty()  # a progress bar on a terminal; one line per evaluation in logs (SLURM, reproduce)
    bar = tqdm(total=steps, initial=state.step, disable=not (main and tty), desc=cfg.run.name, mininterval=5,
               leave=False)
    model.train()
    with StopFlag() as stop:
        if any_rank(stop.requested):  # asked to stop while the model was being built: nothing to save
            bar.close()
            logger.finish()
            raise TrainingInterrupted(f"signal {stop.name} before the first step; run the same command again",
                                      stop.signum, ckpt)
        # a resumed run continues the epoch at the micro-batch it had reached (nothing before it is loaded, so data
        # augmentation draws no random numbers for skipped samples)
        sampler.set_epoch(state.epoch, skip=state.batch_in_epoch)
        it = iter(train_loader)
        last_ckpt = ckpt
        while state.step < steps and not budget.exhausted():  # (a resumed run may have used its budget up)
            t0 = time.time()
            losses, accs = [], []
            accum_now = budget.accumulation(state.step, glob, micro * world)  # = accum unless the batch ramps
            for micro_i in range(accum_now):
                if state.batch_in_epoch >= len(train_loader):
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                    sampler.set_epoch(state.epoch)
                    it = iter(train_loader)
                batch = send_to_device(next(it), accelerator.device)  # nested dicts / lists of tensors too
                state.batch_in_epoch += 1
                sync = micro_i == accum_now - 1
                with nullcontext() if sync else accelerator.no_sync(model):
                    loss, logs = task.loss(model, batch)
                    accelerator.backward(loss / accum_now)
                losses.append(loss.detach())
                accs.append(logs.get("acc", torch.zeros((), device=loss.device)))  # (detection has none)
            loss, acc = torch.stack(losses).mean(), torch.stack(accs).mean()
            if world > 1:  # the loss of the whole global batch, identical on every rank
                loss, acc = accelerator.reduce(torch.stack([loss, acc.to(loss.dtype)]), "mean").unbind()
            if not torch.isfinite(loss):
                fail(loss.item(), "non-finite training loss")
            if max_loss is not None and loss.item() > float(max_loss):
                fail(loss.item(), f"training loss above impl.max_loss={max_loss}")
            if pending_ckpt is not None:
                good_ckpt, pending_ckpt = pending_ckpt, None
            if state.step == 0 and main:  # gradient norms of W_Q/W_K/W_V at step 0 (before the first update)
                t_diag = time.time()
                grads = grad_diagnostics(raw)
                step0_diag.update(grads)
                logger.log(0, "grad", grads)
                t0 += time.time() - t_diag  # measurement, not training: kept out of the step time
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), float(clip)) if clip else None
            optimizer.step()
            if not accelerator.optimizer_step_was_skipped:  # fp16: a step skipped on overflow does not advance
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            session_steps += 1
            state.train_time += time.time() - t0
            state.samples += accum_now * micro * world
            state.budget_stopped = budget.hours is not None and any_rank(budget.exhausted())
            last = state.step == steps or state.budget_stopped
            bar.update(1)

            if state.step % log_every == 0 or last:
                row = {"loss": loss, "acc": acc, "lr": scheduler.get_last_lr()[0]}
                if grad_norm is not None:
                    row["grad_norm"] = grad_norm
                logger.log(state.step, "train", row)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if state.step % eval_every == 0 or last:
                val = evaluate(val_loader)
                logger.log(state.step, "val", val)
                if main and not tty:
                    print(f"[condattn] {cfg.run.name} step {state.step}/{steps} loss={loss.item():.4f} "
                          f"val_{sel_key}={val[sel_key]:.4f} ({state.train_time:.0f} s training)", flush=True)
                if sel_sign * val[sel_key] > state.best_val:
                    state.best_val, state.best_step = sel_sign * val[sel_key], state.step
                    if main and cfg.task.get("save_best", True):  # best_model.pt: the test split's weights
                        tmp = run_dir / ".best_model.pt.tmp"
                        torch.save(raw.state_dict(), tmp)
                        os.replace(tmp, run_dir / "best_model.pt")
            if diag_every and state.step % diag_every == 0:
                run_diagnostics(state.step)
            if interrupt_at is not None and state.step == int(interrupt_at):
                os.kill(os.getpid(), interrupt_sig)
            stopping = any_rank(stop.requested)
            if stopping or state.step % ckpt_every == 0 or last:
                state.wall_time += time.time() - started
                started = time.time()
                last_ckpt = pending_ckpt = checkpoint()
            if stopping:
                bar.close()
                logger.finish()
                raise TrainingInterrupted(
                    f"signal {stop.name} at step {state.step}: checkpoint {last_ckpt} written; run the same "
                    "command again to resume", stop.signum, last_ckpt
                )
            if state.budget_stopped:
                if main and not tty:
                    print(f"[condattn] {cfg.run.name} budget of {budget.hours} h used up at step {state.step}/{steps}",
                          flush=True)
                break
    bar.close()
    state.wall_time += time.time() - started

    final_val = evaluate(val_loader)
    test = {}
    if test_loader is not None:
        final_test = evaluate(test_loader)
        best = run_dir / "best_model.pt"
        accelerator.wait_for_everyone()
        if best.exists():  # the LRA protocol: test accuracy of the best-validation checkpoint
            # map to the CPU first: under multi-process CPU runs accelerate's device is "cpu:0", which
            # torch.load cannot map to; load_state_dict then copies onto the model's device
            raw.load_state_dict(torch.load(best, map_location="cpu", weights_only=True))
            test = evaluate(test_loader)
        else:
            test = final_test
        # test_<k>: the best-validation weights (LRA's protocol); final_test_<k>: the last weights (e.g. MNLI-mm)
        test = {**{f"test_{k}": v for k, v in test.items() if k != "n"},
                **{f"final_test_{k}": v for k, v in final_test.items() if k != "n"}}
    final_diag = run_diagnostics(state.step) if main else {}

    hw = provenance.hardware(accelerator.device, world, _launch_info(cfg)["num_nodes"])
    samples = state.samples if budget.ramp else glob * state.step  # (a checkpoint from before `samples` existed)
    summary = {
        "status": "finished",
        "run_name": cfg.run.name,
        "run_dir": str(run_dir),
        "table": cfg.run.table,
        "row": cfg.run.row,
        "method": report.method,
        "scale": cfg.scale.name,
        "seed": int(cfg.seed),
        "metrics": {
            f"val_{sel_key}": sel_sign * state.best_val,  # the best validation value (val_acc, or val_loss for lm)
            "best_step": state.best_step,
            # every metric of the last evaluation (acc, loss; lm's ppl; GLUE's mcc / f1; detection's AP)
            **{f"final_val_{k}": v for k, v in final_val.items() if k != "n"},
            **test,
        },
        "steps": state.step,
        "budget": budget.summary(state.step, state.budget_stopped or (budget.exhausted() and state.step < steps),
                                 glob, micro * world),
        "global_batch": glob,
        "micro_batch": micro,
        "grad_accum": accum,
        "lr": scaled_lr(cfg, glob),
        "wall_time_s": round(state.wall_time, 2),
        "train_time_s": round(state.train_time, 2),
        "train_samples_per_s": round(samples / max(state.train_time, 1e-9), 2),
        **({"train_tokens_per_s": round(samples * int(data.info["seq_len"]) / max(state.train_time, 1e-9), 1)}
           if data.info.get("seq_len") else {}),
        "train_samples": samples,
        "hardware": hw,
        "hardware_line": provenance.describe(hw),
        "launch": {**_launch_info(cfg), "resumed_at_steps": list(state.resumes)},
        "versions": provenance.versions(),
        "commit": provenance.git_commit(),
        "data": {"checksum": data.checksum, **data.info},
        "patch": report.to_dict(),
        "diagnostics": {"step0": step0_diag, "final": final_diag},
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config,
    }
    if main:
        write_json_atomic(run_dir / "summary.json", summary)
    logger.finish(summary)
    accelerator.wait_for_everyone()
    return summary
