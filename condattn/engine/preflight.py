"""Checks a composed config before any job starts: one clear message per problem, nothing trained.

`reproduce` runs `preflight` on every cell of a table before the first one trains or is submitted (a typo
must not cost a day of queue time); the `train` CLI runs it once per job. The config is checked once per run
(`check_config`): its `Checked` carries the conditioning spec and the budget on to the trainer, and the trainer
checks only what the real process count changes (the batch split).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ..checks import RESUME_MODES, value_problems, writable_problem
from ..runs import RunRecord
from .checkpoint import architecture_mismatch
from .optim import OPTIMIZERS, PROGRESS_SCHEDULES, STEP_SCHEDULES, schedule_problems


@dataclass(frozen=True)
class Problem:
    kind: str  # config | data | batch | paths | checkpoint | launcher
    message: str

    def __str__(self) -> str:
        return self.message


class PreflightError(ValueError):
    """Raised with every problem found, one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def planned_world(cfg: Any) -> int:
    """Processes one cell will run with under its launcher (1 for the in-process local launcher)."""
    lc = cfg.get("launcher") or {}
    if lc.get("name") in ("slurm", "submitit_local"):
        return int(lc.get("nodes", 1) or 1) * int(lc.get("tasks_per_node") or lc.get("gpus_per_node") or 1)
    return 1


def batch_split(cfg: Any, world: int) -> tuple[int, int, int]:
    """(global batch, per-process micro-batch, accumulation steps); ValueError on an impossible split.

    Each process takes `task.batch_size / world` samples per optimizer step. `impl.micro_batch_size` caps what one
    forward pass holds (memory): the micro-batch is the largest divisor of the per-process share that fits under the
    cap, and the rest is gradient accumulation. So any process count that divides the global batch works."""
    glob, cap = cfg.task.batch_size, cfg.impl.micro_batch_size
    if world < 1:
        raise ValueError(f"{world} processes: launcher.nodes × gpus_per_node (or tasks_per_node) must be at least 1")
    if not isinstance(glob, int) or isinstance(glob, bool) or glob < 1:
        raise ValueError(f"task.batch_size={glob!r} must be a positive integer (the global batch)")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ValueError(f"impl.micro_batch_size={cap!r} must be a positive integer (the most samples one process "
                         "holds per forward pass), or null for no cap")
    if glob % world:
        fits = [n for n in range(1, min(glob, 64) + 1) if glob % n == 0]
        raise ValueError(f"global batch task.batch_size={glob} does not split over {world} processes; use a process "
                         f"count that divides it ({', '.join(map(str, fits[:8]))}, …) or another global batch")
    share = glob // world
    micro = max(d for d in range(1, min(share, cap or share) + 1) if share % d == 0)
    return glob, micro, share // micro


def _model_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    """The state_dict shapes of the model the config trains, on the meta device (no memory, no weights): built, then
    patched by its conditioning method, since a method may add parameters (σReparam's σ, QK-norm's norms) that its
    checkpoints hold."""
    import torch

    from ..conditioning import apply_conditioning
    from ..conditioning.spec import conditioning_spec
    from ..models import build_model

    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    if "pretrained" in mcfg:
        mcfg["pretrained"] = False
    with torch.device("meta"):
        model = build_model(mcfg)
        if cfg.get("conditioning") is not None:
            apply_conditioning(model, conditioning_spec(cfg.conditioning))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@dataclass(frozen=True)
class Checked:
    """One check of a config: its problems and the values derived on the way, built once and passed down (the
    trainer and engine/setup.py read them instead of building them again). The derived values are None when the
    config has problems."""

    problems: tuple[Problem, ...]
    conditioning: Any = None  # the ConditioningSpec (conditioning/spec.py)
    budget: Any = None  # the run's Budget (engine/budget.py), for task.steps

    @property
    def messages(self) -> list[str]:
        return [p.message for p in self.problems]

    def raise_problems(self, kinds: tuple[str, ...] = ("config",)) -> Checked:
        """Raise PreflightError with the problems of these kinds; else return self."""
        if bad := [p for p in self.problems if p.kind in kinds]:
            raise PreflightError(bad)
        return self


def preflight_checked(cfg: Any, world: int | None = None, *, check_data: bool = True,
                      check_run_dir: bool = True) -> Checked:
    """Every problem of one cell's config that would stop or spoil its run: the config's choices and numbers, then
    (check_data) paper-scale data and earlier weights, then (check_run_dir) the checkpoint a resume would load; with
    the values derived from the config (Checked)."""
    world = planned_world(cfg) if world is None else world
    checked = check_config(cfg)
    out = list(checked.problems)
    try:
        batch_split(cfg, world)
    except ValueError as e:
        out.append(Problem("batch", str(e)))
    if check_data:
        out += [Problem("data", m) for m in data_problems(cfg)]
    out += [Problem("paths", m) for m in folder_problems(cfg)]
    if check_run_dir and cfg.resume == "auto":
        out += [Problem("checkpoint", m) for m in run_dir_problems(cfg)]
    if not out:
        warn_once(lam_warning(cfg))
    return replace(checked, problems=tuple(out))


def folder_problems(cfg: Any) -> list[str]:
    """The runs folder (paths.runs: run dirs, checkpoints) and, for a cell of a table (run.table set, as `reproduce`
    sets it), the results folder (paths.results: the tables) must be writable before the first cell trains: a read-only
    results folder otherwise shows up only after all training."""
    out = []
    keys = (("paths.runs", "the runs"), *((("paths.results", "the tables"),) if OmegaConf.select(cfg, "run.table")
                                          else ()))
    for key, what in keys:
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        if why := writable_problem(Path(str(value))):
            env = {"paths.runs": "CONDATTN_RUNS", "paths.results": "CONDATTN_RESULTS"}[key]
            out.append(f"{key}={value}: {why}, so {what} cannot be written there; make it writable, or point {key}= "
                       f"(or ${env}) at a writable folder")
    return out


_WARNED: set[str] = set()


def warn_once(message: str | None) -> None:
    """Print a preflight warning once per process (the cells of a table share most of them)."""
    import sys

    if message and message not in _WARNED:
        _WARNED.add(message)
        print(f"[condattn] warning: {message}", file=sys.stderr, flush=True)


_WEIGHT_STD: dict[str, float | None] = {}


def _weight_std(cfg: Any) -> float | None:
    """The median std of the linear layers' weights of the model the config builds at init (its weights' scale), built
    once per model config on the CPU with the caller's RNG left as it was; None when it cannot be built."""
    import torch

    from ..models import build_model

    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    key = OmegaConf.to_yaml(OmegaConf.create(mcfg))
    if key not in _WEIGHT_STD:
        for k in ("pretrained", "use_pretrained_backbone"):
            if k in mcfg:
                mcfg[k] = False
        for k in ("init_from", "backbone_checkpoint"):
            mcfg.pop(k, None)
        try:
            with torch.random.fork_rng(devices=[]):
                model = build_model(mcfg)
            stds = sorted(float(m.weight.detach().float().std()) for m in model.modules()
                          if isinstance(m, torch.nn.Linear) and m.weight.numel() > 1)
            _WEIGHT_STD[key] = stds[len(stds) // 2] if stds else None
        except Exception:  # noqa: BLE001 - a warning must never stop a run
            _WEIGHT_STD[key] = None
    return _WEIGHT_STD[key]


LAM_FAR = 1e4  # λ / (the weights' std) above which W is a rounding error next to λI


def lam_warning(cfg: Any) -> str | None:
    """A line when SCA's λ (identity correction) is far beyond the scale of the weights it is added to, or so large
    that fp32 rounds W away next to it (W + λI keeps log2(std / (λ·2⁻²³)) bits of W); None otherwise."""
    import math

    from ..conditioning.spec import conditioning_spec

    try:
        spec = conditioning_spec(cfg.get("conditioning") or {})
    except ValueError:  # a bad method or option: the config check names it
        return None
    if "lam" not in spec.applying:  # λ acts (the method's own rule: SCA with correction=identity)
        return None
    lam, unit = float(spec["lam"]), str(spec["lam_unit"])
    if not math.isfinite(lam) or lam <= 0 or unit == "sigma_max":
        return None
    if unit == "init_std":
        ratio, std = lam, None
    else:
        if lam <= LAM_FAR * 1e-3:  # weights at init have std ≥ 1e-3: the paper's λ = 10 builds no model to check
            return None
        std = _weight_std(cfg)
        if not std:
            return None
        ratio = lam / std
    if ratio <= LAM_FAR:
        return None
    bits = 23 - math.log2(ratio)
    kept = "fp32 rounds W away entirely next to λ" if bits < 1 else f"fp32 keeps only about {bits:.0f} of W's 24 bits"
    scale = f"its weights' std ({std:.3g}, {cfg.model.get('name')} at init)" if std else "the weights' std"
    return (f"conditioning.lam={lam:g} (lam_unit={unit}) is {ratio:.2g}× {scale}: W + λI is almost λI, and {kept}; "
            "the SCA paper uses λ = 10 (check the value, or use lam_unit=init_std)")


def preflight(cfg: Any, world: int | None = None, *, check_data: bool = True,
              check_run_dir: bool = True) -> list[Problem]:
    """`preflight_checked`'s problems."""
    return list(preflight_checked(cfg, world, check_data=check_data, check_run_dir=check_run_dir).problems)


def config_problems(cfg: Any) -> list[str]:
    """`check_config`'s problems, one line each."""
    return check_config(cfg).messages


def check_config(cfg: Any) -> Checked:
    """Unknown builders, methods, options, optimizer, schedule, budget; non-positive step counts; bad precision. The
    conditioning spec and the budget are built here, once."""
    from ..conditioning.spec import conditioning_spec
    from ..data.registry import dataset_entry, unknown_builder
    from ..models import MODEL_BUILDERS, model_problems
    from ..tasks import TASKS

    out: list[str] = []
    if cfg.model.get("builder") not in MODEL_BUILDERS:
        out.append(f"unknown model builder {cfg.model.get('builder')!r} (model={cfg.model.get('name')!r}); "
                   f"known: {', '.join(MODEL_BUILDERS)}")
    else:
        out += model_problems(cfg.model)
    if cfg.get("resume") not in RESUME_MODES:
        out.append(f"resume={cfg.get('resume')!r} must be auto (continue from the run dir's last checkpoint; a "
                   "finished run is kept) or never (start the run over)")
    spec = None
    try:
        spec = conditioning_spec(cfg.conditioning)
    except (TypeError, ValueError) as e:
        out.append(str(e))
    if cfg.task.get("kind") not in TASKS:
        out.append(f"unknown task kind {cfg.task.get('kind')!r} (task={cfg.task.get('name')!r}); "
                   f"known: {', '.join(TASKS)}")
    if dataset_entry(cfg.data.get("builder")) is None:
        out.append(unknown_builder(cfg.data.get("builder"), cfg.data.get("name")))
    optim, budget = _optim_problems(cfg)
    out += optim + value_problems(cfg)
    if out:
        return Checked(tuple(Problem("config", m) for m in out))
    return Checked((), conditioning=spec, budget=budget)


def _optim_problems(cfg: Any) -> tuple[list[str], Any]:
    """The optimizer's, schedule's, budget's and step counts' problems, and the Budget (None when it is bad)."""
    from .budget import Budget

    out: list[str] = []
    if cfg.optim.get("name") not in OPTIMIZERS:
        out.append(f"unknown optimizer optim.name={cfg.optim.get('name')!r}; known: {', '.join(OPTIMIZERS)}")
    elif cfg.optim.get("name") == "muon":
        from .muon import ADJUST_LR, muon_available

        out += [why] if (why := muon_available()) else []
        if cfg.optim.get("muon_adjust_lr", ADJUST_LR[0]) not in ADJUST_LR:
            out.append(f"optim.muon_adjust_lr={cfg.optim.get('muon_adjust_lr')!r}: choose one of {list(ADJUST_LR)}")
    try:
        from transformers import SchedulerType

        if cfg.optim.schedule not in (*PROGRESS_SCHEDULES, *STEP_SCHEDULES):
            SchedulerType(cfg.optim.schedule)
    except ValueError:
        out.append(f"unknown schedule optim.schedule={cfg.optim.schedule!r}; known: "
                   f"{', '.join([*(s.value for s in SchedulerType), *PROGRESS_SCHEDULES, *STEP_SCHEDULES])}")
    steps = cfg.task.get("steps")
    steps = steps if isinstance(steps, int) and not isinstance(steps, bool) else None
    if steps is not None:
        out += schedule_problems(cfg.optim, steps)
    budget = None
    try:
        budget = Budget.from_cfg(cfg.task, steps or 1)
    except (TypeError, ValueError) as e:
        out.append(str(e))
    for key in ("task.steps", "task.eval_every", "task.log_every", "impl.checkpoint_every"):
        v = OmegaConf.select(cfg, key)
        if not isinstance(v, int) or v < 1:
            out.append(f"{key}={v!r} must be a positive integer")
    from .precision import execution_problems

    return out + execution_problems(cfg.impl), budget


def data_problems(cfg: Any) -> list[str]:
    """Paper-scale data (each dataset's registered check), timm's cached backbone weights, earlier runs' weights."""
    from ..data.registry import data_root_exists, dataset_entry

    out: list[str] = []
    entry = dataset_entry(cfg.data.get("builder"))
    if not cfg.data.get("generate") and cfg.scale.get("real_data", cfg.scale.name == "paper"):  # paper, medium
        try:  # each dataset registers its check (data/registry.py); unknown builders get the data.root one
            (entry.check if entry is not None else data_root_exists)(cfg)
        except FileNotFoundError as e:
            out.append(f"{cfg.scale.name}-scale data missing: {e}")
        except (ImportError, ValueError) as e:  # there but not usable as configured (a reader, num_classes, ...)
            out.append(f"{cfg.scale.name}-scale data unusable: {e}")
    timm_weights = {"maskrcnn_xcit": "pretrained", "detr": "use_pretrained_backbone"}.get(cfg.model.get("builder"))
    if timm_weights and cfg.model.get(timm_weights):
        from ..models.detection import cached_timm_weights

        try:  # timm's ImageNet weights of the detection backbone, from the local Hugging Face cache only
            cached_timm_weights(str(cfg.model.backbone))
        except RuntimeError as e:
            out.append(f"model.{timm_weights}=true: {e}")
    if cfg.model.get("builder") == "detr" and cfg.model.get("backbone_weights"):
        from ..models.detection import torchvision_backbone_weights

        try:  # DETR's torchvision ResNet-50, a local file or torch.hub's cache only
            torchvision_backbone_weights(str(cfg.model.backbone_weights))
        except FileNotFoundError as e:
            out.append(str(e))
    backbone = cfg.model.get("backbone_checkpoint")
    if backbone:  # weights from an earlier run (table 2: table 1's XCiT) must exist before jobs start
        from ..models.pretrained import weights_file

        try:
            weights_file(str(backbone), cfg.model.get("runs_root") or cfg.paths.runs)
        except FileNotFoundError as e:
            out.append(f"model.backbone_checkpoint: {e}")
    return out


def run_dir_problems(cfg: Any) -> list[str]:
    """A run dir that records another science config (engine/identity.py), or a checkpoint in it that the config's
    model cannot load (another architecture)."""
    from ..models import MODEL_BUILDERS
    from .identity import config_mismatch

    if why := config_mismatch(cfg, cfg.run.dir):
        return [why]
    record = RunRecord(Path(cfg.run.dir))
    ckpt = None if record.finished else record.latest_checkpoint()
    if ckpt is None or cfg.model.get("builder") not in MODEL_BUILDERS:
        return []
    try:
        why = architecture_mismatch(ckpt, _model_shapes(cfg))
    except Exception:  # a builder or a patch that cannot run on the meta device: the trainer checks with real weights
        why = None
    return [why] if why else []
