"""GLUE fine-tuning (table 3): sentence(-pair) classification, or regression for STS-B.

Loss: cross-entropy over the classes, mean squared error for regression (num_labels 1), as cramming's
`ScriptableLMForSequenceClassification` (and transformers' BERT heads) do.

Metrics (GLUE's official ones, computed with scikit-learn and SciPy, the implementations Hugging Face's `glue` metric
wraps): accuracy; Matthews correlation (CoLA); F1 of the positive class (MRPC, QQP); Pearson and Spearman
correlation (STS-B). `score` is the task's own metric (data/glue.py GLUE_TASKS; cramming's target metric), ×1 (the
table multiplies by 100). Evaluation gathers predictions across processes (`gather_for_metrics` drops the duplicates
of uneven sharding) and computes each metric once over the whole split.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.glue_tasks import glue_task
from .base import Task


def glue_metrics(pred: np.ndarray, labels: np.ndarray, regression: bool) -> dict[str, float]:
    """The GLUE metrics of one split: regression -> pearson, spearman; classification -> acc, mcc, and f1 when
    binary."""
    if regression:
        from scipy.stats import pearsonr, spearmanr

        if len(pred) < 2 or np.std(pred) == 0 or np.std(labels) == 0:  # correlation undefined: report 0, not NaN
            return {"pearson": 0.0, "spearman": 0.0}
        return {"pearson": float(pearsonr(pred, labels)[0]), "spearman": float(spearmanr(pred, labels)[0])}
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    out = {"acc": float(accuracy_score(labels, pred)), "mcc": float(matthews_corrcoef(labels, pred))}
    if set(np.unique(labels)) <= {0, 1}:
        out["f1"] = float(f1_score(labels, pred, zero_division=0.0))
    return out


class GlueTask(Task):
    higher_is_better = True
    metric = "score"

    def __init__(self, cfg: Any):
        self.spec = glue_task(str(cfg.glue_task))
        self.regression = self.spec.num_labels == 1

    @staticmethod
    def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if self.regression:
            return F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction=reduction)
        return F.cross_entropy(logits.float(), labels, reduction=reduction)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        logits = self.forward(model, batch)
        logs = {} if self.regression else {"acc": (logits.argmax(-1) == batch["labels"]).float().mean().detach()}
        return self._loss(logits, batch["labels"]), logs

    # evaluation (Task.evaluate): the GLUE metrics of the whole split's predictions, and the mean loss
    def eval_start(self) -> dict[str, Any]:
        return {"preds": [], "labels": [], "loss_sum": 0.0}

    def eval_batch(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits = self.forward(model, batch)
        losses = self._loss(logits, batch["labels"], reduction="none")
        pred = logits.float().squeeze(-1) if self.regression else logits.argmax(-1)
        return pred, batch["labels"], losses

    def eval_update(self, totals: dict[str, Any], gathered: tuple[torch.Tensor, ...]) -> None:
        pred, lab, losses = gathered
        totals["preds"].append(pred.cpu())
        totals["labels"].append(lab.cpu())
        totals["loss_sum"] += float(losses.sum())

    def eval_result(self, totals: dict[str, Any]) -> dict[str, float]:
        pred, lab = torch.cat(totals["preds"]).numpy(), torch.cat(totals["labels"]).numpy()
        out = glue_metrics(pred, lab, self.regression)
        out.update(score=out[self.spec.metric], loss=totals["loss_sum"] / max(len(lab), 1), n=len(lab))
        return out
