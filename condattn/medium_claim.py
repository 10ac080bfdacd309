"""One claim settled at medium scale on one GPU (`scripts/gpu_check.sh --medium-claim`): table 1's ViT row, CET
(conditioning=embedded) against the baseline (conditioning=none), on CIFAR-100, N seeds per arm, each trained at a
budget of B steps and again at 2B, so that Δ(B) and Δ(2B) can be compared.

The model is the medium scale's ViT (configs/scale_recipe/imagenet_vit_medium.yaml over configs/model/vit_tiny_32.yaml,
built by condattn's model builder, conditioned by `condattn.apply_conditioning`), trained fast: the whole dataset sits
on the device as uint8, augmentation (random crop with 4-px zero padding, horizontal flip) runs there as batched tensor
ops, bf16 autocast on CUDA, and the seeds of an arm train either one after another (`loop`) or at once (`vmap`:
torch.func over stacked parameters). The optimiser is the medium recipe's (AdamW, lr, betas, weight decay, label
smoothing, drop-path; warm-up over 10 % of the steps, then cosine to its min_lr, per step); RandAugment, mixup, CutMix
and random erasing are left out (crop + flip only), and every arm shares one lr (no lr search at this scale).

`python -m condattn.medium_claim --help`; DRY_RUN=1 (or --dry-run) prints the plan and its projection, trains nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import CONFIG_DIR

ARMS = {"baseline": "none", "CET": "embedded"}
CPU_HEAVY = 200_000  # depth × width × batch above which a CPU warm-up times the loop only, one step
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's defaults, the harness's image transforms


def fail(msg: str) -> SystemExit:
    print(f"medium-claim: {msg}", file=sys.stderr)
    return SystemExit(2)


def recipe(overrides: dict) -> tuple[dict, dict]:
    """(model config, recipe) of the ViT row's medium scale, read from the configs the harness uses."""
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model/vit_tiny_32.yaml"))
    vit = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scale_recipe/imagenet_vit_medium.yaml"))
    shared = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scale_recipe/imagenet_medium.yaml"))
    model.update(vit["model"])
    model.update(shared["model"])
    model.update(img_size=32, num_classes=100, **overrides)
    if overrides:
        model["name"] += " with " + ",".join(f"{k}={v}" for k, v in overrides.items())
    optim, task = shared["optim"], shared["task"]
    return model, {"lr": optim["lr"], "weight_decay": optim["weight_decay"], "betas": tuple(optim["betas"]),
                   "eps": optim["eps"], "warmup_lr": optim["warmup_lr"], "min_lr": optim["min_lr"],
                   "batch": task["batch_size"], "label_smoothing": task["label_smoothing"]}


def load_data(root: str, device: torch.device, planning: bool = False) -> dict:
    """CIFAR-100's train/test splits as uint8 [N, 3, 32, 32] and int64 labels, resident on `device`. `planning` (a
    dry run): without the data, zero images of its sizes (50,000 train / 10,000 test) stand in, said in one line."""
    from .data import cifar

    try:
        splits, checksum, _ = cifar.load(root, 100)
    except FileNotFoundError as e:
        if planning:
            print(f"[medium-claim] CIFAR-100 not found under {root}: planned with its sizes and zero images (the run "
                  "needs it: --data DIR or $CONDATTN_DATA)", flush=True)
            return {"checksum": None, **{split: (torch.zeros(n, 3, 32, 32, dtype=torch.uint8, device=device),
                                                 torch.zeros(n, dtype=torch.long, device=device))
                                         for split, n in (("train", 50_000), ("val", 10_000))}}
        raise fail(f"{e} On a machine without internet: download cifar-100-python.tar.gz elsewhere, copy it here, "
                   f"then `tar xzf cifar-100-python.tar.gz -C {root}`; or pass --data DIR.") from None
    out = {"checksum": checksum}
    for split, (x, y) in splits.items():
        out[split] = (torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(device), torch.from_numpy(y).to(device))
    return out


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random 32×32 crop of the 4-px zero-padded images and a horizontal flip with p = 0.5, on x's device."""
    n, dev = x.shape[0], x.device
    padded = F.pad(x, (4, 4, 4, 4))
    oy, ox = (torch.randint(0, 9, (n,), generator=g, device=dev) for _ in range(2))
    flip = torch.rand(n, generator=g, device=dev) < 0.5
    ar = torch.arange(32, device=dev)
    cols = torch.where(flip[:, None], 31 - ar, ar) + ox[:, None]
    iy, ix = (oy[:, None] + ar)[:, :, None], cols[:, None, :]
    return padded[torch.arange(n, device=dev)[:, None, None], :, iy, ix].permute(0, 3, 1, 2)


def normalise(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN, device=x.device).view(3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(3, 1, 1)
    return (x.float() / 255 - mean) / std


class Stream:
    """One seed's stream of training batches: its own generator for the epoch order and the augmentation."""

    def __init__(self, data: dict, seed: int, batch: int):
        self.x, self.y = data["train"]
        if batch > len(self.y):
            raise fail(f"--batch {batch} exceeds the {len(self.y)} training images; pass a smaller --batch")
        self.batch, self.order, self.pos = batch, None, 0
        self.g = torch.Generator(device=self.x.device)
        self.g.manual_seed(1_000_003 * seed + 17)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.order is None or self.pos + self.batch > len(self.order):  # drop_last epochs
            self.order, self.pos = torch.randperm(len(self.y), generator=self.g, device=self.x.device), 0
        idx = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return normalise(augment(self.x[idx], self.g)), self.y[idx]


def lr_factor(step: int, steps: int, rc: dict) -> float:
    """Linear warm-up from warmup_lr over 10 % of the steps, then cosine to min_lr (× lr, per step)."""
    warm = max(1, steps // 10)
    if step < warm:
        return (rc["warmup_lr"] + (rc["lr"] - rc["warmup_lr"]) * step / warm) / rc["lr"]
    t = (step - warm) / max(1, steps - warm)
    return (rc["min_lr"] + 0.5 * (rc["lr"] - rc["min_lr"]) * (1 + math.cos(math.pi * t))) / rc["lr"]


def build(model_cfg: dict, arm: str, seed: int, device: torch.device) -> torch.nn.Module:
    from . import apply_conditioning
    from .models import build_model

    torch.manual_seed(seed)
    model = build_model(model_cfg)
    apply_conditioning(model, ARMS[arm])
    return model.to(device)


class Group:
    """The seeds of one arm trained together for `steps` steps: one model each (loop), or stacked (vmap)."""

    def __init__(self, model_cfg, rc, arm, seeds, steps, data, device, mode):
        self.rc, self.steps, self.device, self.mode = rc, steps, device, mode
        self.models = [build(model_cfg, arm, s, device) for s in seeds]
        self.streams = [Stream(data, s, rc["batch"]) for s in seeds]
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else \
            torch.autocast("cpu", enabled=False)
        kw = dict(lr=rc["lr"], betas=rc["betas"], eps=rc["eps"], weight_decay=rc["weight_decay"])
        if device.type == "cuda":
            kw["fused"] = True
        if mode == "vmap":
            from torch.func import stack_module_state

            self.params, self.buffers = stack_module_state(self.models)
            self.base = self.models[0]
            self.cet = self._cet_hook(self.base)
            if len(self.base.blocks[0]._forward_pre_hooks) != (self.cet is not None):  # the split forward skips them
                raise RuntimeError(f"--mode vmap: the first block of arm {arm} carries hooks other than CET's; "
                                   "use --mode loop")
            self.opts = [torch.optim.AdamW(list(self.params.values()), **kw)]
        else:
            self.opts = [torch.optim.AdamW(m.parameters(), **kw) for m in self.models]
        self.step_no = 0

    @staticmethod
    def _cet_hook(model):
        """The object apply_conditioning hooked on the first block (CET's correction), or None (baseline). Under
        vmap its data-dependent fallback cannot run, so the vmapped forward applies it between two vmapped halves."""
        for hook in model.blocks[0]._forward_pre_hooks.values():
            owner = getattr(hook, "__self__", None)
            if hasattr(owner, "correct"):
                return owner
        return None

    def _vmapped(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [S, B, classes] of the stacked seeds for inputs x [S, B, 3, 32, 32]."""
        from torch.func import vmap

        m = self.base

        def embed(p, b, x):
            return _half(m, 0, p, b, x)

        def rest(p, b, t):
            return _half(m, 1, p, b, t)

        warnings.filterwarnings("ignore", message=".*batching rule for aten::_scaled_dot_product")  # CPU: slow
        tokens = vmap(embed, randomness="different")(self.params, self.buffers, x)
        if self.cet is not None:
            s, b = tokens.shape[:2]
            tokens = self.cet.correct(tokens.flatten(0, 1)).unflatten(0, (s, b))
        return vmap(rest, randomness="different")(self.params, self.buffers, tokens)

    def train_step(self) -> None:
        f = lr_factor(self.step_no, self.steps, self.rc)
        for opt in self.opts:
            for pg in opt.param_groups:
                pg["lr"] = self.rc["lr"] * f
        batches = [s.next() for s in self.streams]
        ls = self.rc["label_smoothing"]
        if self.mode == "vmap":
            self.base.train()
            x = torch.stack([b[0] for b in batches])
            y = torch.stack([b[1] for b in batches])
            with self.amp:
                logits = self._vmapped(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), label_smoothing=ls) * len(batches)
            self.opts[0].zero_grad(set_to_none=True)
            loss.backward()
            self.opts[0].step()
        else:
            for model, opt, (x, y) in zip(self.models, self.opts, batches):
                model.train()
                with self.amp:
                    loss = F.cross_entropy(model(x).float(), y, label_smoothing=ls)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        self.step_no += 1

    @torch.no_grad()
    def test_acc(self, data: dict, chunk: int = 1000) -> list[float]:
        x, y = data["val"]
        correct = torch.zeros(len(self.models), device=self.device)
        for m in self.models:
            m.eval()
        for i in range(0, len(y), chunk):
            xb, yb = normalise(x[i:i + chunk]), y[i:i + chunk]
            with self.amp:
                if self.mode == "vmap":
                    pred = self._vmapped(xb.expand(len(self.models), *xb.shape)).argmax(-1)
                else:
                    pred = torch.stack([m(xb).argmax(-1) for m in self.models])
            correct += (pred == yb).sum(-1)
        return [round(100.0 * float(c) / len(y), 4) for c in correct]


def _half(m, half: int, p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
    from torch.func import functional_call

    return functional_call(_Half(m, half), ({f"m.{k}": v for k, v in p.items()}, {f"m.{k}": v for k, v in b.items()}),
                           (x,), strict=False)


class _Half(torch.nn.Module):
    """timm VisionTransformer.forward split at the first block's input: half 0 = tokens with positions, half 1 =
    blocks (the first one called without its hooks, CET's correction having been applied between), norm, head."""

    def __init__(self, m, half: int):
        super().__init__()
        self.m, self.half = m, half
        self.training = m.training

    def forward(self, x):
        m = self.m
        if self.half == 0:
            return m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))
        x = m.blocks[0].forward(x)
        for blk in m.blocks[1:]:
            x = blk(x)
        return m.forward_head(m.norm(x))


def step_seconds(model_cfg, rc, arm, seeds, data, device, mode, n: int) -> float:
    """Measured seconds of one training step of the whole group of `seeds` (loop: one seed, × len(seeds))."""
    group = Group(model_cfg, rc, arm, seeds if mode == "vmap" else seeds[:1], max(n + 1, 10), data, device, mode)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    group.train_step()  # untimed: allocation, kernel choice
    sync()
    t = time.perf_counter()
    for _ in range(n):
        group.train_step()
    sync()
    per = (time.perf_counter() - t) / n
    return per if mode == "vmap" else per * len(seeds)


def cpu_plan(model_cfg, rc, arms, args, n_test: int) -> int:
    """The dry run's plan on a CPU, where a warm-up step of the full model takes seconds per seed: the projected GPU
    time from the counted FLOPs and the host's time per step (condattn/medium_projection.py), and the B it fits."""
    from .engine.flops import training_step_flops
    from .medium_projection import fitting_steps, lines, project

    x, y = torch.zeros(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)
    per = {a: training_step_flops(build(model_cfg, a, 0, torch.device("cpu")),
                                  lambda m: F.cross_entropy(m(x), y)) / 2 for a in arms}
    print("[medium-claim] counted FLOPs per training image: " + ", ".join(f"{a} {f / 1e9:.4g} GFLOP"
                                                                          for a, f in per.items()), flush=True)
    seeds = list(range(args.seeds))
    modes = ["vmap", "loop"] if args.mode == "auto" else [args.mode]
    p = project(Group, model_cfg, rc, arms, seeds, per, n_test, modes)
    steps = args.steps or fitting_steps(p, args.budget_s)
    print(f"[medium-claim] plan: arms {arms}, {args.seeds} seeds each, B = {steps} and 2B = {2 * steps} steps (each a "
          f"run of its own), " + ("B as given" if args.steps else f"B the largest multiple of 100 the projection fits "
                                  f"in 90 % of --budget-s {args.budget_s:.0f}"))
    for line in lines(p, steps, args.budget_s):
        print(line)
    print("[medium-claim] DRY_RUN: nothing trained")
    return 0


def parse(argv):
    p = argparse.ArgumentParser(prog="gpu_check.sh --medium-claim", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("CONDATTN_DATA", "data"),
                   help="folder holding cifar-100-python/ (or that folder); default $CONDATTN_DATA or ./data")
    p.add_argument("--seeds", type=int, default=10, help="seeds per arm (0 … N−1)")
    p.add_argument("--steps", type=int, default=0, help="budget B in steps (2B is run too); 0 = the largest multiple "
                   "of 100 the --budget-s allows by the measured warm-up")
    p.add_argument("--batch", type=int, default=None, help="batch per seed (default: the medium recipe's)")
    p.add_argument("--mode", choices=("auto", "vmap", "loop"), default="auto",
                   help="seeds at once (vmap) or one after another (loop); auto: the faster in the warm-up")
    p.add_argument("--budget-s", type=float, default=780.0, help="refuse when the projected time exceeds it")
    p.add_argument("--warmup-steps", type=int, default=5, help="timed steps per arm and mode before the projection")
    p.add_argument("--model", default="", help="model overrides KEY=VALUE,... (e.g. depth=1,embed_dim=32)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--allow-cpu", action="store_true", help="train on CPU (tests, toy data)")
    p.add_argument("--out", default="results/medium")
    p.add_argument("--dry-run", action="store_true", help="print the plan only (also DRY_RUN=1)")
    args = p.parse_args(argv)
    args.dry_run = args.dry_run or os.environ.get("DRY_RUN", "") not in ("", "0")
    if args.seeds < 2:
        raise fail(f"--seeds {args.seeds}: a Welch interval needs at least 2 seeds per arm")
    if args.steps < 0 or args.warmup_steps < 1:
        raise fail(f"--steps {args.steps} / --warmup-steps {args.warmup_steps}: use --steps ≥ 0, --warmup-steps ≥ 1")
    return args


def overrides(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise fail(f"--model {item!r}: expected KEY=VALUE (e.g. depth=1)")
        out[key.strip()] = float(val) if "." in val else int(val) if val.strip().lstrip("-").isdigit() else val
    return out


def main(argv=None) -> int:
    t0 = time.time()
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and not (args.dry_run or args.allow_cpu):
        raise fail("no CUDA device (torch.cuda.is_available() is False): run it on a GPU, DRY_RUN=1 for the plan "
                   "only, or --allow-cpu to train on CPU")
    data = load_data(args.data, device, planning=args.dry_run)
    model_cfg, rc = recipe(overrides(args.model))
    if args.batch:
        rc["batch"] = args.batch
    seeds, arms = list(range(args.seeds)), list(ARMS)
    where = "GPU" if device.type == "cuda" else "CPU estimate"
    print(f"[medium-claim] claim: table 1 ViT row, CET (conditioning=embedded) vs baseline (conditioning=none), "
          f"CIFAR-100 ({len(data['train'][1])} train / {len(data['val'][1])} test images, {args.data}), seeds "
          f"{seeds[0]}-{seeds[-1]} per arm, batch {rc['batch']} per seed, lr {rc['lr']}, device {device}", flush=True)
    print(f"[medium-claim] model: {model_cfg}", flush=True)
    modes, n = (["vmap", "loop"] if args.mode == "auto" else [args.mode]), args.warmup_steps
    if device.type == "cpu" and model_cfg["depth"] * model_cfg["embed_dim"] * rc["batch"] > CPU_HEAVY:
        if args.dry_run:
            return cpu_plan(model_cfg, rc, arms, args, len(data["val"][1]))
        modes, n = [args.mode if args.mode != "auto" else "loop"], 1
        print(f"[medium-claim] CPU: warm-up of the {modes[0]} mode only, one timed step per arm", flush=True)
    cost = {m: {a: step_seconds(model_cfg, rc, a, seeds, data, device, m, n) for a in arms}
            for m in modes}
    for m, per in cost.items():
        print(f"[medium-claim] warm-up ({where}, {m}): " + ", ".join(f"{a} {s:.4f} s per step of {args.seeds} seeds"
                                                                    for a, s in per.items()), flush=True)
    mode = min(cost, key=lambda m: sum(cost[m].values()))
    per_step = sum(cost[mode].values())  # one step of every seed of both arms
    per_image = per_step / (2 * args.seeds * rc["batch"])
    evals = 2 * 2 * args.seeds * len(data["val"][1]) * per_image / 3  # forward only, 4 evaluations per seed
    startup = time.time() - t0
    steps = args.steps or max(100, int((0.9 * args.budget_s - startup - evals) / (3 * per_step)) // 100 * 100)
    projected = startup + 3 * steps * per_step + evals
    print(f"[medium-claim] plan: arms {arms}, {args.seeds} seeds each, B = {steps} and 2B = {2 * steps} steps "
          f"(each a run of its own), mode {mode}; projected {projected:.0f} s ({where}: start-up {startup:.0f} s so "
          f"far + 3B × {per_step:.4f} s + evaluation {evals:.0f} s), budget {args.budget_s:.0f} s", flush=True)
    if args.dry_run:
        over = f"; it exceeds --budget-s {args.budget_s:.0f}: this device would refuse" if projected > args.budget_s \
            else ""
        print(f"[medium-claim] DRY_RUN: nothing trained{over}")
        return 0
    if projected > args.budget_s:
        raise fail(f"projected {projected:.0f} s exceeds --budget-s {args.budget_s:.0f}: lower --steps or --seeds")
    from .medium_claim_report import write

    acc = {}
    for arm in arms:
        for s in (steps, 2 * steps):
            t = time.time()
            group = Group(model_cfg, rc, arm, seeds, s, data, device, mode)
            for _ in range(s):
                group.train_step()
            acc[(arm, s)] = group.test_acc(data)
            print(f"[medium-claim] {arm} at {s} steps: test acc {acc[(arm, s)]} ({time.time() - t:.0f} s)", flush=True)
    paths = write(Path(args.out), acc, arms, steps, seeds, dict(model=model_cfg, recipe=rc, mode=mode, device=device,
                  data=args.data, checksum=data["checksum"], wall_s=round(time.time() - t0, 1),
                  projected_s=round(projected, 1)))
    print(f"[medium-claim] wrote {paths[0]} and {paths[1]} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
