"""Everything a run needs before its first step, built in a fixed order (the order draws from the RNG, so it is
part of the bit-identity of a run): process settings, accelerate, the run directory, the seed, data, the model and
its conditioning patch, the task, optimizer and schedule, data loaders, and a resume from the latest checkpoint.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from ..conditioning import apply_conditioning
from ..data.registry import build_datasets
from ..data.sampler import EpochSampler
from ..models import build_model
from ..runs import RunRecord, list_checkpoints, set_aside
from ..tasks import build_task
from ..utils.typed_config import impl_config
from .budget import Budget
from .checkpoint import CheckpointUnreadable, architecture_mismatch, load_checkpoint
from .logging import RunLogger
from .optim import build_optimizer
from .precision import Execution, compile_model, resolve_execution
from .preflight import Checked, PreflightError, Problem, batch_split, check_config
from .runcost import CpuLedger, cpu
from .state import TrainState


@dataclass
class Run:
    """One training run: its config, accelerate, the zoo objects and the loop's shared state."""

    cfg: Any
    run_dir: Path
    accelerator: Accelerator
    glob: int  # global batch
    micro: int  # micro-batch per process
    accum: int  # micro-batches per process and optimizer step
    steps: int
    data: Any
    model: Any  # as prepared by accelerate (DDP, compile)
    raw: Any  # the unwrapped model
    report: Any  # the conditioning patch report
    task: Any
    optimizer: Any
    scheduler: Any
    budget: Budget
    sampler: Any
    train_loader: DataLoader
    val_loader: Any
    test_loader: Any
    state: TrainState
    config: dict | None = None  # the resolved config (set by `start`)
    resumed_from: Path | None = None
    logger: RunLogger | None = None
    execution: Execution | None = None  # precision, compile and fused AdamW as used on this device
    performance: dict | None = None  # samples/s, FLOPs per sample and MFU (engine/parts/throughput.py)
    cpu: CpuLedger | None = None  # the process's CPU time by cause (engine/runcost.py)

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    @property
    def eager(self) -> Any:
        """The model itself, never torch.compile's wrapper (accelerate's unwrap_model keeps that wrapper by default):
        what the diagnostics read, so a compiled run's step-0 and end diagnostics compile no graph of their own."""
        return getattr(self.raw, "_orig_mod", self.raw)

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when it is true on one (a signal may reach the ranks at different steps)."""
        if self.world == 1:
            return flag
        acc = self.accelerator
        return bool(acc.reduce(torch.tensor([float(flag)], device=acc.device), "sum").item() > 0)


def loader(ds, batch_size: int, sampler=None, workers: int = 0, pin: bool = False, collate=None) -> DataLoader:
    # a private generator: building an iterator must not draw from the global RNG (dropout masks would
    # then differ between a resumed and an uninterrupted run)
    return DataLoader(
        ds, batch_size=batch_size, sampler=sampler, shuffle=False, num_workers=workers, pin_memory=pin,
        drop_last=sampler is not None, generator=torch.Generator().manual_seed(0), collate_fn=collate,
    )


def _accelerator(cfg: Any, run_dir: Path, deterministic: bool,
                 execution: Execution) -> tuple[Accelerator, tuple[int, int, int]]:
    """Process settings, accelerate, the batch split over the real process count, a fresh run directory
    (resume=never) and the seed."""
    if cfg.impl.threads:
        torch.set_num_threads(int(cfg.impl.threads))
    torch.set_flush_denormal(bool(impl_config(cfg.impl).flush_denormal))
    # step_scheduler_with_optimizer=False: our schedule counts optimizer steps of the global batch; accelerate's
    # default steps a prepared scheduler num_processes times per step (it assumes per-process batches), which
    # ran the warmup and decay twice as fast with 2 processes
    # the recipe's precision on CUDA, impl.cpu_precision (fp32) elsewhere (engine/precision.py)
    accelerator = Accelerator(mixed_precision=execution.precision, cpu=execution.device_type != "cuda",
                              step_scheduler_with_optimizer=False)
    world = accelerator.num_processes
    try:  # the config itself was checked once (Checked); the data loader names missing files
        split = batch_split(cfg, world)
    except ValueError as e:
        raise PreflightError([Problem("batch", str(e))]) from None
    if cfg.resume == "never" and accelerator.is_main_process and run_dir.exists():
        shutil.rmtree(run_dir)
    accelerator.wait_for_everyone()
    set_seed(int(cfg.seed), deterministic=deterministic)
    if deterministic:
        torch.backends.cudnn.benchmark = False
    return accelerator, split


@dataclass
class Components:
    """The zoo objects of a run, built in the engine's order."""

    data: Any
    model: Any  # conditioned
    report: Any  # the conditioning patch report, checked against the config
    task: Any
    unpatched: Any = None  # a copy of the model before its patch (build_components(keep_unpatched=True))

    def __iter__(self):
        return iter((self.data, self.model, self.report, self.task))


def build_components(cfg: Any, conditioning: Any, data_guard: Any = None, prepare: Any = None,
                     keep_unpatched: bool = False, ledger: CpuLedger | None = None) -> Components:
    """Data, model, its conditioning patch (checked against `model.attention_layers`), task: the order `train` and
    `diagnose` share (each draws from the RNG after the seed). `conditioning`: what apply_conditioning takes (the
    run's ConditioningSpec); `data_guard`: a context around the data build (accelerate's main_process_first);
    `prepare(model) -> model`: before the patch (diagnose: to its device, eval mode); `keep_unpatched`: also keep a
    copy of the model before its patch; `ledger`: charged the data build's CPU (engine/runcost.py)."""
    import contextlib
    import copy

    with data_guard or contextlib.nullcontext(), ledger.charge("data") if ledger else contextlib.nullcontext():
        data = build_datasets(cfg)
    model = build_model(cfg.model)
    if prepare is not None:
        model = prepare(model)
    unpatched = copy.deepcopy(model) if keep_unpatched else None
    report = apply_conditioning(model, conditioning)
    report.check(attention_layers=cfg.model.get("attention_layers"))
    return Components(data, model, report, build_task(cfg), unpatched)


def keep_tokenizer(info: dict, run_dir: Path) -> None:
    """Copy the data cache's tokenizer.json into the run dir (once: a resumed run keeps its first copy). A text
    builder trains its tokenizer into the cache, and retraining it (a cleared or moved cache) need not give the same
    ids, so a fine-tuning run reads its pretraining run's own copy (runs.RunRecord.tokenizer_file)."""
    from ..runs import TOKENIZER

    src = Path(info["cache"]) / TOKENIZER if info.get("cache") else None
    if src is not None and src.is_file() and not (run_dir / TOKENIZER).exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, run_dir / TOKENIZER)


def build_run(cfg: Any, run_dir: Path, deterministic: bool, checked: Checked | None = None,
              ledger: CpuLedger | None = None) -> Run:
    """The run of `cfg`, from its one config check (`checked`: the conditioning spec and the budget; checked here when
    None); `ledger`: where its CPU time is counted by cause (engine/runcost.py; a fresh one from now when None)."""
    ledger = ledger or CpuLedger(cpu())
    checked = (checked or check_config(cfg)).raise_problems()
    execution = resolve_execution(cfg.impl, "cuda" if torch.cuda.is_available() else "cpu", int(cfg.task.steps),
                                  str(cfg.model.get("name")))
    accelerator, (glob, micro, accum) = _accelerator(cfg, run_dir, deterministic, execution)
    world, rank = accelerator.num_processes, accelerator.process_index
    # rank 0 generates/caches the data files, the others then read them
    data, model, report, task = build_components(cfg, checked.conditioning, accelerator.main_process_first(),
                                                 ledger=ledger)
    if accelerator.is_main_process:
        keep_tokenizer(data.info, run_dir)
    steps = int(cfg.task.steps)
    budget = checked.budget  # wall-clock budget + batch ramp (engine/budget.py); off by default
    optimizer, scheduler = build_optimizer(model, cfg, glob, steps, progress=budget.progress,
                                           fused=execution.fused_adamw)
    model = compile_model(model, execution, Path(str(cfg.paths.cache)) / "torch_compile")

    make_sampler = data.sampler_factory or EpochSampler  # e.g. repeated augmentation for ImageNet recipes
    sampler = make_sampler(len(data.train), int(cfg.seed), rank, world, block=micro)
    collate, workers = data.collate_fn, cfg.impl.num_workers
    train_loader = loader(data.train, micro, sampler, workers, cfg.impl.pin_memory, collate)
    if len(train_loader) < accum:
        raise ValueError(f"the training split has {len(data.train)} samples, fewer than one global batch ({glob})")
    eval_bs = max(micro, 1)
    val_loader = loader(data.val, eval_bs, workers=workers, collate=collate)
    test_loader = loader(data.test, eval_bs, workers=workers, collate=collate) if data.test is not None else None
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    val_loader = accelerator.prepare(val_loader)
    test_loader = accelerator.prepare(test_loader) if test_loader is not None else None
    state = TrainState()
    budget.bind(state)
    accelerator.register_for_checkpointing(state)
    return Run(cfg, run_dir, accelerator, glob, micro, accum, steps, data, model, accelerator.unwrap_model(model),
               report, task, optimizer, scheduler, budget, sampler, train_loader, val_loader, test_loader, state,
               execution=execution, cpu=ledger)


def start(run: Run) -> None:
    """Resume from the latest checkpoint (resume=auto), open the run's log and write its config and patch report.
    The parts that keep state are attached to `run.state` before this."""
    cfg, run_dir, state = run.cfg, run.run_dir, run.state
    ckpt = resume(run) if cfg.resume == "auto" else None
    if ckpt is not None:
        state.resumes.append(state.step)
        if run.main:
            print(f"[condattn] resumed {run_dir.name} from {ckpt.name} (step {state.step}/{run.steps})", flush=True)
    run.resumed_from = ckpt
    run.config = OmegaConf.to_container(cfg, resolve=True)
    run.logger = RunLogger(run_dir, cfg, run.main, state.step if ckpt else None, run.config)
    if run.main:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        RunRecord(run_dir).write_patch_report(run.report.to_dict())


def resume(run: Run) -> Path | None:
    """Load the newest readable checkpoint of the run dir (None when it has none). One that cannot be read is set
    aside as `step_N.corrupt` with a warning and the one before it is tried: accelerate loads every object of a
    checkpoint, so a fully loaded older one replaces whatever the unreadable one had partly loaded."""
    ckpts = list_checkpoints(run.run_dir)
    shapes = {k: tuple(v.shape) for k, v in run.raw.state_dict().items()}
    for ckpt in reversed(ckpts):
        why = architecture_mismatch(ckpt, shapes)
        if why:
            raise ValueError(why)
        try:
            load_checkpoint(run.accelerator, ckpt)
            return ckpt
        except CheckpointUnreadable as e:
            run.accelerator.wait_for_everyone()
            if run.main:
                moved = set_aside(ckpt)
                print(f"[condattn] warning: {str(e).split('. It is corrupt')[0]}; set it aside as {moved.name} and "
                      "resuming from the checkpoint before it", file=sys.stderr, flush=True)
            run.accelerator.wait_for_everyone()
    if ckpts:
        raise CheckpointUnreadable(f"no checkpoint of {run.run_dir} can be read (each was set aside as *.corrupt); "
                                   "run the same command again to start this run from step 0")
    return None


def process_settings(cfg: Any) -> bool:
    """Whether the run is deterministic; sets what cuBLAS needs before its first call (no effect on CPU)."""
    deterministic = bool(cfg.impl.deterministic)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return deterministic
