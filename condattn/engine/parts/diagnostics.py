"""Diagnostics during training (rank 0; they draw nothing from the training RNG): the cheap ones (κ of the tokens
and of W_Q/W_K/W_V) at step 0, every `diagnostics.every` steps and at the end, on a fixed validation batch; the
gradient norms of W_Q/W_K/W_V at step 0, before the first update; κ(J) of layer 0 with `diagnostics.jacobian`.
Step 0's values are saved with every checkpoint, so a resumed run's summary carries them as an uninterrupted run's
does (a checkpoint written before they were kept there: read back from the step-0 rows of metrics.jsonl)."""

from __future__ import annotations

import time
from typing import Any

import torch
from accelerate.utils import send_to_device

from ...diagnostics import cheap_diagnostics, grad_diagnostics
from ...utils.io import read_jsonl
from .base import Part


def first_items(ds, n: int, collate=None) -> Any:
    """The first n samples of a split as one batch."""
    items = [ds[i] for i in range(min(n, len(ds)))]
    if collate is not None:
        return collate(items)
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


class Diagnostics(Part):
    def __init__(self, run: Any):
        self.run = run
        d = run.cfg.diagnostics
        self.every = int(d.every or 0)
        self.jacobian = bool(d.get("jacobian", False))
        self.batch = None
        self.step0: dict[str, Any] = {}
        self.final: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"diagnostics_step0": dict(self.step0)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.step0 = dict(d.get("diagnostics_step0") or {})

    def logged_step0(self) -> dict[str, Any]:
        """Step 0's values as metrics.jsonl holds them: its step-0 `diag` and `grad` rows (the summary's `step0` is
        their union), for a run resumed from a checkpoint that predates keeping them."""
        rows = read_jsonl(self.run.logger.path) if self.run.logger is not None else []
        return {k: v for r in rows if r.get("step") == 0 and r.get("split") in ("diag", "grad")
                for k, v in r.items() if k not in ("step", "split")}

    def measure(self, step: int) -> dict:
        run = self.run
        if not run.main:
            return {}
        batch = send_to_device(self.batch, run.accelerator.device)
        flat = cheap_diagnostics(run.eager, run.task.forward, batch, mask=batch.get("attention_mask"))["flat"]
        if self.jacobian:  # κ(J) of layer 0; restores train/eval modes and the RNG state (training is unchanged)
            flat.update(self._jacobian(batch))
        run.logger.log(step, "diag", flat)
        return flat

    def _jacobian(self, batch: Any) -> dict:
        from ...diagnostics import jacobian_diagnostics

        d, tokens = self.run.cfg.diagnostics, self.run.cfg.diagnostics.get("jacobian_tokens")
        return jacobian_diagnostics(self.run.eager, self.run.task.forward, batch, batch.get("attention_mask"),
                                    int(tokens) if tokens else None, iters=int(d.get("jacobian_iters") or 300),
                                    exact_max_entries=int(d.get("jacobian_exact_entries") or 4_000_000))

    def before_train(self, loop: Any) -> None:
        run = self.run
        self.batch = first_items(run.data.val, int(run.cfg.diagnostics.batch_size), run.data.collate_fn)
        if run.state.step == 0:
            self.step0.update(self.measure(0))
        elif run.main and not self.step0:
            self.step0 = self.logged_step0()

    def after_backward(self, loop: Any) -> None:
        if self.run.state.step == 0 and self.run.main:  # gradient norms of W_Q/W_K/W_V before the first update
            t_diag = time.time()
            grads = grad_diagnostics(self.run.eager)
            self.step0.update(grads)
            self.run.logger.log(0, "grad", grads)
            loop.untimed(time.time() - t_diag)  # measurement, not training: kept out of the step time

    def after_step(self, loop: Any) -> None:
        if self.every and self.run.state.step % self.every == 0:
            self.measure(self.run.state.step)

    def after_train(self, loop: Any) -> None:
        self.final = self.measure(self.run.state.step) if self.run.main else {}

    def summary(self) -> dict[str, Any]:
        return {"step0": self.step0, "final": self.final}
