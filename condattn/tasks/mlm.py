"""Masked language modelling (crammed BERT pretraining, cramming's `bert-o4` objective).

A batch from the `mlm_text` data is {input_ids (B, N), attention_mask (B, N) 1 = token, special_tokens_mask (B, N)
True = [CLS]/[SEP]/[PAD]/[MASK]/[UNK], mask_token_id (B,), tokenizer_size (B,), sample_index (B,)}: the token ids the
masking needs travel with the batch, because they come from the tokenizer the data builder trained or loaded.

Masking (BERT's rule, as cramming's `masked-lm` objective with `use_80_20_rule: True`): every position that is a
real, non-special token is selected with probability `task.mlm_probability` (0.25 in bert-o4); of the selected,
`mask_fraction` (0.8) become [MASK], `random_fraction` (0.1) a uniformly drawn token id of the tokenizer's
vocabulary (as transformers' DataCollatorForLanguageModeling, special ids included), the rest stay unchanged. Special
tokens and padding are never selected. The labels are the original ids at selected positions and -100 elsewhere;
the model's sparse decoder then runs on the selected positions only.

- Training masks are drawn on the device from the global RNG at every step (dynamic masking, as cramming's collator
  does per batch). accelerate's checkpoints store the RNG state, so a resumed run masks exactly as an uninterrupted
  one.
- Evaluation masks are a fixed function of (task.eval_seed, the sample's index in its split): the same positions at
  every evaluation, for every method and for any number of processes or batch size, so validation losses compare.
- Training loss: mean cross-entropy over the micro-batch's masked tokens (the trainer averages micro-batches of a
  global batch with equal weight, as cramming does: loss / accumulation steps).
- Evaluation: token-weighted over the whole split: per sample the NLL sum, the masked count and the correct
  predictions are gathered across processes with `gather_for_metrics` (duplicates from uneven sharding dropped),
  then summed: loss = Σ NLL / Σ masked, acc = masked-token accuracy, ppl = exp(loss), n = masked tokens counted.

Selection metric: `loss`, lower is better (`metric` / `higher_is_better`, read by the trainer).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..utils.typed_config import task_config
from .base import TokenLossTask

IGNORE_INDEX = -100


def mask_tokens(
    input_ids: torch.Tensor, maskable: torch.Tensor, mask_token_id: torch.Tensor | int,
    tokenizer_size: torch.Tensor | int, uniform: torch.Tensor, p: float = 0.25, mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked input ids, labels) from `uniform` (B, N, 3) draws in [0, 1): draw 0 selects (< p, where `maskable`),
    draw 1 splits the selected into [MASK] (< mask_fraction) / random token (< mask_fraction + random_fraction) /
    unchanged, draw 2 picks the random token (floor(u · tokenizer_size)). mask_token_id / tokenizer_size: ints or
    per-sample (B,) tensors. No host synchronisation."""
    u = uniform.to(input_ids.device)
    selected = maskable & (u[..., 0] < p)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    to_mask = selected & (u[..., 1] < mask_fraction)
    to_random = selected & ~to_mask & (u[..., 1] < mask_fraction + random_fraction)
    mask_id = torch.as_tensor(mask_token_id, device=input_ids.device).reshape(-1, 1)
    size = torch.as_tensor(tokenizer_size, device=input_ids.device).reshape(-1, 1)
    random_ids = (u[..., 2] * size).long().clamp_max(size - 1)
    ids = torch.where(to_mask, mask_id.expand_as(input_ids), input_ids)
    ids = torch.where(to_random, random_ids, ids)
    return ids, labels


def maskable_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Real, non-special tokens: the only positions MLM may select."""
    keep = torch.ones_like(batch["input_ids"], dtype=torch.bool)
    if batch.get("attention_mask") is not None:
        keep &= batch["attention_mask"].bool()
    if batch.get("special_tokens_mask") is not None:
        keep &= ~batch["special_tokens_mask"].bool()
    return keep


class MLMTask(TokenLossTask):

    def __init__(self, cfg: Any):
        self.cfg = cfg
        t = task_config(cfg)
        self.p = float(t.mlm_probability)
        self.mask_fraction = float(t.mask_fraction)
        self.random_fraction = float(t.random_fraction)
        self.eval_seed = int(t.eval_seed)
        fractions_ok = self.mask_fraction >= 0 and self.random_fraction >= 0 and \
            self.mask_fraction + self.random_fraction <= 1.0
        if not (0.0 < self.p < 1.0 and fractions_ok):
            raise ValueError("MLM masking: need 0 < task.mlm_probability < 1 and mask_fraction + random_fraction <= 1, "
                             f"got {self.p}, {self.mask_fraction}, {self.random_fraction}")

    # -------------------------------------------------------------------------------- masking

    def mask(self, batch: dict[str, torch.Tensor], uniform: torch.Tensor) -> dict[str, torch.Tensor]:
        ids, labels = mask_tokens(batch["input_ids"], maskable_positions(batch), batch["mask_token_id"],
                                  batch["tokenizer_size"], uniform, self.p, self.mask_fraction, self.random_fraction)
        return {"input_ids": ids, "attention_mask": batch.get("attention_mask"), "labels": labels}

    def train_uniform(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Fresh draws from the global RNG of the batch's device (checkpointed by accelerate)."""
        return torch.rand(*batch["input_ids"].shape, 3, device=batch["input_ids"].device)

    def eval_uniform(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Draws fixed by (eval_seed, sample_index): one CPU generator per sample."""
        n = batch["input_ids"].shape[1]
        rows = []
        for idx in batch["sample_index"].tolist():
            g = torch.Generator().manual_seed(self.eval_seed * 1_000_003 + int(idx))
            rows.append(torch.rand(n, 3, generator=g))
        return torch.stack(rows)

    # -------------------------------------------------------------------------------- model

    @staticmethod
    def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The MLM model on a batch: sparse logits (M, V) when the batch has `labels` (and the model predicts
        sparsely), dense (B, N, V) otherwise (the diagnostics' forward)."""
        return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                     labels=batch.get("labels"))

    @classmethod
    def _scores(cls, model: nn.Module, masked: dict[str, torch.Tensor]):
        """(nll, correct, row) per masked token (row = its sample in the batch)."""
        labels = masked["labels"]
        selected = labels != IGNORE_INDEX
        logits = cls.forward(model, masked)
        if logits.dim() == 3:  # a dense model: keep the masked positions
            logits = logits[selected]
        target = labels[selected]
        logits = logits.float()
        nll = F.cross_entropy(logits, target, reduction="none")
        return nll, logits.argmax(-1) == target, torch.nonzero(selected)[:, 0]

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        nll, correct, _ = self._scores(model, self.mask(batch, self.train_uniform(batch)))
        n = max(nll.numel(), 1)
        return nll.sum() / n, {"acc": (correct.float().sum() / n).detach()}

    # evaluation (Task.evaluate): token-weighted over the whole split from per-sample sums, fixed masks
    def eval_batch(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        nll, right, rows = self._scores(model, self.mask(batch, self.eval_uniform(batch)))
        b, dev = batch["input_ids"].shape[0], nll.device
        return (torch.zeros(b, dtype=torch.float64, device=dev).index_add_(0, rows, nll.double()),
                torch.zeros(b, dtype=torch.long, device=dev).index_add_(0, rows, torch.ones_like(rows)),
                torch.zeros(b, dtype=torch.long, device=dev).index_add_(0, rows, right.long()))
