"""Sequence / image classification: cross-entropy, accuracy (LRA tasks, ImageNet-style tasks)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k != "labels"}


class ClassificationTask:
    higher_is_better = True
    metric = "acc"

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @staticmethod
    def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = model_inputs(batch)
        if "pixel_values" in inputs:  # timm models take the image tensor positionally
            return model(inputs["pixel_values"])
        return model(**inputs)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        logits = self.forward(model, batch)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        acc = (logits.argmax(-1) == batch["labels"]).float().mean()
        return loss, {"acc": acc.detach()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader, accelerator) -> dict[str, float]:
        """Accuracy and mean loss over the whole split, gathered across processes (duplicates from
        uneven sharding dropped by `gather_for_metrics`)."""
        was_training = model.training
        model.eval()
        correct, total, loss_sum = 0, 0, 0.0
        for batch in loader:
            logits = self.forward(model, batch).float()
            losses = F.cross_entropy(logits, batch["labels"], reduction="none")
            pred, labels, losses = accelerator.gather_for_metrics((logits.argmax(-1), batch["labels"], losses))
            correct += int((pred == labels).sum())
            total += labels.numel()
            loss_sum += float(losses.sum())
        model.train(was_training)
        return {"acc": correct / max(total, 1), "loss": loss_sum / max(total, 1), "n": total}
