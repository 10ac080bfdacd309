"""How a training run ends early: preempted (a checkpoint was written, rerun to resume) or diverged."""

from __future__ import annotations

from pathlib import Path


class TrainingInterrupted(Exception):
    """Raised after a preemption checkpoint was written; rerunning the same command resumes."""

    def __init__(self, message: str, signum: int | None = None, checkpoint: Path | None = None):
        super().__init__(message)
        self.signum = signum
        self.checkpoint = checkpoint


class TrainingDiverged(FloatingPointError):
    """The training loss became non-finite or exceeded `impl.max_loss`; names the step and the last good
    checkpoint."""
