"""The interface every task implements, and the evaluation scaffolding they share.

A task says how a batch goes through the model (`forward`), its training loss (`loss`), and how a split is scored
(`evaluate`), and declares its selection metric: `metric` (a key of `evaluate`'s result) and `higher_is_better`
(the trainer keeps the best validation value in that direction and tests those weights).

`evaluate` is written once here: eval mode and no gradients for the whole split (the model's train/eval mode is
restored afterwards), per batch the values `eval_batch` returns gathered across processes with accelerate's
`gather_for_metrics` (it drops the duplicates of uneven sharding), folded into running totals by `eval_update`,
and turned into the metrics by `eval_result`. A task whose evaluation is not per-sample values (detection: COCO
results scored once on rank 0) overrides `evaluate` and uses `evaluation_mode`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """model.eval() and torch.no_grad() inside; the model's previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


class Task(ABC):
    metric: str  # the selection metric: a key of evaluate()'s result
    higher_is_better: bool

    @abstractmethod
    def forward(self, model: nn.Module, batch: Any) -> Any:
        """The model's output on a batch as evaluation and the diagnostics probes run it."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """Training loss of one micro-batch, and detached values to log (`acc` when the task has one)."""

    # ------------------------------------------------------------------ evaluation (the shared scaffolding)
    def evaluate(self, model: nn.Module, loader: Any, accelerator: Any) -> dict[str, float]:
        """The metrics of a whole split (`n`: what they were counted over)."""
        totals = self.eval_start()
        with evaluation_mode(model):
            for batch in loader:
                self.eval_update(totals, accelerator.gather_for_metrics(self.eval_batch(model, batch)))
        return self.eval_result(totals)

    def eval_start(self) -> dict[str, Any]:
        """The running totals of an evaluation."""
        return {}

    def eval_batch(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, ...]:
        """Per-sample values of one batch to gather across processes (first dimension: the samples)."""
        raise NotImplementedError(f"{type(self).__name__} overrides evaluate()")

    def eval_update(self, totals: dict[str, Any], gathered: tuple[torch.Tensor, ...]) -> None:
        """Fold one batch's gathered values into the totals."""
        raise NotImplementedError(f"{type(self).__name__} overrides evaluate()")

    def eval_result(self, totals: dict[str, Any]) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} overrides evaluate()")


class TokenLossTask(Task):
    """A task scored by token-weighted loss and accuracy over the whole split (causal LM, MLM): `eval_batch` returns
    per-sample (summed nll, counted tokens, correct tokens); the result is loss, accuracy and perplexity."""

    metric = "loss"
    higher_is_better = False

    def eval_start(self) -> dict[str, Any]:
        return {"nll_sum": 0.0, "correct": 0, "total": 0}

    def eval_update(self, totals: dict[str, Any], gathered: tuple[torch.Tensor, ...]) -> None:
        s, c, r = gathered
        totals["nll_sum"] += float(s.sum())
        totals["total"] += int(c.sum())
        totals["correct"] += int(r.sum())

    def eval_result(self, totals: dict[str, Any]) -> dict[str, float]:
        total = totals["total"]
        loss = totals["nll_sum"] / max(total, 1)
        return {"loss": loss, "acc": totals["correct"] / max(total, 1),
                "ppl": math.exp(loss) if loss < 700 else math.inf, "n": total}
