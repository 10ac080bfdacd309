"""A wall-clock training budget (cramming's `budget`, in hours) and what is scheduled against it.

`task.budget_hours` (null = off) is a stopping rule checked after every optimizer step: the run ends (evaluation,
checkpoint, summary) at the first step boundary where its training time reaches the budget, or at `task.steps`,
whichever comes first. Both arms of a comparison get the same budget; the summary records the steps each reached.

What the clock counts: `TrainState.train_time`, the seconds spent inside optimizer steps (forward, backward,
conditioning, optimizer), summed over resumes because it is saved with every checkpoint. So a killed-and-resumed
run continues with the REMAINING budget; the steps lost after its last checkpoint are retrained and their time is
counted once. Evaluation, checkpointing, diagnostics and start-up are not counted (cramming's schedulers measure wall
time since its engine was built), so the eval interval does not change how much training an arm gets.

Progress p in [0, 1] drives the budget schedules and the batch ramp:
    p = step / task.steps                                  without a budget (deterministic, resumes bit for bit)
    p = max(step / task.steps, train_time / budget)        with one (as cramming's "fake step", which is
                                                           elapsed / budget × steps)
With a budget the lr and the batch size depend on measured time, so two runs of a seed are no longer bit-identical
(as in cramming); without one everything stays deterministic.

Batch-size ramp (`task.batch_size_ramp`, cramming bert-o4: 0.60; null or 0 = off). The global batch grows in units
of one micro-batch per process (u = impl micro-batch × processes: the accumulation steps of an optimizer step grow)
up to `task.batch_size`:
    rule `cramming`: B(p) = min(B, u · (floor(p · ramp · B / u) + 1))   cramming's `schedule_batch_size` as coded:
                     with ramp = 0.6 the batch reaches only 0.6 · B by the end of the budget
    rule `reach`:    B(p) = min(B, u · (floor(p / ramp · B / u) + 1))   what bert-o4's comment says ("reaches the
                     target 8192 at 60% of the total budget")
cramming ramps in units of its micro-batch too, so under a ramp `impl.micro_batch_size` sets the ramp's granularity.
"""

from __future__ import annotations

import math
from typing import Any

RAMP_RULES = ("cramming", "reach")


def budget_triangle(p: float, base: float = 0.25, falloff: float = 0.25) -> float:
    """cramming's `get_budget_triangle` lr factor at progress p: linear from `base` up to 1 at p = 1 - falloff, then
    linear down to 0 at p = 1 (`budget-triangle2`: base 0.25, falloff 0.25, peak at 75 % of the budget)."""
    return max(0.0, min(base + p * (1.0 - base) / (1.0 - falloff), (1.0 - p) / falloff))


class Budget:
    """The budget of one run; `bind(state)` once the TrainState exists (before that the clock reads 0)."""

    def __init__(self, hours: float | None, steps: int, ramp: float | None = None, ramp_rule: str = "cramming"):
        self.hours = None if hours is None else float(hours)
        if self.hours is not None and not self.hours > 0:
            raise ValueError(f"task.budget_hours={hours!r} must be a positive number of hours (or null)")
        self.seconds = None if self.hours is None else self.hours * 3600.0
        self.steps = int(steps)
        self.ramp = float(ramp) if ramp else 0.0
        if not 0.0 <= self.ramp <= 1.0:
            raise ValueError(f"task.batch_size_ramp={ramp!r} must be in [0, 1] (a fraction of the run) or null")
        if ramp_rule not in RAMP_RULES:
            raise ValueError(f"task.batch_size_ramp_rule={ramp_rule!r}: choose one of {list(RAMP_RULES)}")
        self.ramp_rule = ramp_rule
        self.state = None

    @classmethod
    def from_cfg(cls, task: Any, steps: int) -> Budget:
        from ..utils.typed_config import task_config

        t = task_config(task)
        return cls(t.budget_hours, steps, t.batch_size_ramp, str(t.batch_size_ramp_rule))

    def bind(self, state: Any) -> None:
        self.state = state

    @property
    def train_time(self) -> float:
        return float(self.state.train_time) if self.state is not None else 0.0

    def progress(self, step: int) -> float:
        p = step / max(self.steps, 1)
        if self.seconds is not None:
            p = max(p, self.train_time / self.seconds)
        return min(max(p, 0.0), 1.0)

    def exhausted(self) -> bool:
        return self.seconds is not None and self.train_time >= self.seconds

    def accumulation(self, step: int, global_batch: int, unit: int) -> int:
        """Micro-batches per process for the optimizer step after `step` (global batch / unit without a ramp)."""
        full = global_batch // unit
        if not self.ramp:
            return full
        p = self.progress(step)
        scale = p * self.ramp if self.ramp_rule == "cramming" else p / self.ramp
        return max(1, min(full, math.floor(scale * global_batch / unit) + 1))

    def summary(self, steps_reached: int, stopped: bool, global_batch: int, unit: int) -> dict[str, Any]:
        return {
            "hours": self.hours,
            "stopped_by_budget": bool(stopped),
            "steps_reached": int(steps_reached),
            "steps_limit": self.steps,
            "train_time_s": round(self.train_time, 2),
            "clock": "training steps only (TrainState.train_time, summed over resumes)",
            "batch_size_ramp": self.ramp or None,
            "batch_size_ramp_rule": self.ramp_rule if self.ramp else None,
            "final_global_batch": self.accumulation(max(steps_reached - 1, 0), global_batch, unit) * unit,
        }
