"""The medium claim's projected GPU time, planned on a CPU (`DRY_RUN=1 bash scripts/gpu_check.sh --medium-claim` on a
machine without CUDA), where a warm-up step of the full model takes seconds per seed and says nothing of a GPU.

A step of every seed of both arms is projected as the longer of two times, as an asynchronous GPU runs it:
- the device's compute: the step's counted FLOPs at an H200's bf16 peak × a reference MFU. The reference is a public
  measurement of the same model family, recomputed with this harness's FLOP counter: timm's training benchmark of
  `vit_tiny_patch16_224` on an RTX 3090 (AMP, batch 512; timm's results/benchmark-train-amp-nchw-pt112-cu113-rtx3090
  .csv), whose throughput divided by that card's dense fp16 peak is its MFU. A model this small on a larger GPU
  likely reaches less, so this half is optimistic;
- the host's time: the aten ops one training step dispatches (counted here, forward, backward and optimiser) × an
  assumed 10 µs per op, eager PyTorch's usual host cost per op on a GPU machine: what a GPU waits on when every
  kernel is small. Counted, not timed: a timing on a shared CPU says more about its load than about a GPU host.
The GPU run times its own warm-up and replaces this projection before it trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# timm's published training throughput (img/s) of vit_tiny_patch16_224 at 224², AMP, batch 512, torch 1.12 / CUDA 11.3
REFERENCE = {"model": "vit_tiny_patch16_224", "img_size": 224, "samples_per_s": 2293.54, "device": "NVIDIA RTX 3090",
             "precision": "fp16", "source": "timm results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"}
TARGET = "NVIDIA H200"
# assumed: eager PyTorch's host cost per dispatched op on a GPU machine (Python, dispatcher, kernel launch)
HOST_S_PER_OP = 10e-6


@dataclass(frozen=True)
class Projection:
    """Seconds per step of every seed of both arms (`device_s` compute, `host_s` per mode), evaluation seconds, and
    the reference MFU they assume."""

    device_s: float
    host_s: dict[str, float]
    evals_s: float
    mfu: float
    ops: dict[str, int]

    def step_s(self, mode: str) -> float:
        return max(self.device_s, self.host_s[mode])

    @property
    def mode(self) -> str:
        return min(self.host_s, key=self.step_s)

    def total_s(self, steps: int) -> float:
        """B and 2B steps (3B in all) and four evaluations per seed."""
        return 3 * steps * self.step_s(self.mode) + self.evals_s


def reference_mfu() -> float:
    """MFU of the reference measurement: its counted training FLOPs per image × images/s ÷ the card's dense peak."""
    import timm

    from .engine.flops import peak_flops, training_step_flops

    r = REFERENCE
    model = timm.create_model(r["model"], pretrained=False)
    x, y = torch.zeros(1, 3, r["img_size"], r["img_size"]), torch.zeros(1, dtype=torch.long)
    flops = training_step_flops(model, lambda m: F.cross_entropy(m(x), y))
    return flops * r["samples_per_s"] / peak_flops(r["device"], r["precision"])


class _OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched (forward, backward and optimiser: what the host issues to the device)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(group_cls, model_cfg: dict, rc: dict, arm: str, seeds: list[int], mode: str) -> int:
    """The aten ops one training step of every seed of `arm` dispatches (counted at one image per seed: the count
    does not depend on the batch)."""
    data = {"train": (torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))}
    group = group_cls(model_cfg, {**rc, "batch": 1}, arm, seeds, 10, data, torch.device("cpu"), mode)
    group.train_step()  # the optimiser's state is created on the first step
    with _OpCount() as count:
        group.train_step()
    return count.n


def project(group_cls, model_cfg: dict, rc: dict, arms: list[str], seeds: list[int], flops: dict[str, float],
            n_test: int, modes: list[str]) -> Projection:
    """The projection of one step and the evaluations from the arms' counted training FLOPs per image."""
    from .engine.flops import peak_flops

    mfu = reference_mfu()
    rate = mfu * peak_flops(TARGET, "bf16")
    device_s = sum(flops.values()) * len(seeds) * rc["batch"] / rate
    evals_s = 4 * len(seeds) * n_test * sum(flops.values()) / 3 / rate  # forward only: a third of a training step
    ops = {m: sum(ops_per_step(group_cls, model_cfg, rc, a, seeds, m) for a in arms) for m in modes}
    return Projection(device_s, {m: n * HOST_S_PER_OP for m, n in ops.items()}, evals_s, mfu, ops)


def lines(p: Projection, steps: int, budget_s: float) -> list[str]:
    """What the dry run prints: each part of the projection with where it comes from, then the total."""
    r = REFERENCE
    host = ", ".join(f"{m} {p.host_s[m]:.4f} s ({p.ops[m]} ops)" for m in p.host_s)
    total = p.total_s(steps)
    over = f"; over --budget-s {budget_s:.0f}: the GPU run would refuse it" if total > budget_s else ""
    return [
        f"[medium-claim] projected GPU time (an estimate, not a measurement; the GPU run times its own warm-up): "
        f"{total:.0f} s on an {TARGET.removeprefix('NVIDIA ')} for B = {steps} and 2B = {2 * steps} steps, mode "
        f"{p.mode}{over}",
        f"[medium-claim]   compute {p.device_s:.4f} s per step of every seed of both arms: counted FLOPs at the "
        f"H200's bf16 peak × MFU {100 * p.mfu:.1f} %, the MFU of {r['model']} training on an "
        f"{r['device'].removeprefix('NVIDIA ')} ({r['samples_per_s']} img/s, {r['source']}; likely optimistic for "
        "this smaller model on a larger GPU)",
        f"[medium-claim]   host {host} per step (the aten ops of one step of every seed of both arms, "
        f"counted here, × an assumed {HOST_S_PER_OP * 1e6:.0f} µs each); evaluation {p.evals_s:.0f} s; "
        "start-up not included",
    ]


def fitting_steps(p: Projection, budget_s: float) -> int:
    """The largest multiple of 100 steps (at least 100) whose projection fits 90 % of the budget."""
    return max(100, int((0.9 * budget_s - p.evals_s) / (3 * p.step_s(p.mode))) // 100 * 100)
