"""Evaluation and the best model: the validation split every `task.eval_every` steps and at the last one, the
task's selection metric (its `metric`, `higher_is_better`) tracked over the evaluations, and `best_model.pt` (the
weights the test split is scored with) written whenever it improves."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ...utils.typed_config import task_config
from .base import Part


class BestModel(Part):
    def __init__(self, run: Any):
        self.run = run
        self.every = int(run.cfg.task.eval_every)
        self.key = str(run.task.metric)
        # best_val holds sign × value, so "larger is better" and the checkpoints' -inf start hold for both directions
        self.sign = 1.0 if run.task.higher_is_better else -1.0
        self.save = bool(task_config(run.cfg.task).save_best)
        self.best_val = -math.inf
        self.best_step = -1
        self.latest: tuple[int, dict] | None = None  # (step, validation metrics) of this session's latest evaluation

    def state_dict(self) -> dict[str, Any]:
        return {"best_val": self.best_val, "best_step": self.best_step}

    def evaluate(self, loader: Any) -> dict:
        return self.run.task.evaluate(self.run.model, loader, self.run.accelerator)

    def after_step(self, loop: Any) -> None:
        run, step = self.run, self.run.state.step
        if not (step % self.every == 0 or loop.last):
            return
        val = loop.val = self.evaluate(run.val_loader)
        self.latest = (step, dict(val))
        run.logger.log(step, "val", val)
        if self.sign * val[self.key] > self.best_val:
            self.best_val, self.best_step = self.sign * val[self.key], step
            if run.main and self.save:  # best_model.pt: the test split's weights
                tmp = run.run_dir / ".best_model.pt.tmp"
                torch.save(run.raw.state_dict(), tmp)
                os.replace(tmp, run.run_dir / "best_model.pt")

    def metrics(self) -> dict[str, Any]:
        # the best validation value (val_acc, or val_loss for lm)
        return {f"val_{self.key}": self.sign * self.best_val, "best_step": self.best_step}
