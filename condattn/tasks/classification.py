"""Sequence / image classification: cross-entropy, accuracy (LRA tasks, ImageNet-style tasks).

The ImageNet recipes add, all optional and off unless the task config sets them (the LRA tasks set none):
- `task.mixup` ({mixup_alpha, cutmix_alpha, prob, switch_prob, mode}): timm's `Mixup` on each training
  micro-batch, with soft targets and timm's `SoftTargetCrossEntropy` (label smoothing folded into the targets);
- `task.label_smoothing` (> 0): the smoothing of the soft targets, or timm's `LabelSmoothingCrossEntropy`
  when there is no mixup;
- `task.top5: true`: top-5 accuracy in the evaluation.
Evaluation is always plain cross-entropy against the true labels (as timm's validate.py does).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..utils.typed_config import task_config
from .base import Task


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k != "labels"}


class ClassificationTask(Task):
    higher_is_better = True
    metric = "acc"

    def __init__(self, cfg: Any):
        self.cfg = cfg
        t = task_config(cfg)
        self.label_smoothing = float(t.label_smoothing)
        self.top5 = bool(t.top5)
        self.mixup = None
        mix = t.mixup
        if mix is not None and (float(mix.mixup_alpha) > 0 or float(mix.cutmix_alpha) > 0):
            from timm.data import Mixup

            num_classes = t.num_classes
            if not num_classes:
                raise ValueError("task.mixup needs task.num_classes (the soft targets' width)")
            self.mixup = Mixup(
                mixup_alpha=float(mix.mixup_alpha), cutmix_alpha=float(mix.cutmix_alpha), prob=float(mix.prob),
                switch_prob=float(mix.switch_prob), mode=str(mix.mode), label_smoothing=self.label_smoothing,
                num_classes=int(num_classes),
            )

    @staticmethod
    def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = model_inputs(batch)
        if "pixel_values" in inputs:  # timm models take the image tensor positionally
            return model(inputs["pixel_values"])
        return model(**inputs)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Training loss of one micro-batch. `acc` is measured against the true (unmixed) labels."""
        labels = batch["labels"]
        if self.mixup is not None:
            from timm.loss import SoftTargetCrossEntropy

            x = batch["pixel_values"]
            if x.shape[0] % 2:
                raise ValueError(f"mixup/cutmix needs an even micro-batch, got {x.shape[0]}; "
                                 "change impl.micro_batch_size")
            x, soft = self.mixup(x.clone(), labels)  # timm mixes in place; keep the caller's batch intact
            logits = self.forward(model, {**batch, "pixel_values": x})
            loss = SoftTargetCrossEntropy()(logits.float(), soft)
        else:
            logits = self.forward(model, batch)
            if self.label_smoothing > 0:
                from timm.loss import LabelSmoothingCrossEntropy

                loss = LabelSmoothingCrossEntropy(smoothing=self.label_smoothing)(logits.float(), labels)
            else:
                loss = F.cross_entropy(logits.float(), labels)
        acc = (logits.argmax(-1) == labels).float().mean()
        return loss, {"acc": acc.detach()}

    # evaluation (Task.evaluate): accuracy (top-1, and top-5 when task.top5) and mean loss over the whole split
    def eval_start(self) -> dict[str, Any]:
        return {"correct": 0, "correct5": 0, "total": 0, "loss_sum": 0.0}

    def eval_batch(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits = self.forward(model, batch).float()
        losses = F.cross_entropy(logits, batch["labels"], reduction="none")
        if not self.top5:
            return logits.argmax(-1), batch["labels"], losses
        k = min(5, logits.shape[-1])
        in5 = (logits.topk(k, dim=-1).indices == batch["labels"][:, None]).any(-1)
        return logits.argmax(-1), batch["labels"], losses, in5

    def eval_update(self, totals: dict[str, Any], gathered: tuple[torch.Tensor, ...]) -> None:
        pred, labels, losses = gathered[:3]
        if self.top5:
            totals["correct5"] += int(gathered[3].sum())
        totals["correct"] += int((pred == labels).sum())
        totals["total"] += labels.numel()
        totals["loss_sum"] += float(losses.sum())

    def eval_result(self, totals: dict[str, Any]) -> dict[str, float]:
        total = totals["total"]
        out = {"acc": totals["correct"] / max(total, 1), "loss": totals["loss_sum"] / max(total, 1), "n": total}
        if self.top5:
            out["top5"] = totals["correct5"] / max(total, 1)
        return out
