"""What a run shows while it trains: the training rows of metrics.jsonl (every `task.log_every` steps and the last),
a progress bar on a terminal, and one line per evaluation when the output is a log (SLURM, reproduce)."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from .base import Part


class Progress(Part):
    def __init__(self, run: Any, tty: bool):
        self.run = run
        self.tty = tty
        self.every = int(run.cfg.task.log_every)
        self.key = str(run.task.metric)
        self.bar = None

    def before_train(self, loop: Any) -> None:
        run = self.run
        self.bar = tqdm(total=run.steps, initial=run.state.step, disable=not (run.main and self.tty),
                        desc=run.cfg.run.name, mininterval=5, leave=False)

    def after_step(self, loop: Any) -> None:  # (first: the train row precedes the step's val and diag rows)
        run, step = self.run, self.run.state.step
        self.bar.update(1)
        if step % self.every == 0 or loop.last:
            row = {"loss": loop.loss, "acc": loop.acc, "lr": run.scheduler.get_last_lr()[0]}
            if loop.grad_norm is not None:
                row["grad_norm"] = loop.grad_norm
            run.logger.log(step, "train", row)
            self.bar.set_postfix(loss=f"{loop.loss.item():.3f}")

    def end_of_step(self, loop: Any) -> None:  # (before a stop request raises)
        run = self.run
        if loop.val is not None and run.main and not self.tty:
            print(f"[condattn] {run.cfg.run.name} step {run.state.step}/{run.steps} loss={loop.loss.item():.4f} "
                  f"val_{self.key}={loop.val[self.key]:.4f} ({run.state.train_time:.0f} s training)", flush=True)

    def after_train(self, loop: Any) -> None:
        self.close()

    def close(self, loop: Any = None) -> None:
        if self.bar is not None:
            self.bar.close()
