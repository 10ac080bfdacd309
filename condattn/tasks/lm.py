"""Causal language modelling (table 5, GPT-2 on TinyStories): next-token cross-entropy, validation loss and perplexity.

A batch is {input_ids (B, N), attention_mask (B, N)} (1 = real token; packed blocks have none, the last validation
block is right-padded). Position t predicts token t + 1 inside its block; a prediction counts when both its context
token and its target are real, so padding never enters the loss or the metrics.

- Training loss: mean NLL over the micro-batch's counted predictions. Training blocks are all full (the data drops
  the last partial block), so every micro-batch holds the same number of predictions and the trainer's average over
  accumulation steps is exactly the token-weighted mean of the global batch.
- Evaluation: token-weighted over the whole split. Per block the NLL sum, the count and the correct next-token
  predictions are gathered across processes with `gather_for_metrics` (duplicates from uneven sharding dropped), as
  the classification task gathers per-sample values, then summed: loss = Σ NLL / Σ count, ppl = exp(loss),
  acc = next-token accuracy, n = predictions counted.

The selection metric is `loss`, lower is better (`metric` / `higher_is_better` below, read by the trainer): the run
summary records `val_loss` (the lowest validation loss over the evaluations), `final_val_loss`, `final_val_ppl` and
`final_val_acc`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import TokenLossTask


def next_token_stats(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nll, counted, correct), each (B, N − 1): the fp32 NLL of token t + 1 given tokens ≤ t, whether that
    prediction counts (context and target both real), and whether the arg-max prediction is right."""
    target = input_ids[:, 1:]
    lg = logits[:, :-1].float()
    nll = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), target.reshape(-1), reduction="none").view_as(target)
    if attention_mask is None:
        counted = torch.ones_like(target, dtype=torch.bool)
    else:
        m = attention_mask.bool()
        counted = m[:, 1:] & m[:, :-1]
    return nll, counted, lg.argmax(-1) == target


class LMTask(TokenLossTask):
    def __init__(self, cfg: Any):
        self.cfg = cfg

    @staticmethod
    def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits (B, N, V) of a transformers causal LM (or a module returning them directly)."""
        out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
        return out.logits if hasattr(out, "logits") else out

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        nll, counted, correct = next_token_stats(self.forward(model, batch), batch["input_ids"],
                                                 batch.get("attention_mask"))
        w = counted.float()
        n = w.sum().clamp_min(1.0)
        return (nll * w).sum() / n, {"acc": ((correct.float() * w).sum() / n).detach()}

    # evaluation (Task.evaluate): token-weighted over the whole split from per-block sums
    def eval_batch(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        nll, counted, right = next_token_stats(self.forward(model, batch), batch["input_ids"],
                                               batch.get("attention_mask"))
        w = counted.float()
        return (nll * w).sum(1).double(), counted.sum(1), (right & counted).sum(1)

    def eval_result(self, totals: dict[str, Any]) -> dict[str, float]:
        r = super().eval_result(totals)  # in the key order earlier summaries were written with
        return {k: r[k] for k in ("loss", "ppl", "acc", "n")}
