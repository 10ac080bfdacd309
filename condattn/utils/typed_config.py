"""Typed views of the `impl`, `optim` and `task` config groups: every key the code reads, with its default.

The YAML is the config (configs/impl/default.yaml, configs/optim/adamw.yaml, each task's recipe); these dataclasses
are what the code reads it through, so a key absent from a node (a recipe that does not use it, a plain dict passed
by a test or a library caller) gets the one default written here, and not one per call site. A key set to null takes
the default too (null means "the default" in these groups). tests/test_typed_configs.py checks that the defaults
equal the YAML's. Keys a group's YAML has beyond these (a task kind's own keys: augment, rcnn, ...) are read from the
node itself.

`impl_config(node)`, `optim_config(node)`, `task_config(node)` build a view from any Mapping (a dict or an OmegaConf
DictConfig, read by duck typing: this module imports neither Hydra nor OmegaConf) or from an object with attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ImplConfig:
    """How a run is run (configs/impl/default.yaml); only precision and threads change a result."""

    micro_batch_size: int | None = None
    precision: str = "no"
    cpu_precision: str = "no"
    compile: bool = False
    cpu_compile: Any = False  # true | false | auto (engine/precision.py: compile past the measured break-even)
    compile_cost: Mapping[str, Any] = field(default_factory=dict)  # {model.name: {compile_s, eager_step_s, ...}}
    compile_mode: str = "default"
    fused_adamw: Any = "auto"  # auto | true | false (YAML may give a bool)
    num_workers: int = 0
    pin_memory: bool = False
    deterministic: bool = False
    threads: int | None = None
    flush_denormal: bool = True
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    max_loss: float | None = None
    worker_samples_per_s: Mapping[str, float] = field(
        default_factory=lambda: {"images": 126, "cifar": 1179, "coco": 21})
    val_samples: Mapping[str, int] = field(default_factory=lambda: dict(VAL_SAMPLES))


# validation samples one evaluation reads at paper scale, by data.source / data.name / data.builder (the dry run's time
# estimate counts the evaluations: configs/impl/default.yaml)
VAL_SAMPLES = {"listops": 2000, "lra_text": 25000, "lra_retrieval": 18090, "lra_image": 10000, "lra_pathfinder": 20000,
               "imagenet": 50000}


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer and its schedule (configs/optim/adamw.yaml, then the task recipe's keys)."""

    name: str = "adamw"
    lr: float = 1.0e-4
    lr_ref_batch: int | None = None
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1.0e-8
    schedule: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float | None = None
    clip_grad_norm: float | None = None
    # recipe keys (not in adamw.yaml): the schedules of engine/optim.py and the parameter groups
    anneal: str = "linear"  # onecycle
    min_lr: float | None = None  # timm_cosine
    warmup_lr: float | None = None  # timm_cosine
    cooldown_steps: int = 0  # timm_cosine
    steps_per_epoch: int | None = None  # timm_cosine
    warmup_prefix: bool = False  # timm_cosine
    scale_floors: bool = False  # timm_cosine
    milestones: Sequence[int] | None = None  # multistep
    gamma: float = 0.1  # multistep
    warmup_start_factor: float = 0.0  # multistep
    lr_multipliers: Mapping[str, float] | None = None
    no_decay_names: Sequence[str] | None = None
    # optim=muon (configs/optim/muon.yaml, engine/muon.py): torch.optim.Muon's settings for the 2-D hidden weights
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns_steps: int = 5
    muon_adjust_lr: str = "match_rms_adamw"


# the keys every task recipe sets (configs/task/*.yaml); the others have defaults
TASK_REQUIRED = ("name", "kind", "metric", "steps", "batch_size", "eval_every", "log_every")


@dataclass(frozen=True)
class TaskConfig:
    """What a task's recipe says (the `task:` node of configs/task/*.yaml)."""

    name: str | None = None
    kind: str | None = None
    metric: str | None = None
    steps: int | None = None
    batch_size: int | None = None
    eval_every: int | None = None
    log_every: int | None = None
    save_best: bool = True  # keep the best validation checkpoint for the test protocol
    budget_hours: float | None = None  # engine/budget.py
    batch_size_ramp: float | None = None
    batch_size_ramp_rule: str = "cramming"
    repeated_aug: int = 1  # DeiT's repeated augmentation (data/images.py)
    label_smoothing: float = 0.0  # classification
    top5: bool = False
    mixup: Mapping[str, Any] | None = None
    num_classes: int | None = None
    mlm_probability: float = 0.25  # mlm (bert-o4)
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    eval_seed: int = 0


def typed(cls: type[T], node: Any) -> T:
    """`cls` from the keys of `node` it declares (a Mapping or an object with attributes); absent or null keys take
    the defaults. A view of a view is itself."""
    if isinstance(node, cls):
        return node
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if isinstance(node, Mapping):
            v = node.get(f.name)
        else:
            v = getattr(node, f.name, None)
        if v is not None:
            values[f.name] = v  # as given (a DictConfig node stays one: its readers use attributes)
    return cls(**values)


def impl_config(node: Any) -> ImplConfig:
    return typed(ImplConfig, node)


def optim_config(node: Any) -> OptimConfig:
    return typed(OptimConfig, node)


def task_config(node: Any) -> TaskConfig:
    return typed(TaskConfig, node)
