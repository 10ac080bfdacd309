"""`build_datasets(cfg) -> DataBundle`: the train/val/test splits a config names, with their provenance."""

from __future__ import annotations

from typing import Any

from . import catalog  # noqa: F401  (importing it registers every dataset)
from .registry import DATASETS, DataBundle, DatasetEntry, unknown_builder

__all__ = ["DATASETS", "DataBundle", "DatasetEntry", "build_datasets", "dataset_entry"]


def dataset_entry(builder: str) -> DatasetEntry | None:
    """The registered dataset of `data.builder`, or None."""
    return DATASETS.get(builder)


def build_datasets(cfg: Any) -> DataBundle:
    entry = dataset_entry(cfg.data.builder)
    if entry is None:
        raise ValueError(unknown_builder(cfg.data.builder, cfg.data.name))
    return entry.build(cfg)
