"""Stop requests (engine/signals.py's StopFlag: SIGTERM, SIGUSR1/2, the first Ctrl-C), agreed on by every rank at
each step boundary: the checkpointing part then saves, and the run raises TrainingInterrupted. `debug.
interrupt_at_step` sends the signal to this process itself (the kill-and-resume tests)."""

from __future__ import annotations

import os
import signal
from typing import Any

from ..errors import TrainingInterrupted
from ..signals import StopFlag
from .base import Part
from .checkpointing import Checkpointing


class StopSignals(Part):
    def __init__(self, run: Any, checkpoints: Checkpointing):
        self.run = run
        self.checkpoints = checkpoints
        self.interrupt_at = run.cfg.debug.get("interrupt_at_step")
        self.interrupt_sig = getattr(signal, str(run.cfg.debug.get("interrupt_signal") or "SIGTERM"))
        self.flag = StopFlag()

    def __enter__(self) -> StopSignals:
        self.flag.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.flag.__exit__(*exc)

    def check_start(self) -> None:
        """Asked to stop while the model was being built: nothing to save."""
        stop = self.flag
        if self.run.any_rank(stop.requested):
            raise TrainingInterrupted(f"signal {stop.name} before the first step; run the same command again",
                                      stop.signum, self.run.resumed_from)

    def after_step(self, loop: Any) -> None:  # (before the checkpointing part, which saves when stopping)
        if self.interrupt_at is not None and self.run.state.step == int(self.interrupt_at):
            os.kill(os.getpid(), self.interrupt_sig)
        loop.stopping = self.run.any_rank(self.flag.requested)

    def end_of_step(self, loop: Any) -> None:
        if loop.stopping:
            stop, ckpt = self.flag, self.checkpoints.last
            raise TrainingInterrupted(
                f"signal {stop.name} at step {self.run.state.step}: checkpoint {ckpt} written; run the same "
                "command again to resume", stop.signum, ckpt
            )
