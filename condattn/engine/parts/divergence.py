"""Divergence: a non-finite training loss, or one above `impl.max_loss`, ends the run with a failed summary that
names the step and the last good checkpoint, and raises TrainingDiverged."""

from __future__ import annotations

from typing import Any

import torch

from ...utils.typed_config import impl_config
from ..errors import TrainingDiverged
from ..summary import write_failure
from .base import Part
from .checkpointing import Checkpointing


class Divergence(Part):
    def __init__(self, run: Any, checkpoints: Checkpointing):
        self.run = run
        self.checkpoints = checkpoints
        self.max_loss = impl_config(run.cfg.impl).max_loss

    def after_backward(self, loop: Any) -> None:
        loss = loop.loss
        if not torch.isfinite(loss):
            self.fail(loss.item(), "non-finite training loss")
        if self.max_loss is not None and loss.item() > float(self.max_loss):
            self.fail(loss.item(), f"training loss above impl.max_loss={self.max_loss}")

    def fail(self, loss_value: float, reason: str) -> None:
        run, step = self.run, self.run.state.step
        good = self.checkpoints.good_checkpoint()
        msg = (
            f"{reason} ({loss_value}) at step {step + 1} of {run.run_dir} (after {step} optimizer steps); "
            f"last good checkpoint: {good or 'none'}. Lower optim.lr, set optim.clip_grad_norm, or resume from "
            "that checkpoint after deleting the later ones."
        )
        if run.main:
            write_failure(run, msg, step + 1, good)
        raise TrainingDiverged(msg)
