"""Training throughput while a run trains: a `perf` row in metrics.jsonl every `task.log_every` steps with the
samples/s of the steps since the previous row and, on a GPU whose peak is known (engine/flops.py), the model FLOPs
utilisation. The FLOPs per sample are counted once, before the first step, on the meta device (engine/cost.py), so
counting draws nothing from the run's RNG and costs no GPU memory. On CPUs only samples/s is logged. The run's
mean samples/s and MFU go to summary.json under `performance`. Timing never enters the train/val rows, so the
bit-identity of reruns is untouched."""

from __future__ import annotations

from typing import Any

from ..flops import mfu as model_flops_utilisation
from .base import Part


class Throughput(Part):
    def __init__(self, run: Any):
        self.run = run
        self.every = int(run.cfg.task.log_every)
        self.flops_per_sample: float | None = None
        self.counted = ""
        self.device_name = ""
        self._last = (0, 0.0)  # (samples, train_time) at the previous perf row

    def before_train(self, loop: Any) -> None:
        run = self.run
        self._last = (run.state.samples, run.state.train_time)
        if run.execution is None or run.execution.device_type != "cuda":
            return
        import torch

        from ..cost import training_flops_per_sample

        self.device_name = torch.cuda.get_device_name(run.accelerator.device)
        self.flops_per_sample, self.counted = training_flops_per_sample(run.cfg)

    def _mfu(self, samples_per_s: float) -> float | None:
        if self.flops_per_sample is None or self.run.execution is None:
            return None
        return model_flops_utilisation(self.flops_per_sample, samples_per_s, self.device_name,
                                       self.run.execution.dtype_name, self.run.world)

    def after_step(self, loop: Any) -> None:
        run, state = self.run, self.run.state
        if not (state.step % self.every == 0 or loop.last):
            return
        samples, t = state.samples - self._last[0], state.train_time - self._last[1]
        self._last = (state.samples, state.train_time)
        if samples <= 0 or t <= 0:
            return
        row: dict[str, Any] = {"samples_per_s": round(samples / t, 2)}
        if (u := self._mfu(samples / t)) is not None:
            row["mfu"] = round(u, 4)
        run.logger.log(state.step, "perf", row)

    def after_train(self, loop: Any) -> None:
        run, state = self.run, self.run.state
        per_s = state.samples / max(state.train_time, 1e-9)
        perf: dict[str, Any] = {"train_samples_per_s": round(per_s, 2)}
        if self.flops_per_sample is not None:
            perf.update(train_flops_per_sample=self.flops_per_sample, flops_counted=self.counted,
                        achieved_flops_per_s=round(self.flops_per_sample * per_s, 1),
                        mfu=(None if (u := self._mfu(per_s)) is None else round(u, 4)))
        run.performance = perf
