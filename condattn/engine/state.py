"""The state saved with every checkpoint: the loop's counters plus the state of the parts that keep one.

accelerate checkpoints one registered object (`register_for_checkpointing`), pickling its `state_dict()`. That dict
stays the flat one the trainer has always written (same keys, same order), so checkpoints of earlier runs resume: a
part that keeps state (best validation value, budget stop) is attached here and contributes its keys.
"""

from __future__ import annotations

from typing import Any

# the order of the keys in a checkpoint (as written before the trainer was split into parts)
KEY_ORDER = ("step", "epoch", "batch_in_epoch", "best_val", "best_step", "train_time", "samples", "budget_stopped",
             "wall_time", "resumes")


class TrainState:
    """Loop counters saved with every checkpoint (accelerate `register_for_checkpointing`)."""

    def __init__(self):
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.train_time = 0.0  # seconds in training steps, summed over resumes (the wall-clock budget's clock)
        self.samples = 0  # training samples consumed (differs from steps × global batch under a batch ramp)
        self.wall_time = 0.0
        self.resumes: list[int] = []  # the step of every resume (preemption, requeue, crash)
        self._parts: list[Any] = []

    def attach(self, part: Any) -> None:
        """Save `part.state_dict()` with the counters, and give it its keys back on `load_state_dict`."""
        self._parts.append(part)

    def state_dict(self) -> dict:
        d = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        for part in self._parts:
            d.update(part.state_dict())
        return {**{k: d.pop(k) for k in KEY_ORDER if k in d}, **d}

    def load_state_dict(self, d: dict) -> None:
        d = dict(d)
        for part in self._parts:
            part.load_state_dict({k: d.pop(k) for k in part.state_dict() if k in d})
        vars(self).update(d)
