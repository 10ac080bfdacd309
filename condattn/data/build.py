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
    # (n, seed, rank, world, block=micro) -> training sampler, when the data's recipe needs a special order
    # (repeated augmentation for the ImageNet recipes); None = the trainer's EpochSampler
    sampler_factory: Callable[..., Any] | None = None
    # list of samples -> batch, when the samples are not dicts of equal-shape tensors (detection: a list of images
    # of different sizes and a list of target dicts); None = torch's default_collate
    collate_fn: Callable[[list], Any] | None = None


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


@data_builder("images")
def _images(cfg: Any) -> DataBundle:
    """ImageNet-1k (ImageFolder tree or Hugging Face copy) or an offline stand-in (MNIST 5k, digits)."""
    from .images import build_image_bundle

    return build_image_bundle(cfg)


# The other four LRA tasks: each module documents its released layout and its offline stand-in.
@data_builder("lra_text")
def _lra_text(cfg: Any) -> DataBundle:
    from . import lra_text

    return lra_text.build(cfg)


@data_builder("lra_retrieval")
def _lra_retrieval(cfg: Any) -> DataBundle:
    from . import lra_retrieval

    return lra_retrieval.build(cfg)


@data_builder("lra_image")
def _lra_image(cfg: Any) -> DataBundle:
    from . import lra_image

    return lra_image.build(cfg)


@data_builder("lra_pathfinder")
def _lra_pathfinder(cfg: Any) -> DataBundle:
    from . import pathfinder

    return pathfinder.build(cfg)


@data_builder("lm_text")
def _lm_text(cfg: Any) -> DataBundle:
    """Causal-LM text (table 5): TinyStories from disk, or the offline political-speeches stand-in (lm_text.py)."""
    from . import lm_text

    return lm_text.build(cfg)


@data_builder("mlm_text")
def _mlm_text(cfg: Any) -> DataBundle:
    """MLM pretraining text (crammed BERT): a corpus from disk (e.g. the Pile) or the offline political-speeches
    stand-in, WordPiece, packed blocks (mlm_text.py)."""
    from . import mlm_text

    return mlm_text.build(cfg)


@data_builder("glue")
def _glue(cfg: Any) -> DataBundle:
    """GLUE fine-tuning (table 3): a task of a local GLUE copy, or the offline Rotten Tomatoes stand-in (glue.py)."""
    from . import glue

    return glue.build(cfg)


@data_builder("coco")
def _coco(cfg: Any) -> DataBundle:
    """COCO instance detection / segmentation (tables 2 and 7): COCO 2017 from disk, or the offline generated shapes
    in COCO format (data/coco.py, data/shapes.py); batches are lists (collate_fn)."""
    from . import coco

    return coco.build(cfg)
