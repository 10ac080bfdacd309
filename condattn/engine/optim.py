"""Optimizer and schedule from `cfg.optim` (transformers' schedule factory)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler


def param_groups(model: nn.Module, weight_decay: float, lr: float | None = None,
                 lr_multipliers: dict[str, float] | None = None) -> list[dict]:
    """Decay weight matrices only: biases, norms, embeddings' 1-D params and position embeddings are not
    decayed (the DeiT/timm convention).

    `lr_multipliers` {name substring: factor} (optim.lr_multipliers; DETR: {"model.backbone.": 0.1} gives the backbone
    lr 1e-5 beside 1e-4): a parameter whose name contains a key (the first that matches) trains at lr × factor, in
    groups of their own after the two plain ones (whose layout is unchanged, so earlier checkpoints still load)."""
    mults = {str(k): float(v) for k, v in (lr_multipliers or {}).items()}
    groups: dict[tuple[float, bool], list] = {(1.0, True): [], (1.0, False): []}
    used: set[str] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = next((k for k in mults if k in name), None)
        used.update([key] if key is not None else [])
        mult = mults[key] if key is not None else 1.0
        decay = not (p.ndim <= 1 or "pos_embed" in name or "position_embeddings" in name)
        groups.setdefault((mult, decay), []).append(p)
    unused = [k for k in mults if k not in used]
    if unused:  # a typo would silently train everything at the base lr
        raise ValueError(f"optim.lr_multipliers key(s) {unused} match no trainable parameter name (e.g. "
                         f"{next(iter(dict(model.named_parameters())), '?')!r})")
    out = []
    for (mult, decay), params in groups.items():
        if mult != 1.0 and not params:
            continue
        g = {"params": params, "weight_decay": weight_decay if decay else 0.0}
        if mult != 1.0:
            if lr is None:
                raise ValueError("param_groups: lr_multipliers need the base lr")
            g["lr"] = lr * mult
        out.append(g)
    return out


def scaled_lr(cfg: Any, global_batch: int) -> float:
    lr = float(cfg.optim.lr)
    if cfg.optim.get("lr_ref_batch"):
        lr *= global_batch / float(cfg.optim.lr_ref_batch)
    return lr


OPTIMIZERS = ("adamw",)
# Schedules of ours, on top of transformers' names: lr factor as a function of training progress p in [0, 1]
# (step / steps, or the wall-clock budget's fraction when task.budget_hours is set: condattn/engine/budget.py).
PROGRESS_SCHEDULES = ("budget_triangle",)  # cramming bert-o4's `budget-triangle2`
# Schedules of ours that count optimizer steps: `multistep` = linear warmup over the warmup steps (optim.warmup_steps,
# or optim.warmup_ratio × task.steps) from optim.warmup_start_factor × lr (mmcv's `warmup='linear'` with its
# warmup_ratio), then × optim.gamma at each of optim.milestones (optimizer steps; mmdet's `policy='step'`, DETR's
# StepLR)
STEP_SCHEDULES = ("multistep",)


def multistep_factor(step: int, milestones: list[int], gamma: float = 0.1, warmup_steps: int = 0,
                     warmup_start_factor: float = 0.0) -> float:
    """lr factor of the `multistep` schedule at optimizer step `step` (0-based: the factor of the next update)."""
    f = float(gamma) ** sum(1 for m in milestones if step >= int(m))
    if warmup_steps and step < warmup_steps:
        f *= 1.0 - (1.0 - step / warmup_steps) * (1.0 - float(warmup_start_factor))
    return f


def schedule_problems(o: Any, total_steps: int) -> list[str]:
    """What is wrong with the `multistep` keys of `cfg.optim` (empty for other schedules)."""
    if o.get("schedule") != "multistep":
        return []
    ms = o.get("milestones")
    try:
        ms = [int(m) for m in ms] if ms is not None else None
    except (TypeError, ValueError):
        ms = None
    if ms is None or ms != sorted(ms) or any(m < 1 or m > total_steps for m in ms):
        return [f"optim.milestones={o.get('milestones')!r}: the multistep schedule needs increasing optimizer steps "
                f"within task.steps={total_steps}, e.g. "
                f"optim.milestones=[{total_steps * 3 // 4},{total_steps * 11 // 12}]"]
    gamma = o.get("gamma", 0.1)
    if not isinstance(gamma, (int, float)) or not 0 < float(gamma) <= 1:
        return [f"optim.gamma={gamma!r} must be a number in (0, 1]"]
    return []


def build_optimizer(model: nn.Module, cfg: Any, global_batch: int, total_steps: int,
                    progress: Callable[[int], float] | None = None, fused: bool = False):
    """AdamW over `param_groups` and the schedule `cfg.optim.schedule`. `progress(step) -> [0, 1]` drives the
    PROGRESS_SCHEDULES (default step / total_steps); transformers' schedules count steps. `fused`: torch's fused
    AdamW kernel (CUDA; the same update up to float rounding)."""
    o = cfg.optim
    if o.name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {o.name!r}; known: {', '.join(OPTIMIZERS)}")
    lr = scaled_lr(cfg, global_batch)
    mults = o.get("lr_multipliers")
    groups = param_groups(model, float(o.weight_decay), lr, dict(mults) if mults else None)
    opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(o.betas), eps=o.eps, **({"fused": True} if fused else {}))
    if o.schedule in STEP_SCHEDULES:
        problems = schedule_problems(o, total_steps)
        if problems:
            raise ValueError(problems[0])
        ms, gamma = [int(m) for m in o.milestones], float(o.get("gamma", 0.1))
        warm = round(float(o.warmup_ratio) * total_steps) if o.get("warmup_ratio") else int(o.warmup_steps or 0)
        start = float(o.get("warmup_start_factor") or 0.0)

        def factor(step: int) -> float:  # a plain function: LambdaLR's state_dict stores nothing for it
            return multistep_factor(step, ms, gamma, warm, start)

        return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
    if o.schedule in PROGRESS_SCHEDULES:
        from .budget import budget_triangle

        prog = progress or (lambda step: min(step / max(total_steps, 1), 1.0))
        # a plain function (not a callable object), so LambdaLR's state_dict stores no lambda state
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: budget_triangle(prog(step)))
        return opt, sched
    warmup = round(float(o.warmup_ratio) * total_steps) if o.get("warmup_ratio") else int(o.warmup_steps)
    sched = get_scheduler(o.schedule, opt, num_warmup_steps=warmup, num_training_steps=total_steps)
    return opt, sched
