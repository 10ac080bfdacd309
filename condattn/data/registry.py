"""The dataset registry: what a data builder returns (`DataBundle`) and, per `data.builder` name, the function
that builds it and the check that says whether its paper-scale files are there.

A dataset module registers itself with `@register_dataset(name, check=...)`; `build_datasets` and `dataset_entry`
first import every module of `MODULES` (by name, once), so that they register, then look the builder up. The
dataset modules import this one; it names them only as strings, so no import cycle closes. A new dataset is one
module with `@register_dataset(...)` plus its name in `MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    test: Dataset | None
    checksum: str  # sha256 of the files the splits were read from
    info: dict[str, Any] = field(default_factory=dict)  # source, paths, sizes: recorded in summary.json
    # (n, seed, rank, world, block=micro) -> training sampler, when the data's recipe needs a special order
    # (repeated augmentation for the ImageNet recipes); None = the trainer's EpochSampler
    sampler_factory: Callable[..., Any] | None = None
    # list of samples -> batch, when the samples are not dicts of equal-shape tensors (detection: a list of images
    # of different sizes and a list of target dicts); None = torch's default_collate
    collate_fn: Callable[[list], Any] | None = None


def data_root_exists(cfg: Any) -> None:
    """The default paper-data check: `data.root`, when the config names one, exists."""
    if cfg.data.get("root") and not Path(cfg.data.root).exists():
        raise FileNotFoundError(f"data root {cfg.data.root} does not exist (data={cfg.data.name})")


@dataclass(frozen=True)
class DatasetEntry:
    name: str  # the `data.builder` value
    build: Callable[[Any], DataBundle]  # cfg -> DataBundle
    # cfg -> None, or FileNotFoundError naming the missing path and how to prepare it (ValueError / ImportError when
    # the files are there but unusable as configured: a missing reader, class counts); cheap (no big file reads).
    # Preflight calls it at paper scale when the config generates nothing.
    check: Callable[[Any], None] = data_root_exists


DATASETS: dict[str, DatasetEntry] = {}


def register_dataset(name: str, check: Callable[[Any], None] | None = None):
    """Decorator: register `fn(cfg) -> DataBundle` as `data.builder: name`, with its paper-data `check`
    (default: `data.root` exists)."""
    def deco(fn: Callable[[Any], DataBundle]):
        if name in DATASETS and DATASETS[name].build is not fn:
            raise ValueError(f"data builder {name!r} is registered twice")
        DATASETS[name] = DatasetEntry(name, fn, check or data_root_exists)
        return fn

    return deco


def unknown_builder(builder: Any, data_name: Any) -> str:
    """The message for a `data.builder` nothing registered, naming the known ones."""
    return f"unknown data builder {builder!r} (data={data_name!r}); known: {', '.join(registered())}"


MODULES = ("listops", "images", "lra_text", "lra_retrieval", "lra_image", "pathfinder", "lm_text", "mlm_text", "glue",
           "coco")  # every dataset module (condattn/data/<name>.py)


def registered() -> dict[str, DatasetEntry]:
    """Every registered dataset: imports each of `MODULES` the first time (importing one registers it)."""
    for name in MODULES:
        importlib.import_module(f"{__package__}.{name}")
    return DATASETS


BUILDER_MODULES = {"lra_pathfinder": "pathfinder"}  # a builder registered by a module of another name


def dataset_entry(builder: str) -> DatasetEntry | None:
    """The registered dataset of `data.builder`, or None. Only the module that registers it is imported (its own
    name, or BUILDER_MODULES'): a run imports what it uses (COCO's torchvision costs a text run ~2 CPU s); an unknown
    builder imports them all (`registered`)."""
    module = BUILDER_MODULES.get(str(builder), str(builder))
    if builder not in DATASETS and module in MODULES:
        importlib.import_module(f"{__package__}.{module}")
    return DATASETS.get(builder) or registered().get(builder)


def build_datasets(cfg: Any) -> DataBundle:
    """The train/val/test splits a config names (`data.builder`), with their provenance."""
    entry = dataset_entry(cfg.data.builder)
    if entry is None:
        raise ValueError(unknown_builder(cfg.data.builder, cfg.data.name))
    return entry.build(cfg)
