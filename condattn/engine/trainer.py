"""The one trainer: every task and table goes through `train(cfg)`.

Build (model from the zoo, conditioning patch asserted against the config, data, task) -> accelerate ->
optimizer steps with gradient accumulation, clipping, schedule, periodic eval and checkpoints ->
summary.json. Preemption (SIGTERM / SIGUSR1 / first Ctrl-C) saves a checkpoint at the next step boundary;
`resume=auto` continues from it with the same data order and RNG state.
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
from accelerate.utils import set_seed
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..conditioning import apply_conditioning
from ..data.build import build_datasets
from ..models import build_model
from ..tasks import build_task
from . import provenance
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .io import read_json, write_json_atomic
from .logging import RunLogger
from .optim import build_optimizer, scaled_lr
from .sampler import EpochSampler


class TrainingInterrupted(Exception):
    """Raised after a preemption checkpoint was written; rerunning the same command resumes."""


class TrainState:
    """Loop counters saved with every checkpoint (accelerate `register_for_checkpointing`)."""

    def __init__(self):
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.best_val = -math.inf
        self.best_step = -1
        self.train_time = 0.0  # seconds in training steps, summed over resumes
        self.wall_time = 0.0

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, d: dict) -> None:
        vars(self).update(d)


class _StopFlag:
    SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None), signal.SIGINT) if s is not None)

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self):
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def summary_is_finished(run_dir: str | Path) -> dict | None:
    s = read_json(Path(run_dir) / "summary.json")
    return s if isinstance(s, dict) and s.get("status") == "finished" and "metrics" in s else None


def _batches(cfg: Any, world: int) -> tuple[int, int, int]:
    """(global batch, per-process micro-batch, accumulation steps); refuses an inconsistent split."""
    glob = int(cfg.task.batch_size)
    micro = int(cfg.impl.micro_batch_size or glob // world)
    if micro < 1 or glob % (micro * world):
        raise ValueError(
            f"global batch task.batch_size={glob} is not divisible by impl.micro_batch_size={micro} × "
            f"{world} processes; choose a micro-batch that divides {glob // world if world else glob}"
        )
    return glob, micro, glob // (micro * world)


def _loader(ds, batch_size: int, sampler=None, workers: int = 0, pin: bool = False) -> DataLoader:
    # a private generator: building an iterator must not draw from the global RNG (dropout masks would
    # then differ between a resumed and an uninterrupted run)
    return DataLoader(
        ds, batch_size=batch_size, sampler=sampler, shuffle=False, num_workers=workers, pin_memory=pin,
        drop_last=sampler is not None, generator=torch.Generator().manual_seed(0),
    )


def _first(ds, n: int) -> dict[str, torch.Tensor]:
    items = [ds[i] for i in range(min(n, len(ds)))]
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def train(cfg: Any) -> dict:
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # one line per checkpoint file otherwise
    run_dir = Path(cfg.run.dir)
    if cfg.resume == "auto" and (done := summary_is_finished(run_dir)):
        print(f"[condattn] {run_dir} already finished; nothing to do (resume=never reruns it)")
        return done
    if cfg.impl.threads:
        torch.set_num_threads(int(cfg.impl.threads))
    torch.set_flush_denormal(bool(cfg.impl.get("flush_denormal", True)))

    accelerator = Accelerator(mixed_precision=str(cfg.impl.precision), cpu=not torch.cuda.is_available())
    world, rank, main = accelerator.num_processes, accelerator.process_index, accelerator.is_main_process
    glob, micro, accum = _batches(cfg, world)
    if cfg.resume == "never" and main and run_dir.exists():
        shutil.rmtree(run_dir)
    accelerator.wait_for_everyone()
    set_seed(int(cfg.seed), deterministic=bool(cfg.impl.deterministic))

    data = build_datasets(cfg)
    model = build_model(cfg.model)
    cond = OmegaConf.to_container(cfg.conditioning, resolve=True)
    report = apply_conditioning(model, cond.pop("method"), **cond)
    report.check(attention_layers=cfg.model.get("attention_layers"))
    task = build_task(cfg)
    steps = int(cfg.task.steps)
    optimizer, scheduler = build_optimizer(model, cfg, glob, steps)
    if cfg.impl.compile:
        model = torch.compile(model)

    sampler = EpochSampler(len(data.train), int(cfg.seed), rank, world)
    train_loader = _loader(data.train, micro, sampler, cfg.impl.num_workers, cfg.impl.pin_memory)
    if len(train_loader) < accum:
        raise ValueError(f"the training split has {len(data.train)} samples, fewer than one global batch ({glob})")
    eval_bs = max(micro, 1)
    val_loader = _loader(data.val, eval_bs, workers=cfg.impl.num_workers)
    test_loader = _loader(data.test, eval_bs, workers=cfg.impl.num_workers) if data.test is not None else None
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    val_loader = accelerator.prepare(val_loader)
    test_loader = accelerator.prepare(test_loader) if test_loader is not None else None
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    raw = accelerator.unwrap_model(model)

    ckpt = latest_checkpoint(run_dir) if cfg.resume == "auto" else None
    if ckpt is not None:
        load_checkpoint(accelerator, ckpt)
        print(f"[condattn] resumed {run_dir.name} from {ckpt.name} (step {state.step}/{steps})")
    config = OmegaConf.to_container(cfg, resolve=True)
    logger = RunLogger(run_dir, cfg, main, state.step if ckpt else None, config)
    if main:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        write_json_atomic(run_dir / "patch_report.json", report.to_dict())

    from ..diagnostics import cheap_diagnostics, grad_diagnostics

    diag_batch = _first(data.val, int(cfg.diagnostics.batch_size))
    diag_every = int(cfg.diagnostics.every or 0)
    step0_diag: dict[str, Any] = {}

    def run_diagnostics(step: int) -> dict:
        if not main:
            return {}
        batch = {k: v.to(accelerator.device) for k, v in diag_batch.items()}
        flat = cheap_diagnostics(raw, task.forward, batch, mask=batch.get("attention_mask"))["flat"]
        logger.log(step, "diag", flat)
        return flat

    if state.step == 0:
        step0_diag.update(run_diagnostics(0))

    def checkpoint() -> Path:
        return save_checkpoint(accelerator, run_dir, state.step, int(cfg.impl.keep_checkpoints))

    def evaluate(loader) -> dict:
        return task.evaluate(model, loader, accelerator)

    clip = cfg.optim.get("clip_grad_norm")
    eval_every, log_every = int(cfg.task.eval_every), int(cfg.task.log_every)
    ckpt_every = int(cfg.impl.checkpoint_every)
    interrupt_at = cfg.debug.get("interrupt_at_step")
    started = time.time()
    session_steps = 0
    tty = sys.stderr.isatty()  # a progress bar on a terminal; one line per evaluation in logs (SLURM, reproduce)
    bar = tqdm(total=steps, initial=state.step, disable=not (main and tty), desc=cfg.run.name, mininterval=5,
               leave=False)
    model.train()
    with _StopFlag() as stop:
        sampler.set_epoch(state.epoch)
        it = iter(train_loader)
        for _ in range(state.batch_in_epoch):  # replay position inside the epoch after a resume
            next(it)
        last_ckpt = ckpt
        while state.step < steps:
            t0 = time.time()
            losses, accs = [], []
            for micro_i in range(accum):
                if state.batch_in_epoch >= len(train_loader):
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                    sampler.set_epoch(state.epoch)
                    it = iter(train_loader)
                batch = {k: v.to(accelerator.device) for k, v in next(it).items()}
                state.batch_in_epoch += 1
                sync = micro_i == accum - 1
                with nullcontext() if sync else accelerator.no_sync(model):
                    loss, logs = task.loss(model, batch)
                    accelerator.backward(loss / accum)
                losses.append(loss.detach())
                accs.append(logs["acc"])
            loss = torch.stack(losses).mean()
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite loss ({loss.item()}) at step {state.step} of {run_dir}; last good checkpoint: "
                    f"{last_ckpt or 'none'}. Lower optim.lr or enable optim.clip_grad_norm."
                )
            if state.step == 0 and main:  # gradient norms of W_Q/W_K/W_V at step 0 (before the first update)
                grads = grad_diagnostics(raw)
                step0_diag.update(grads)
                logger.log(0, "grad", grads)
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), float(clip)) if clip else None
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            session_steps += 1
            state.train_time += time.time() - t0
            bar.update(1)

            if state.step % log_every == 0 or state.step == steps:
                row = {"loss": loss, "acc": torch.stack(accs).mean(), "lr": scheduler.get_last_lr()[0]}
                if grad_norm is not None:
                    row["grad_norm"] = grad_norm
                logger.log(state.step, "train", row)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if state.step % eval_every == 0 or state.step == steps:
                val = evaluate(val_loader)
                logger.log(state.step, "val", val)
                if main and not tty:
                    print(f"[condattn] {cfg.run.name} step {state.step}/{steps} loss={loss.item():.4f} "
                          f"val_acc={val['acc']:.4f} ({state.train_time:.0f} s training)", flush=True)
                if val["acc"] > state.best_val:
                    state.best_val, state.best_step = val["acc"], state.step
                    if main:
                        tmp = run_dir / ".best_model.pt.tmp"
                        torch.save(raw.state_dict(), tmp)
                        os.replace(tmp, run_dir / "best_model.pt")
            if diag_every and state.step % diag_every == 0:
                run_diagnostics(state.step)
            if interrupt_at is not None and state.step == int(interrupt_at):
                os.kill(os.getpid(), signal.SIGTERM)
            if stop.signum is not None or state.step % ckpt_every == 0 or state.step == steps:
                state.wall_time += time.time() - started
                started = time.time()
                last_ckpt = checkpoint()
            if stop.signum is not None:
                bar.close()
                logger.finish()
                raise TrainingInterrupted(
                    f"signal {signal.Signals(stop.signum).name} at step {state.step}: checkpoint {last_ckpt} "
                    "written; run the same command again to resume"
                )
    bar.close()
    state.wall_time += time.time() - started

    final_val = evaluate(val_loader)
    test = {}
    if test_loader is not None:
        final_test = evaluate(test_loader)
        best = run_dir / "best_model.pt"
        accelerator.wait_for_everyone()
        if best.exists():  # the LRA protocol: test accuracy of the best-validation checkpoint
            raw.load_state_dict(torch.load(best, map_location=accelerator.device, weights_only=True))
            test = evaluate(test_loader)
        else:
            test = final_test
        test = {"test_acc": test["acc"], "test_loss": test["loss"], "final_test_acc": final_test["acc"]}
    final_diag = run_diagnostics(state.step) if main else {}

    hw = provenance.hardware(accelerator.device, world)
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
            "val_acc": state.best_val,
            "best_step": state.best_step,
            "final_val_acc": final_val["acc"],
            "final_val_loss": final_val["loss"],
            **test,
        },
        "steps": state.step,
        "global_batch": glob,
        "micro_batch": micro,
        "grad_accum": accum,
        "lr": scaled_lr(cfg, glob),
        "wall_time_s": round(state.wall_time, 2),
        "train_time_s": round(state.train_time, 2),
        "train_samples_per_s": round(glob * state.step / max(state.train_time, 1e-9), 2),
        "hardware": hw,
        "hardware_line": provenance.describe(hw),
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
