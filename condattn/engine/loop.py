"""The step loop: micro-batches with gradient accumulation, clipping, the optimizer and schedule step, and the
parts' hooks around each step (engine/parts: checkpoints, evaluation, diagnostics, budget, stop signals,
divergence, progress). The order of the parts is the order of their effects (log rows, files, printed lines)."""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from typing import Any

import torch
from accelerate.utils import send_to_device

from ..conditioning import after_optimizer_step
from ..utils.typed_config import optim_config
from .errors import TrainingDiverged, TrainingInterrupted
from .parts import (
    BestModel,
    BudgetStop,
    Checkpointing,
    Diagnostics,
    Divergence,
    Part,
    Progress,
    StopSignals,
    TestProtocol,
    Throughput,
)
from .runcost import HOOK_CAUSE, IN_STEP, CpuLedger, cpu
from .setup import Run, start
from .summary import build_summary, write_summary


class StepLoop:
    def __init__(self, run: Run):
        self.run = run
        self.tty = sys.stderr.isatty()  # a progress bar on a terminal; one line per evaluation in logs
        self.clip = optim_config(run.cfg.optim).clip_grad_norm  # max global grad norm (None: no clipping)
        self.progress = Progress(run, self.tty)
        self.throughput = Throughput(run)  # samples/s (and MFU on GPUs) rows; not checkpointed (timing only)
        self.best = BestModel(run)
        self.diagnostics = Diagnostics(run)
        self.budget = BudgetStop(run)
        self.test = TestProtocol(run, self.best)
        run.state.attach(self.best)  # their state goes into every checkpoint (and comes back on resume)
        run.state.attach(self.budget)
        run.state.attach(self.diagnostics)  # step 0's values: a resumed run's summary has them too
        self.checkpoints = Checkpointing(run)
        self.signals = StopSignals(run, self.checkpoints)
        self.divergence = Divergence(run, self.checkpoints)
        # when each part's hooks run, in this order (the order of their effects: log rows, files, printed lines).
        # The divergence check precedes promoting the pending checkpoint to "good"; the signals part decides
        # whether to stop before the checkpointing part saves and raises after it.
        self.schedule: dict[str, list[Part]] = {
            "before_train": [self.diagnostics, self.checkpoints, self.progress, self.throughput],
            "after_backward": [self.divergence, self.checkpoints, self.diagnostics],
            "after_optimizer_step": [self.budget],
            "after_step": [self.progress, self.throughput, self.best, self.diagnostics, self.signals, self.checkpoints],
            "end_of_step": [self.progress, self.signals, self.budget],
            "after_train": [self.progress, self.checkpoints, self.test, self.diagnostics, self.throughput],
            "close": [self.progress],  # the run ends early (interrupted, diverged)
        }
        self.loss = self.acc = self.grad_norm = self.val = None
        self.last = self.stopping = False
        self._t0 = 0.0
        self.cpu = run.cpu if run.cpu is not None else CpuLedger(cpu())
        self._in_step = False
        self._cpu_out = 0.0  # CPU of this step's hooks charged to a cause other than training

    def _hooks(self, name: str) -> None:
        for part in self.schedule[name]:
            t = cpu()
            getattr(part, name)(self)
            key = (type(part).__name__, name)
            cause = HOOK_CAUSE.get(key) or ("train" if key in IN_STEP else "other")
            if cause != "train" or not self._in_step:  # (inside a step, training's share is the step's own CPU)
                spent = cpu() - t
                self.cpu.add(cause, spent)
                if self._in_step:
                    self._cpu_out += spent

    def untimed(self, seconds: float) -> None:
        """Time spent in this step that is not training (kept out of TrainState.train_time)."""
        self._t0 += seconds

    def train(self) -> dict:
        run = self.run
        ledger = self.cpu
        ledger.add("startup", max(cpu() - ledger.start - sum(ledger.spent.values()), 0.0))  # imports, config, build
        with ledger.charge("startup"):
            start(run)  # resume (the attached parts' state too), open the log, write the config
        self._hooks("before_train")
        run.model.train()
        try:
            with self.signals:
                self.signals.check_start()
                self._steps()
        except (TrainingInterrupted, TrainingDiverged):
            self._hooks("close")
            run.logger.finish()
            raise
        self._hooks("after_train")
        run.performance = {**(run.performance or {}), "cpu_split": ledger.close()}
        metrics = {**self.best.metrics(), **self.test.metrics()}
        summary = build_summary(run, metrics, self.budget.summary(), self.diagnostics.summary())
        if run.main:
            write_summary(run, summary)
        run.logger.finish(summary)
        run.accelerator.wait_for_everyone()
        return summary

    def step0(self) -> dict:
        """Step 0's diagnostics without training (engine/step0.py): the run's start and its first step's forward and
        backward passes as `train` runs them, then no optimizer step. The run must start at step 0 (resume=never)."""
        run = self.run
        start(run)
        if run.state.step != 0:
            raise ValueError(f"{run.run_dir} resumed at step {run.state.step}: step 0 is measured on a fresh run")
        self._hooks("before_train")
        run.model.train()
        self._first_batches()
        self._forward_backward()
        self._hooks("after_backward")
        self._hooks("close")
        run.logger.finish()
        return dict(self.diagnostics.step0)

    def _first_batches(self) -> None:
        # a resumed run continues the epoch at the micro-batch it had reached (nothing before it is loaded, so data
        # augmentation draws no random numbers for skipped samples)
        state = self.run.state
        self.run.sampler.set_epoch(state.epoch, skip=state.batch_in_epoch)
        self._it = iter(self.run.train_loader)

    def _forward_backward(self) -> int:
        """One step's micro-batches forward and backward (the loss and accuracy kept); how many there were."""
        run = self.run
        accum_now = run.budget.accumulation(run.state.step, run.glob, run.micro * run.world)  # = accum unless ramped
        self.loss, self.acc = self._accumulate(accum_now)
        return accum_now

    def _steps(self) -> None:
        run, state = self.run, self.run.state
        self._first_batches()
        while state.step < run.steps and not run.budget.exhausted():  # (a resumed run may have used its budget up)
            self._t0 = time.time()
            c0, self._cpu_out, self._in_step = cpu(), 0.0, True
            accum_now = self._forward_backward()
            self._hooks("after_backward")
            self._optimizer_step()
            state.step += 1
            state.train_time += time.time() - self._t0
            state.samples += accum_now * run.micro * run.world
            self._hooks("after_optimizer_step")
            self._in_step = False
            self.cpu.add("train", cpu() - c0 - self._cpu_out)
            self.cpu.steps += 1
            ckpt = self.checkpoints.last
            self.last = state.step == run.steps or self.budget.budget_stopped
            self.val = None
            self._hooks("after_step")
            self.cpu.evals += self.val is not None
            self.cpu.checkpoints += self.checkpoints.last is not ckpt
            self._hooks("end_of_step")
            if self.budget.budget_stopped:
                break

    def _next_batch(self) -> Any:
        run, state = self.run, self.run.state
        if state.batch_in_epoch >= len(run.train_loader):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            run.sampler.set_epoch(state.epoch)
            self._it = iter(run.train_loader)
        batch = send_to_device(next(self._it), run.accelerator.device)  # nested dicts / lists of tensors too
        state.batch_in_epoch += 1
        return batch

    def _accumulate(self, accum_now: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of `accum_now` micro-batches; the mean loss and accuracy of the global batch."""
        run = self.run
        losses, accs = [], []
        for micro_i in range(accum_now):
            batch = self._next_batch()
            sync = micro_i == accum_now - 1
            with nullcontext() if sync else run.accelerator.no_sync(run.model):
                loss, logs = run.task.loss(run.model, batch)
                run.accelerator.backward(loss / accum_now)
            losses.append(loss.detach())
            accs.append(logs.get("acc", torch.zeros((), device=loss.device)))  # (detection has none)
        loss, acc = torch.stack(losses).mean(), torch.stack(accs).mean()
        if run.world > 1:  # the loss of the whole global batch, identical on every rank
            loss, acc = run.accelerator.reduce(torch.stack([loss, acc.to(loss.dtype)]), "mean").unbind()
        return loss, acc

    def _optimizer_step(self) -> None:
        run = self.run
        clip = self.clip
        self.grad_norm = run.accelerator.clip_grad_norm_(run.model.parameters(), float(clip)) if clip else None
        run.optimizer.step()
        if not run.accelerator.optimizer_step_was_skipped:  # fp16: a step skipped on overflow does not advance
            run.scheduler.step()
            after_optimizer_step(run.raw)  # the method's per-step work (MethodSpec.after_step: qk_clip's rescale)
        run.optimizer.zero_grad(set_to_none=True)
