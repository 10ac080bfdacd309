"""Optimizer and schedule from `cfg.optim` (transformers' schedule factory)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler

from ..utils.typed_config import optim_config


def no_decay(name: str, p: torch.Tensor, names: list[str] | None) -> bool:
    """Whether a parameter is exempt from weight decay. `names` None: 1-D parameters (biases, norms) and position
    embeddings (the default rule). `names` a list (optim.no_decay_names, a recipe's model `no_weight_decay()`): timm's
    rule (timm.optim param_groups_weight_decay): 1-D parameters, biases and those names, matched as fnmatch patterns
    against the full name or any dotted suffix of it (`cls_token` matches `model.cls_token`, not `cls_token_proj`)."""
    if names is None:
        return p.ndim <= 1 or "pos_embed" in name or "position_embeddings" in name
    if p.ndim <= 1 or name.endswith(".bias"):
        return True
    return any(fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(name, "*." + pat) for pat in names)


def param_groups(model: nn.Module, weight_decay: float, lr: float | None = None,
                 lr_multipliers: dict[str, float] | None = None, no_decay_names: list[str] | None = None) -> list[dict]:
    """Decay weight matrices only: biases, norms, embeddings' 1-D params and position embeddings are not
    decayed; or, with `no_decay_names`, timm's rule with those names (see `no_decay`).

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
        decay = not no_decay(name, p, no_decay_names)
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
    o = optim_config(cfg.optim)
    lr = float(o.lr)
    if o.lr_ref_batch:
        lr *= global_batch / float(o.lr_ref_batch)
    return lr


OPTIMIZERS = ("adamw", "muon")  # muon: torch.optim.Muon on hidden 2-D weights, AdamW on the rest (engine/muon.py)
# Schedules of ours, on top of transformers' names: lr factor as a function of training progress p in [0, 1]
# (step / steps, or the wall-clock budget's fraction when task.budget_hours is set: condattn/engine/budget.py).
PROGRESS_SCHEDULES = ("budget_triangle",)  # cramming bert-o4's `budget-triangle2`
# Schedules of ours that count optimizer steps: `multistep` = linear warmup over the warmup steps (optim.warmup_steps,
# or optim.warmup_ratio × task.steps) from optim.warmup_start_factor × lr (mmcv's `warmup='linear'` with its
# warmup_ratio), then × optim.gamma at each of optim.milestones (optimizer steps; mmdet's `policy='step'`, DETR's
# StepLR)
# `onecycle` = torch's OneCycleLR as the Nyströmformer LRA code builds it (mlpen/Nystromformer LRA/code/run_tasks.py):
# from lr/25 up over the warmup steps (pct_start = warmup / steps), then down (optim.anneal: linear | cos) to
# lr/25/1e4, cycling AdamW's beta1 between 0.95 and 0.85 inversely (torch's defaults, which that code keeps).
# `timm_cosine` = timm's CosineLRScheduler as the DeiT / Swin / XCiT / DaViT code builds it: linear warmup from
# optim.warmup_lr over the warmup steps, cosine to optim.min_lr, then optim.cooldown_steps at min_lr (DaViT's cooldown
# epochs; default 0); optim.warmup_prefix (Swin: the cosine starts after
# the warmup); optim.steps_per_epoch set = the schedule steps once per epoch (DeiT, XCiT, DaViT: timm's
# scheduler.step(epoch)), null = every optimizer step (Swin's step_update); optim.scale_floors = warmup_lr and min_lr
# are at lr_ref_batch and scale with the batch like lr (Swin's linear scaling of all three). When the warmup or the
# cosine is not a whole number of epochs (the shortened smoke/small recipes), it updates every step.
STEP_SCHEDULES = ("multistep", "onecycle", "timm_cosine")


def multistep_factor(step: int, milestones: list[int], gamma: float = 0.1, warmup_steps: int = 0,
                     warmup_start_factor: float = 0.0) -> float:
    """lr factor of the `multistep` schedule at optimizer step `step` (0-based: the factor of the next update)."""
    f = float(gamma) ** sum(1 for m in milestones if step >= int(m))
    if warmup_steps and step < warmup_steps:
        f *= 1.0 - (1.0 - step / warmup_steps) * (1.0 - float(warmup_start_factor))
    return f


def schedule_problems(o: Any, total_steps: int) -> list[str]:
    """What is wrong with the `multistep` / `onecycle` / `timm_cosine` keys of `cfg.optim` (empty for others)."""
    o = optim_config(o)
    if o.schedule == "onecycle":
        if total_steps < 2:
            return [f"task.steps={total_steps}: the onecycle schedule needs at least 2 steps"]
        if o.anneal not in ("linear", "cos"):
            return [f"optim.anneal={o.anneal!r}: choose linear or cos"]
        return []
    if o.schedule == "timm_cosine":
        if o.min_lr is None or o.warmup_lr is None:
            return ["the timm_cosine schedule needs optim.min_lr and optim.warmup_lr (e.g. 1e-5 and 1e-6, DeiT's)"]
        cool = int(o.cooldown_steps)
        if cool and not 0 < cool < total_steps - _warmup(o, total_steps):
            return [f"optim.cooldown_steps={cool}: must leave room for the warmup and the cosine within "
                    f"task.steps={total_steps}"]
        spe = o.steps_per_epoch
        if spe is not None and int(spe) < 1:
            return [f"optim.steps_per_epoch={spe!r}: a positive number of optimizer steps, or null (every step)"]
        return []
    if o.schedule != "multistep":
        return []
    ms = o.milestones
    try:
        ms = [int(m) for m in ms] if ms is not None else None
    except (TypeError, ValueError):
        ms = None
    if ms is None or ms != sorted(ms) or any(m < 1 or m > total_steps for m in ms):
        return [f"optim.milestones={o.milestones!r}: the multistep schedule needs increasing optimizer steps "
                f"within task.steps={total_steps}, e.g. "
                f"optim.milestones=[{total_steps * 3 // 4},{total_steps * 11 // 12}]"]
    return _multistep_gamma_problems(o)


def _multistep_gamma_problems(o: Any) -> list[str]:
    gamma = optim_config(o).gamma
    if not isinstance(gamma, (int, float)) or not 0 < float(gamma) <= 1:
        return [f"optim.gamma={gamma!r} must be a number in (0, 1]"]
    return []


def build_optimizer(model: nn.Module, cfg: Any, global_batch: int, total_steps: int,
                    progress: Callable[[int], float] | None = None, fused: bool = False):
    """AdamW over `param_groups` (optim=muon: Muon on the hidden 2-D weights, AdamW on the rest, engine/muon.py) and
    the schedule `cfg.optim.schedule`. `progress(step) -> [0, 1]` drives the
    PROGRESS_SCHEDULES (default step / total_steps); transformers' schedules count steps. `fused`: torch's fused
    AdamW kernel (CUDA; the same update up to float rounding)."""
    o = optim_config(cfg.optim)
    if o.name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {o.name!r}; known: {', '.join(OPTIMIZERS)}")
    lr = scaled_lr(cfg, global_batch)
    mults, names = o.lr_multipliers, o.no_decay_names
    groups = param_groups(model, float(o.weight_decay), lr, dict(mults) if mults else None,
                          [str(n) for n in names] if names is not None else None)
    if o.name == "muon":
        from .muon import build_muon

        opt = build_muon(groups, model, lr, o)
    else:
        opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(o.betas), eps=o.eps, **({"fused": True} if fused else {}))
    if o.schedule == "onecycle":
        problems = schedule_problems(o, total_steps)
        if problems:
            raise ValueError(problems[0])
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=total_steps,
            pct_start=_onecycle_pct(_warmup(o, total_steps), total_steps),
            anneal_strategy=str(o.anneal))
        return opt, sched
    if o.schedule == "timm_cosine":
        problems = schedule_problems(o, total_steps)
        if problems:
            raise ValueError(problems[0])
        return opt, timm_cosine(opt, o, total_steps, lr / float(o.lr))
    if o.schedule in STEP_SCHEDULES:
        problems = schedule_problems(o, total_steps)
        if problems:
            raise ValueError(problems[0])
        ms, gamma = [int(m) for m in o.milestones], float(o.gamma)
        warm = _warmup(o, total_steps)
        start = float(o.warmup_start_factor)

        def factor(step: int) -> float:  # a plain function: LambdaLR's state_dict stores nothing for it
            return multistep_factor(step, ms, gamma, warm, start)

        return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
    if o.schedule in PROGRESS_SCHEDULES:
        from .budget import budget_triangle

        prog = progress or (lambda step: min(step / max(total_steps, 1), 1.0))
        # a plain function (not a callable object), so LambdaLR's state_dict stores no lambda state
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: budget_triangle(prog(step)))
        return opt, sched
    warmup = _warmup(o, total_steps)
    sched = get_scheduler(o.schedule, opt, num_warmup_steps=warmup, num_training_steps=total_steps)
    return opt, sched


def _onecycle_pct(warmup: int, total_steps: int) -> float:
    """OneCycleLR's pct_start = warmup / steps. torch ends its phases at pct·steps − 1 and steps − 1, and divides by
    each phase's length, so pct·steps is kept within [1.5, steps − 0.5]: a run shorter than its warmup (tests, smoke
    overrides) still has one step up and one down. Real recipes (warmup ≥ 2 and < steps − 1) are unchanged."""
    return min(max(float(warmup), 1.5), total_steps - 0.5) / total_steps


def _warmup(o: Any, total_steps: int) -> int:
    o = optim_config(o)
    return round(float(o.warmup_ratio) * total_steps) if o.warmup_ratio else int(o.warmup_steps)


def timm_cosine(opt: torch.optim.Optimizer, o: Any, total_steps: int, batch_scale: float = 1.0):
    """timm's CosineLRScheduler (warmup_lr_init, lr_min, warmup_prefix, epoch or step updates), as a LambdaLR over
    optimizer steps: the factor at step s is what timm's scheduler sets at s (its own arithmetic, run on a one-
    parameter optimizer at each group's lr), so the trainer's step() / state_dict stay torch's."""
    from timm.scheduler import CosineLRScheduler

    o = optim_config(o)
    spe = int(o.steps_per_epoch) if o.steps_per_epoch else None
    floors = batch_scale if o.scale_floors else 1.0
    warm, cosine = _warmup(o, total_steps), total_steps - int(o.cooldown_steps)
    if spe and (warm % spe or cosine % spe):  # shortened recipes (smoke/small): not whole epochs, update every step
        spe = None
    unit = spe or 1  # timm counts epochs when it steps per epoch
    factors = []
    for group in opt.param_groups:
        base = float(group["lr"])
        dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
        sched = CosineLRScheduler(
            dummy, t_initial=(cosine - (warm if o.warmup_prefix else 0)) // unit,
            lr_min=float(o.min_lr) * floors, warmup_t=warm // unit, warmup_lr_init=float(o.warmup_lr) * floors,
            warmup_prefix=bool(o.warmup_prefix), t_in_epochs=spe is not None, cycle_limit=1)

        def factor(step: int, sched=sched, dummy=dummy, base=base) -> float:
            if spe:
                sched.step(step // spe)
            else:
                sched.step_update(step)
            return dummy.param_groups[0]["lr"] / base

        factors.append(factor)
    return torch.optim.lr_scheduler.LambdaLR(opt, factors)
