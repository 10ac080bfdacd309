"""The wall-clock budget as a stopping rule (engine/budget.py: the clock, the schedules, the batch ramp): after
every optimizer step all ranks agree whether it is used up; the loop then ends after that step's evaluation and
checkpoint."""

from __future__ import annotations

from typing import Any

from .base import Part


class BudgetStop(Part):
    def __init__(self, run: Any):
        self.run = run
        self.budget = run.budget
        self.budget_stopped = False  # the run ended because task.budget_hours was used up (saved in checkpoints)

    def state_dict(self) -> dict[str, Any]:
        return {"budget_stopped": self.budget_stopped}

    def after_optimizer_step(self, loop: Any) -> None:
        self.budget_stopped = self.budget.hours is not None and self.run.any_rank(self.budget.exhausted())

    def end_of_step(self, loop: Any) -> None:  # (after a stop request raised: a preempted run does not print this)
        run = self.run
        if self.budget_stopped and run.main and not loop.tty:
            print(f"[condattn] {run.cfg.run.name} budget of {self.budget.hours} h used up at step "
                  f"{run.state.step}/{run.steps}", flush=True)

    def summary(self) -> dict[str, Any]:
        run, steps = self.run, self.run.state.step
        stopped = self.budget_stopped or (self.budget.exhausted() and steps < run.steps)
        return self.budget.summary(steps, stopped, run.glob, run.micro * run.world)
