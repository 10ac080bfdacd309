"""`python -m condattn.bench` (`make bench`): what each method costs, measured side by side in one run.

For each model at a fixed batch: forward+backward step time and samples/s for baseline, SCA, CET with the
exact SVD and CET with Newton–Schulz, the field's methods (QK-norm, σReparam, mimetic init, NS-attention; one
refused where it does not apply, with its reason), and each arm's ratio to baseline. Arms are interleaved (one step
of each in turn, medians over the timed rounds after warm-up), so drift on a shared machine hits all arms
alike. Peak memory is reported on CUDA. Results go to results/bench/<host>_<device>.{md,json}.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import after_optimizer_step, apply_conditioning
from .engine import provenance
from .engine.flops import mfu, peak_flops, training_step_flops
from .engine.precision import resolve_execution


def bench_arms() -> dict[str, tuple[str, dict]]:
    """{arm: (method, options)}: every registered method's bench arms (MethodSpec.bench_arms), in registration
    order, the baseline's first."""
    from .conditioning.spec import METHODS, method_spec

    return {arm: (m, dict(opts)) for m in METHODS for arm, opts in method_spec(m).bench_arms.items()}


def baseline_arm() -> str:
    """The arm every ratio is taken to: the baseline method's."""
    from .conditioning.spec import BASELINE, method_spec

    return next(iter(method_spec(BASELINE).bench_arms))


def _vit_small(batch: int, device: torch.device):
    import timm

    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    return model, lambda m: F.cross_entropy(m(x), y)


def _bert_base(batch: int, device: torch.device):
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(num_labels=2))  # BERT-base: 12 × 768, 12 heads
    ids = torch.randint(1000, 30000, (batch, 128), device=device)
    mask = torch.ones_like(ids)
    mask[batch // 2 :, 96:] = 0  # half the batch padded: CET must exclude those rows
    y = torch.randint(0, 2, (batch,), device=device)
    return model, lambda m: F.cross_entropy(m(input_ids=ids, attention_mask=mask).logits, y)


def _nystromformer_lra(batch: int, device: torch.device):
    from .models.lra import NystromformerClassifier

    model = NystromformerClassifier(vocab_size=19, num_classes=10, seq_len=2048)
    ids = torch.randint(2, 19, (batch, 2048), device=device)
    mask = torch.ones_like(ids)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, lambda m: F.cross_entropy(m(input_ids=ids, attention_mask=mask), y)


def _crammed_bert(batch: int, device: torch.device):
    """crammed BERT exactly as table 3 pretrains it (configs/model/crammed_bert.yaml: 16 × 768, 32768 WordPiece,
    128-token packed blocks, dropout off as bert-o4) on its MLM loss: 25 % of the tokens masked, sparse decoder."""
    from .config import compose
    from .models import build_model

    cfg = compose(["task=mlm_crammed", "data.vocab_size=32768", "data.seq_len=128"])
    model = build_model(cfg.model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 32768, (batch, 128), generator=g).to(device)
    labels = torch.where(torch.rand(batch, 128, generator=g).to(device) < 0.25, ids, torch.full_like(ids, -100))
    target = labels[labels != -100]
    return model, lambda m: F.cross_entropy(m(input_ids=ids, labels=labels), target)


def _zoo(config: str):
    """A vision zoo entry exactly as the trainer builds it (configs/model/<config>.yaml through build_model), at its
    own input size (224 for the paper members, 32 for the small ones)."""

    def factory(batch: int, device: torch.device):
        from .config import compose
        from .models import build_model

        size = 32 if config.endswith("_32") else 224
        cfg = compose([f"model={config}", "data=imagenet", f"data.img_size={size}", "data.num_classes=1000"])
        model = build_model(cfg.model)
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        return model, lambda m: F.cross_entropy(m(x), y)

    return factory


MODELS: dict[str, tuple[Callable, int, int]] = {  # name -> (factory, CPU batch, GPU batch)
    "vit_small_patch16_224": (_vit_small, 16, 128),
    "bert_base_seq128": (_bert_base, 8, 64),
    "nystromformer_lra_listops": (_nystromformer_lra, 8, 32),
    "crammed_bert": (_crammed_bert, 8, 256),
}
TOKENS_PER_SAMPLE = {"bert_base_seq128": 128, "nystromformer_lra_listops": 2048, "crammed_bert": 128}
# `--models zoo`: every vision zoo entry of table 1 (paper members, then the small members the small scale trains)
ZOO = ["vit_base_patch16_224", "deit_base_patch16_224", "swin_base_patch4_window7_224", "xcit_medium_24_p16_224",
       "davit_base", "vit_tiny_32", "deit_tiny_32", "swin_tiny_32", "xcit_nano_32", "davit_tiny_32"]
MODELS.update({name: (_zoo(name), 4 if not name.endswith("_32") else 64, 64 if not name.endswith("_32") else 512)
               for name in ZOO})
DEFAULT_MODELS = ["vit_small_patch16_224", "bert_base_seq128", "nystromformer_lra_listops"]


def _step(model: nn.Module, loss_fn: Callable, opt: torch.optim.Optimizer, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    loss_fn(model).backward()
    opt.step()
    after_optimizer_step(model)  # (qk_clip's rescale; nothing for the other methods)
    opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def bench_model(name: str, device: torch.device, batch: int, warmup: int, iters: int, precision: str,
                arm_names: list[str] | None = None, compile_: bool = False) -> dict:
    factory = MODELS[name][0]
    torch.manual_seed(0)
    base, loss_fn = factory(batch, device)
    arms, refused, base_arm = {}, {}, baseline_arm()
    for arm, (method, opts) in bench_arms().items():
        if arm_names and arm != base_arm and arm not in arm_names:
            continue
        model = copy.deepcopy(base).to(device).train()
        try:
            apply_conditioning(model, method, **opts)
        except ValueError as e:  # a method that does not apply to this model (its one-line reason)
            refused[arm] = str(e).splitlines()[0]
            continue
        arms[arm] = (model, torch.optim.AdamW(model.parameters(), lr=1e-6))
    # training FLOPs per sample of each arm: one forward + backward under torch.utils.flop_counter (engine/flops.py)
    flops = {arm: training_step_flops(model, loss_fn) / batch for arm, (model, _) in arms.items()}
    if compile_:  # after counting (the counter sees the eager ops); every arm alike
        arms = {arm: (torch.compile(model), opt) for arm, (model, opt) in arms.items()}
    times: dict[str, list[float]] = {a: [] for a in arms}
    peak: dict[str, float | None] = {a: None for a in arms}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        for i in range(warmup + iters):
            for arm, (model, opt) in arms.items():
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                dt = _step(model, loss_fn, opt, device)
                if i >= warmup:
                    times[arm].append(dt)
                if device.type == "cuda":
                    peak[arm] = max(peak[arm] or 0.0, torch.cuda.max_memory_allocated() / 2**20)
    rows = {}
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    for arm, ts in times.items():
        med = statistics.median(ts)
        # paired by round (the arms of one round ran back to back), so slow drift of a shared machine cancels
        ratios = sorted(t / b for t, b in zip(ts, times[base_arm]))
        q1, q3 = (statistics.quantiles(ratios, n=4)[i] for i in (0, 2)) if len(ratios) > 1 else (ratios[0],) * 2
        rows[arm] = {
            "step_ms": round(1000 * med, 1),
            "samples_per_s": round(batch / med, 2),
            **({"tokens_per_s": round(batch * TOKENS_PER_SAMPLE[name] / med, 1)} if name in TOKENS_PER_SAMPLE else {}),
            "ratio_to_baseline": round(statistics.median(ratios), 3),
            "ratio_iqr": [round(q1, 3), round(q3, 3)],
            "peak_mem_mib": None if peak[arm] is None else round(peak[arm], 1),
            "train_gflop_per_sample": round(flops[arm] / 1e9, 3),
            "achieved_tflop_per_s": round(flops[arm] * batch / med / 1e12, 4),
            "mfu": None if device.type != "cuda" else _round(mfu(flops[arm], batch / med, dev_name, precision)),
        }
    return {"model": name, "batch": batch, "warmup": warmup, "iters": iters, "precision": precision,
            "compile": compile_, "arms": rows, **({"refused": refused} if refused else {})}


def _peak_note(device: torch.device, precision: str) -> str:
    if device.type != "cuda":
        return " (CPU: achieved FLOP/s, no MFU)"
    name = torch.cuda.get_device_name(device)
    peak = peak_flops(name, precision)
    return f", dense peak {peak / 1e12:.0f} TFLOP/s" if peak else f" (no peak known for {name}: no MFU)"


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def trainer_vs_reference(overrides: list[str], steps: int, out_runs: str, repeats: int = 3) -> dict:
    """Our trainer's training throughput against a plain PyTorch loop (the library's model, the same data
    loader batch, AdamW, and the recipe's loss as timm's train.py computes it: timm Mixup + SoftTargetCrossEntropy
    or label smoothing) over the same number of steps, both from a cold start; `repeats` pairs
    run alternately and the ratio is the median of the per-pair ratios (one pair alone moved ±10% here)."""
    import shutil

    from torch.utils.data import DataLoader

    from .config import compose
    from .data.registry import build_datasets
    from .engine.trainer import train
    from .models import build_model
    from .tasks.classification import model_inputs

    ov = [*overrides, "logger=none", f"task.steps={steps}", f"task.eval_every={steps}", f"task.log_every={steps}",
          f"impl.checkpoint_every={steps}", f"paths.runs={out_runs}", "resume=never", "conditioning=none"]
    cfg = compose(ov)

    def ours() -> float:  # the trainer's own measure: samples over the time spent in training steps
        summary = train(cfg)
        shutil.rmtree(cfg.run.dir, ignore_errors=True)
        return float(summary["train_samples_per_s"])

    def plain() -> float:  # timm's train.py step for vision (mixup + soft-target CE when the recipe mixes)
        torch.manual_seed(int(cfg.seed))
        data = build_datasets(cfg)
        # the device, mixed precision and AdamW kernel the trainer resolves for this config (engine/precision.py)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        ex = resolve_execution(cfg.impl, device.type)
        model = build_model(cfg.model).to(device).train()
        fused = {"fused": True} if ex.fused_adamw else {}
        opt = torch.optim.AdamW(model.parameters(), lr=float(cfg.optim.lr), **fused)
        model = torch.compile(model) if ex.compile else model
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(ex.precision)
        mix, smoothing = cfg.task.get("mixup"), float(cfg.task.get("label_smoothing") or 0.0)
        mixup, criterion = None, F.cross_entropy
        if mix:
            from timm.data import Mixup
            from timm.loss import SoftTargetCrossEntropy

            mixup = Mixup(mixup_alpha=float(mix.mixup_alpha), cutmix_alpha=float(mix.cutmix_alpha),
                          prob=float(mix.prob), switch_prob=float(mix.switch_prob), mode=str(mix.mode),
                          label_smoothing=smoothing, num_classes=int(cfg.task.num_classes))
            criterion = SoftTargetCrossEntropy()
        elif smoothing:
            from timm.loss import LabelSmoothingCrossEntropy

            criterion = LabelSmoothingCrossEntropy(smoothing=smoothing)
        workers = int(cfg.impl.num_workers)
        loader = DataLoader(data.train, batch_size=int(cfg.task.batch_size), shuffle=True, drop_last=True,
                            num_workers=workers, pin_memory=bool(cfg.impl.pin_memory), persistent_workers=workers > 0)
        done, elapsed = 0, 0.0
        while done < steps:
            it = iter(loader)
            while done < steps:
                t = time.perf_counter()  # like the trainer's step time: fetching the batch included
                batch = next(it, None)
                if batch is None:
                    break
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                inputs, target = model_inputs(batch), batch["labels"]
                if mixup is not None:
                    inputs["pixel_values"], target = mixup(inputs["pixel_values"], target)
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    logits = model(inputs["pixel_values"]) if "pixel_values" in inputs else model(**inputs)
                criterion(logits.float(), target).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                elapsed += time.perf_counter() - t
                done += 1
        return int(cfg.task.batch_size) * steps / elapsed

    pairs = [(ours(), plain()) for _ in range(repeats)]
    ratios = sorted(o / r for o, r in pairs)
    return {"config": " ".join(overrides), "model": cfg.model.name, "steps": steps, "repeats": repeats,
            "global_batch": int(cfg.task.batch_size),
            "trainer_samples_per_s": round(statistics.median(o for o, _ in pairs), 2),
            "reference_samples_per_s": round(statistics.median(r for _, r in pairs), 2),
            "ratio": round(statistics.median(ratios), 3), "ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)]}


LOADER_TASKS = {"imagenet": "task=imagenet_vit", "coco": "task=coco_maskrcnn_xcit_medium",
                "cifar": "task=imagenet_vit"}  # cifar: the medium scale's CIFAR-100 recipe
LOADER_SCALES = {"imagenet": "paper", "coco": "paper", "cifar": "medium"}


def bench_loader(which: str, seconds: float, n: int) -> dict:
    """Samples/s of one data worker per loader option, on a release-format replica written to a temporary folder
    (condattn/data/loader_bench.py), with the paper recipe's training transform."""
    import tempfile

    from .config import compose
    from .data import loader_bench

    with tempfile.TemporaryDirectory(prefix=f"condattn_{which}_replica_") as tmp:
        root = Path(tmp)
        writer = {"imagenet": lambda: loader_bench.write_imagenet_replica(root, n=n),
                  "coco": lambda: loader_bench.write_coco_replica(root, n=max(n // 3, 8)),
                  "cifar": lambda: loader_bench.write_cifar_replica(root, n=n)}[which]
        writer()
        cfg = compose([LOADER_TASKS[which], f"scale={LOADER_SCALES[which]}", f"data.root={root}"])
        options = {"imagenet": loader_bench.imagenet_options, "coco": loader_bench.coco_options,
                   "cifar": loader_bench.cifar_options}[which](cfg)
        rows = loader_bench.samples_per_s(options, seconds)
        for name, v in rows.items():
            print(f"  {which} {name}: {v['samples_per_s_per_worker']} samples/s per worker, "
                  f"× {v['ratio_to_first']} the first option ({v['samples']} samples)", flush=True)
    return {"loader": which, "replica_images": max(n // 3, 8) if which == "coco" else n,
            "task": LOADER_TASKS[which], "options": rows}


def render_loader(results: list[dict], header: str) -> str:
    lines = [header, "", "One worker = one process on one core (torch threads 1), `dataset[i]` in a loop: decoded and "
             "augmented training samples as the DataLoader worker hands them over. Options interleaved in rounds; "
             "medians over rounds (samples/s, and the per-round ratio to the first option).", "",
             "| data | replica | option | samples/s per worker | × first option | rounds |",
             "|---|---|---|---|---|---|"]
    for r in results:
        for name, v in r["options"].items():
            lines.append(f"| {r['loader']} ({r['task']}) | {r['replica_images']} images | {name} | "
                         f"{v['samples_per_s_per_worker']} | {v['ratio_to_first']:.3f} | {v['rounds']} |")
    return "\n".join(lines) + "\n"


def render(results: list[dict], header: str) -> str:
    lines = [header, "", "× baseline: median over rounds of the arm's step time / the baseline's step time in the same "
             "round, with the interquartile range of those per-round ratios (the machine's noise).", "",
             "Training GFLOP/sample: forward + backward counted by torch.utils.flop_counter (matmuls, convolutions, "
             "attention); achieved TFLOP/s = that × samples/s; MFU = achieved / the device's dense peak at the "
             "precision (condattn/engine/flops.py; GPUs only).", "",
             "| model | batch | arm | step (ms, median) | samples/s | tokens/s | × baseline | IQR | peak mem (MiB) "
             "| train GFLOP/sample | achieved TFLOP/s | MFU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for arm, v in r["arms"].items():
            mem = "–" if v["peak_mem_mib"] is None else v["peak_mem_mib"]
            util = "–" if v.get("mfu") is None else f"{100 * v['mfu']:.1f}%"
            lines.append(f"| {r['model']} | {r['batch']} | {arm} | {v['step_ms']} | {v['samples_per_s']} | "
                         f"{v.get('tokens_per_s', '–')} | {v['ratio_to_baseline']:.3f} | "
                         f"{v['ratio_iqr'][0]:.3f}–{v['ratio_iqr'][1]:.3f} | {mem} | "
                         f"{v.get('train_gflop_per_sample', '–')} | {v.get('achieved_tflop_per_s', '–')} | {util} |")
    for r in results:
        lines += [f"\n{r['model']}: {arm} not run: {why}" for arm, why in r.get("refused", {}).items()]
    return "\n".join(lines + ["", *cost_terms()]) + "\n"


def cost_terms() -> list[str]:
    """Each arm's per-step cost term, as its method declares it (MethodSpec.cost; init-only: none)."""
    from .conditioning.spec import BASELINE, method_spec

    out = ["Cost terms (each method's MethodSpec):"]
    for arm, (method, opts) in bench_arms().items():
        if method != BASELINE:
            ms = method_spec(method)
            once = ms.once({**ms.options, **opts})
            out.append(f"- {arm}: {'none per step (init only: ' + once + ')' if once else ms.cost}")
    return out


# `--efficiency`: one small cell per table family (table, row): the share of a run's CPU in its training steps
EFFICIENCY_CELLS = {"table1_vit": ("table1_imagenet", "vit_base"), "table4_listops": ("table4_lra", "listops"),
                    "table5_gpt2": ("table5_tinystories", "gpt2")}


def efficiency_cell(key: str, scale: str = "small") -> tuple[str, list[str]]:
    """(run name, overrides) of the baseline's first-seed cell of EFFICIENCY_CELLS[key] at `scale`."""
    from .conditioning.spec import BASELINE
    from .experiment import load
    from .table.cells import parts

    table, row = EFFICIENCY_CELLS[key]
    exp = load(provenance.REPO / "experiments" / f"{table}.yaml")
    part = next(p for p in parts(exp, scale, [0]) if p.row == row and p.method == BASELINE)
    return part.name, list(part.own)


def bench_efficiency(key: str, steps: int | None, project_to: list[int], out_runs: Path, scale: str = "small",
                     extra: list[str] | None = None, env: dict[str, str] | None = None) -> dict:
    """Train the cell `key` in a fresh process (its imports are part of its cost), `steps` steps (None: the recipe's),
    and read its CPU split (summary.json performance.cpu_split, engine/runcost.py); projected to `project_to` steps
    (fixed costs as measured, training, evaluation and checkpoints per step / evaluation / checkpoint)."""
    import os
    import shutil
    import subprocess
    import sys

    from .config import compose
    from .engine import runcost

    name, own = efficiency_cell(key, scale)
    ov = [*own, "logger=none", "resume=never", f"paths.runs={out_runs}", *([f"task.steps={steps}"] if steps else []),
          *(extra or [])]
    cfg = compose(ov)
    run_dir = Path(str(cfg.run.dir))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    before = _children_cpu()
    done = subprocess.run([sys.executable, "-m", "condattn.train", *ov], env=env, capture_output=True, text=True)
    process_tree_s = _children_cpu() - before  # the run's process and what it waited for (inductor's compilers)
    summary_file = run_dir / "summary.json"
    if done.returncode != 0 or not summary_file.is_file():
        raise RuntimeError(f"{name} failed: {done.stderr.strip().splitlines()[-3:]}")
    summary = json.loads(summary_file.read_text())
    measured = summary["performance"]["cpu_split"]
    shutil.rmtree(run_dir, ignore_errors=True)
    every, ckpt = int(cfg.task.eval_every), int(cfg.impl.checkpoint_every)
    recipe = int(compose(own).task.steps)
    return {"cell": key, "run": name, "overrides": ov, "recipe_steps": recipe,
            "measured": measured, "process_tree_s": round(process_tree_s, 3), "execution": summary.get("execution"),
            "projected": {str(n): runcost.project(measured, n, every, ckpt) for n in sorted({*project_to, recipe})}}


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and what they waited for."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench_compile_cost(key: str, steps: int, out_runs: Path) -> dict:
    """`impl.compile_cost` of the cell `key`'s model, measured: the cell trained eager and compiled
    (impl.cpu_compile=true, an empty inductor cache each time, as a table's first cell finds it) at `steps` and
    2 × `steps`. A step's CPU each way is the extra training CPU of the longer run over its extra steps; the
    compile's CPU is what a compiled run spends beyond its steps (its whole process tree, inductor's C++ compilers
    included) less what an eager run spends beyond its own."""
    import tempfile

    runs: dict[tuple[str, int], dict] = {}
    for mode in ("false", "true"):
        for n in (steps, 2 * steps):
            with tempfile.TemporaryDirectory() as cache:  # inductor's cache, empty: each compile is cold
                runs[mode, n] = bench_efficiency(key, n, [], out_runs, extra=[f"impl.cpu_compile={mode}"],
                                                 env={"TORCHINDUCTOR_CACHE_DIR": cache})
    cost = compile_cost_from(runs, steps)
    from .config import compose
    from .engine.precision import break_even_steps

    return {"cell": key, "model": str(compose(efficiency_cell(key)[1]).model.name), "steps": [steps, 2 * steps],
            "compile_cost": cost,
            "break_even_steps": break_even_steps(cost["compile_s"], cost["eager_step_s"], cost["compiled_step_s"]),
            "runs": [{"compile": m, "steps": n, "process_tree_s": r["process_tree_s"], "measured": r["measured"]}
                     for (m, n), r in runs.items()]}


def compile_cost_from(runs: dict[tuple[str, int], dict], steps: int) -> dict[str, float]:
    """The `impl.compile_cost` entry from the four runs of `bench_compile_cost`, keyed (impl.cpu_compile, steps)."""
    step = {m: (runs[m, 2 * steps]["measured"]["seconds"]["train"] - runs[m, steps]["measured"]["seconds"]["train"])
            / steps for m in ("false", "true")}
    fixed = {m: runs[m, steps]["process_tree_s"] - steps * step[m] for m in ("false", "true")}
    return {"compile_s": round(fixed["true"] - fixed["false"], 1), "eager_step_s": round(step["false"], 5),
            "compiled_step_s": round(step["true"], 5)}


def render_compile_cost(results: list[dict], header: str) -> str:
    lines = [header, "", "Each run's CPU: its whole process tree (inductor's C++ compilers included); a step's: the "
             "training CPU the longer run adds per extra step (condattn/engine/runcost.py). The entry goes under "
             "`impl.compile_cost` in the impl block of the recipe that runs the model on CPU (the small ViT's: "
             "configs/scale_recipe/imagenet_vit_small.yaml); `impl.cpu_compile=auto` compiles a run whose steps reach "
             "the break-even.", "",
             "| cell | model | compile | steps | CPU s (process tree) | training steps CPU s |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines += [f"| {r['cell']} | {r['model']} | {x['compile']} | {x['steps']} | {x['process_tree_s']:.1f} | "
                  f"{x['measured']['seconds']['train']:.1f} |" for x in r["runs"]]
    lines.append("")
    for r in results:
        even = r["break_even_steps"]
        lines.append(f"- {r['cell']}: `impl.compile_cost.{r['model']}: {json.dumps(r['compile_cost'])}`; break-even "
                     f"{'none (a compiled step is not faster)' if even is None else f'{even:.0f} steps'}")
    return "\n".join(lines) + "\n"


def _cpu_header(title: str) -> tuple[dict, str]:
    """(hardware, header) of a bench measured on this CPU with one process: the title, then its provenance."""
    hw = provenance.hardware(torch.device("cpu"), 1)
    return hw, (f"# {title}\n\n"
                f"{provenance.describe(hw)}, commit {provenance.git_commit()}, torch {torch.__version__}, "
                f"OMP_NUM_THREADS={__import__('os').environ.get('OMP_NUM_THREADS', '1')}, "
                f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")


def _main_compile_cost(args: argparse.Namespace) -> int:
    hw, header = _cpu_header("condattn compile-cost bench: a cold torch.compile against its per-step saving, on CPU "
                             "(measured)")
    out = Path(args.out)
    results = [bench_compile_cost(key, args.efficiency_steps or 300, out / "runs") for key in args.compile_cost]
    return _write(out, f"{hw['host']}_compile_cost", render_compile_cost(results, header), header, hw, results)


def render_efficiency(results: list[dict], header: str) -> str:
    from .engine import runcost

    rows = []
    for r in results:
        rows.append((f"{r['cell']} (measured)", r["measured"]))
        rows += [(f"{r['cell']} (projected)", p) for p in r["projected"].values()]
    return (f"{header}\n\nThe process's own CPU time (time.process_time), by cause (condattn/engine/runcost.py); "
            "projected rows: training, evaluation and checkpoints scaled by their count, every other cause as "
            "measured (a fixed cost per run).\n\n" + runcost.render(rows))


def _main_efficiency(args: argparse.Namespace) -> int:
    hw, header = _cpu_header("condattn efficiency bench: the share of a small run's CPU time in its training steps "
                             "(measured)")
    out = Path(args.out)
    results = []
    for key in args.efficiency:
        r = bench_efficiency(key, args.efficiency_steps, [*args.project_to], out / "runs", extra=args.efficiency_args)
        results.append(r)
        print(render_efficiency([r], f"## {key}"), flush=True)
    return _write(out, f"{hw['host']}_efficiency", render_efficiency(results, header), header, hw, results)


def _write(out: Path, stem: str, md: str, header: str, hw: dict, results: list) -> int:
    """The bench's table as `stem`.md and its numbers as `stem`.json under `out`, the table printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(md)
    (out / f"{stem}.json").write_text(json.dumps({"header": header, "hardware": hw, "results": results}, indent=2))
    print(md)
    print(f"wrote {out / stem}.md and .json")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.bench", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=DEFAULT_MODELS,
                   help=f"from {list(MODELS)}; `zoo` = every vision zoo entry (default: {DEFAULT_MODELS})")
    p.add_argument("--batch", type=int, help="default: per model, smaller on CPU")
    p.add_argument("--arms", nargs="*", help=f"only these arms beside the baseline, from {list(bench_arms())[1:]} "
                   "(more rounds in the same time, e.g. --arms SCA --iters 21)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="torch.compile every arm (after counting its FLOPs)")
    p.add_argument("--out", default="results/bench")
    p.add_argument("--trainer", action="append", default=[], metavar="OVERRIDES",
                   help='also time our trainer against a plain loop on this config, e.g. "scale=smoke" (repeatable)')
    p.add_argument("--trainer-steps", type=int, default=100)
    p.add_argument("--trainer-repeats", type=int, default=3, help="alternating trainer / plain-loop pairs")
    p.add_argument("--loader", action="append", choices=list(LOADER_TASKS), default=[],
                   help="measure data-loader samples/s per worker on a replica instead of model steps (repeatable)")
    p.add_argument("--loader-seconds", type=float, default=15.0, help="timed seconds per loader option")
    p.add_argument("--loader-images", type=int, default=96, help="images in the ImageNet replica (COCO: a third)")
    p.add_argument("--efficiency", nargs="*", choices=list(EFFICIENCY_CELLS), metavar="CELL",
                   help="instead: the share of a small run's CPU time in its training steps, by cause, for these cells "
                        f"(no name: all of {list(EFFICIENCY_CELLS)})")
    p.add_argument("--efficiency-steps", type=int, default=300,
                   help="steps each efficiency run trains (0: the recipe's)")
    p.add_argument("--project-to", type=int, nargs="*", default=[2000],
                   help="steps to project each split to (beside the recipe's own)")
    p.add_argument("--efficiency-args", nargs="*", default=[], help="extra overrides for the efficiency runs")
    p.add_argument("--compile-cost", nargs="*", choices=list(EFFICIENCY_CELLS), metavar="CELL",
                   help="instead: measure impl.compile_cost for these cells' models (eager and compiled, cold, at "
                        "--efficiency-steps and twice that)")
    args = p.parse_args(argv)
    if args.compile_cost is not None:
        args.compile_cost = args.compile_cost or ["table1_vit"]
        return _main_compile_cost(args)
    if args.efficiency is not None:
        args.efficiency = args.efficiency or list(EFFICIENCY_CELLS)
        args.efficiency_steps = args.efficiency_steps or None
        return _main_efficiency(args)
    if args.loader:
        return _main_loader(args)
    args.models = [m for name in args.models for m in (ZOO if name == "zoo" else [name])]
    bad_arms = [a for a in args.arms or [] if a not in bench_arms()]
    if bad_arms:
        p.error(f"unknown arm(s) {bad_arms}; choose from {list(bench_arms())[1:]}")
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; choose from {list(MODELS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_flush_denormal(True)  # as the trainer does (impl.flush_denormal)
    hw = provenance.hardware(device, 1)
    header = (
        f"# condattn bench: forward+backward+AdamW step, baseline vs SCA vs CET and the field's methods (measured)\n\n"
        f"{provenance.describe(hw)}, torch threads {torch.get_num_threads()}, precision {args.precision}"
        f"{', compiled' if args.compile else ''}{_peak_note(device, args.precision)}, "
        f"commit {provenance.git_commit()}, torch {torch.__version__}, "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; medians of {args.iters} interleaved "
        f"rounds after {args.warmup} warm-up rounds"
    )
    results = []
    for name in args.models:
        batch = args.batch or MODELS[name][1 if device.type == "cpu" else 2]
        r = bench_model(name, device, batch, args.warmup, args.iters, args.precision, args.arms, args.compile)
        results.append(r)
        print(render([r], f"## {name}"), flush=True)
    md = render(results, header)
    trainer_rows = [trainer_vs_reference(t.split(), args.trainer_steps, str(Path(args.out) / "runs"),
                                         args.trainer_repeats) for t in args.trainer]
    if trainer_rows:
        md += ("\n| trainer config | model | global batch | steps × pairs | ours (samples/s) | plain loop (samples/s) "
               "| ours / plain (median, range) |\n|---|---|---|---|---|---|---|\n")
        md += "".join(f"| {r['config']} | {r['model']} | {r['global_batch']} | {r['steps']} × {r['repeats']} | "
                      f"{r['trainer_samples_per_s']} | {r['reference_samples_per_s']} | {r['ratio']:.3f} "
                      f"({r['ratio_range'][0]:.3f}–{r['ratio_range'][1]:.3f}) |\n"
                      for r in trainer_rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{hw['host']}_{device.type}_{args.precision}{'_compiled' if args.compile else ''}"
    (out / f"{stem}.md").write_text(md)
    (out / f"{stem}.json").write_text(json.dumps({"header": header, "hardware": hw, "versions": provenance.versions(),
                                                  "results": results, "trainer": trainer_rows}, indent=2))
    print(md)
    print(f"wrote {out / stem}.md and .json")
    return 0


def _main_loader(args: argparse.Namespace) -> int:
    hw = provenance.hardware(torch.device("cpu"), 1)
    header = (f"# condattn loader bench: decoded + augmented training samples/s per data worker (measured)\n\n"
              f"{provenance.describe(hw)}, commit {provenance.git_commit()}, torch {torch.__version__}, "
              f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; {args.loader_seconds:.0f} s per option")
    results = [bench_loader(w, args.loader_seconds, args.loader_images) for w in args.loader]
    stem = f"{hw['host']}_loader_{'_'.join(args.loader)}"
    return _write(Path(args.out), stem, render_loader(results, header), header, hw, results)


if __name__ == "__main__":
    raise SystemExit(main())
