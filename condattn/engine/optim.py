"""Optimizer and schedule from `cfg.optim` (transformers' schedule factory)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay weight matrices only: biases, norms, embeddings' 1-D params and position embeddings are not
    decayed (the DeiT/timm convention)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or "pos_embed" in name or "position_embeddings" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def scaled_lr(cfg: Any, global_batch: int) -> float:
    lr = float(cfg.optim.lr)
    if cfg.optim.get("lr_ref_batch"):
        lr *= global_batch / float(cfg.optim.lr_ref_batch)
    return lr


OPTIMIZERS = ("adamw",)
# Schedules of ours, on top of transformers' names: lr factor as a function of training progress p in [0, 1]
# (step / steps, or the wall-clock budget's fraction when task.budget_hours is set: condattn/engine/budget.py).
PROGRESS_SCHEDULES = ("budget_triangle",)  # cramming bert-o4's `budget-triangle2`


def build_optimizer(model: nn.Module, cfg: Any, global_batch: int, total_steps: int,
                    progress: Callable[[int], float] | None = None):
    """AdamW over `param_groups` and the schedule `cfg.optim.schedule`. `progress(step) -> [0, 1]` drives the
    PROGRESS_SCHEDULES (default step / total_steps); transformers' schedules count steps."""
    o = cfg.optim
    if o.name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {o.name!r}; known: {', '.join(OPTIMIZERS)}")
    opt = torch.optim.AdamW(
        param_groups(model, float(o.weight_decay)), lr=scaled_lr(cfg, global_batch), betas=tuple(o.betas), eps=o.eps
    )
    if o.schedule in PROGRESS_SCHEDULES:
        from .budget import budget_triangle

        prog = progress or (lambda step: min(step / max(total_steps, 1), 1.0))
        # a plain function (not a callable object), so LambdaLR's state_dict stores no lambda state
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: budget_triangle(prog(step)))
        return opt, sched
    sched = get_scheduler(o.schedule, opt, num_warmup_steps=int(o.warmup_steps), num_training_steps=total_steps)
    return opt, sched
