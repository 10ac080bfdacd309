"""Checkpoints: every `impl.checkpoint_every` steps, at the last step and when a stop is requested; tracks the
last good checkpoint (one whose weights gave a finite loss) for the divergence message; and the session's wall
clock (`TrainState.wall_time`, saved with each checkpoint)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..checkpoint import save_checkpoint
from .base import Part


class Checkpointing(Part):
    def __init__(self, run: Any):
        self.run = run
        self.every = int(run.cfg.impl.checkpoint_every)
        self.keep = int(run.cfg.impl.keep_checkpoints)
        self.good: Path | None = None  # a checkpoint is "good" once the loss computed from its weights was finite
        self.pending: Path | None = None  # written, its weights' loss not yet seen
        self.last: Path | None = None  # the latest written (or resumed from)
        self.started = 0.0

    def good_checkpoint(self) -> Path | None:
        return self.good if self.good is not None and self.good.exists() else None

    def before_train(self, loop: Any) -> None:
        self.pending = self.last = self.run.resumed_from
        self.started = time.time()

    def after_backward(self, loop: Any) -> None:  # (after the divergence check: this step's loss was fine)
        if self.pending is not None:
            self.good, self.pending = self.pending, None

    def after_step(self, loop: Any) -> None:
        state = self.run.state
        if loop.stopping or state.step % self.every == 0 or loop.last:
            self._clock()
            self.last = self.pending = save_checkpoint(self.run.accelerator, self.run.run_dir, state.step, self.keep)

    def after_train(self, loop: Any) -> None:
        self._clock()

    def _clock(self) -> None:
        now = time.time()
        self.run.state.wall_time += now - self.started
        self.started = now
