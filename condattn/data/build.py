"""`build_datasets(cfg) -> DataBundle`: the train/val/test splits a config names, with their provenance."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch.utils.data import Dataset


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    test: Dataset | None
    checksum: str  # sha256 of the files the splits were read from
    info: dict[str, Any] = field(default_factory=dict)  # source, paths, sizes: recorded in summary.json


DATA_BUILDERS: dict[str, Callable[[Any], DataBundle]] = {}


def data_builder(name: str):
    def deco(fn):
        DATA_BUILDERS[name] = fn
        return fn

    return deco


def build_datasets(cfg: Any) -> DataBundle:
    builder = cfg.data.builder
    if builder not in DATA_BUILDERS:
        known = ", ".join(DATA_BUILDERS)
        raise ValueError(f"unknown data builder {builder!r} (data={cfg.data.name!r}); known: {known}")
    return DATA_BUILDERS[builder](cfg)


def _params_dir(cache: str | Path, name: str, params: dict) -> Path:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache) / name / digest


@data_builder("listops")
def _listops(cfg: Any) -> DataBundle:
    from . import listops

    d = cfg.data
    if d.generate:
        gen = OmegaConf.to_container(d.generate, resolve=True)
        out = _params_dir(cfg.paths.cache, "listops", gen)
        files = listops.ensure_generated(
            out, gen["train"], gen["val"], gen["test"], seed=gen["seed"], min_length=gen["min_length"],
            max_length=gen["max_length"], max_depth=gen["max_depth"], max_args=gen["max_args"],
        )
        source = f"generated offline with the official LRA ListOps procedure (stand-in for the release): {gen}"
    else:
        files = listops.find_split_files(d.root)
        source = f"LRA release files under {d.root}"
    splits = {
        s: listops.ListOpsDataset(files[s], d.seq_len, max_length=d.max_length, tokenization=d.tokenization)
        for s in ("train", "val", "test")
    }
    info = {
        "source": source,
        "stand_in": bool(d.generate),
        "files": {s: str(p) for s, p in files.items()},
        "sizes": {s: len(ds) for s, ds in splits.items()},
        "truncated": {s: int(ds.num_truncated) for s, ds in splits.items()},
        "tokenization": d.tokenization,
    }
    return DataBundle(splits["train"], splits["val"], splits["test"], listops.file_checksum(files), info)
