"""Which data each row of a table uses, and the features a floor reads from it (pixels, texts, token ids)."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..conditioning.spec import BASELINE
from ..experiment import Experiment
from .fit import VERSION


def groups(exp: Experiment, scale: str) -> dict[str, tuple[str, list[str]]]:
    """{group: (metric, overrides)}: one per row (table 9: one per task, from its first row), the row's baseline cell
    at seed 0 composed by the same recipe as reproduce's cells (`Experiment.cell_overrides`)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for row in exp.rows_at(scale):
        group = exp.rows[row].task or row
        if group not in out:
            out[group] = (exp.row_metric(scale, row), exp.cell_overrides(row, BASELINE, scale, 0))
    return out


def pretrain_tokenizer(exp: Experiment, scale: str) -> str:
    """The tokenizer.json the pretraining cell's data builder trains (what GLUE's fine-tuning reads from its run)."""
    from ..config import compose_cell
    from ..data.registry import build_datasets

    pre = exp.pretrain
    cfg = compose_cell([*pre.overrides, *(pre.scales.get(scale) or ()), f"conditioning={BASELINE}",
                        f"scale={scale}", "seed=0"])
    return str(Path(build_datasets(cfg).info["cache"]) / "tokenizer.json")


def data_key(cfg: Any, checksum: str, info: dict) -> str:
    """sha256 of what decides the split: the data checksum, the data config (paths left out), the task's GLUE task
    and the tokenizer's checksum."""
    from omegaconf import OmegaConf

    d = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k not in ("root", "tokenizer")}
    tok = (info.get("tokenizer") or {}).get("sha256")
    blob = json.dumps({"version": VERSION, "checksum": checksum, "data": d, "glue_task": cfg.task.get("glue_task"),
                       "tokenizer": tok}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def stack(ds) -> dict[str, np.ndarray]:
    """Every item of a dataset of equal-shape tensors, stacked per key."""
    from torch.utils.data import DataLoader

    parts: dict[str, list] = defaultdict(list)
    for batch in DataLoader(ds, batch_size=512, shuffle=False):
        for k, v in batch.items():
            parts[k].append(v.numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


def pixels(ds) -> tuple[np.ndarray, np.ndarray]:
    """(raw pixels in [0, 1], labels) of an image split, before any transform (the stand-in's uint8 arrays)."""
    items = getattr(ds, "items", None)
    if items is not None and hasattr(items, "images"):
        return items.images.reshape(len(items.images), -1).astype(np.float32) / 255.0, np.asarray(items.labels)
    if hasattr(ds, "values") and hasattr(ds, "lengths"):  # LRA Image / Pathfinder pixel sequences
        return ds.values.numpy().astype(np.float32) / 255.0, ds.labels.numpy()
    raise ValueError(f"floors read in-memory images; {type(ds).__name__} has none (use the smoke/small stand-ins)")


def byte_texts(ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """LRA byte ids (byte + 1, 0 = padding) back to text."""
    return [bytes((row[m > 0] - 1).astype(np.uint8).tolist()).decode("utf-8", "replace") for row, m in zip(ids, mask)]


def wordpiece_texts(cfg: Any, data: dict, names: list[str]) -> dict[str, list[str]] | None:
    """The GLUE stand-in's inputs decoded back to text with their WordPiece tokenizer (data.tokenizer), special tokens
    left out; None when the config names no tokenizer file."""
    path = cfg.data.get("tokenizer") if hasattr(cfg.data, "get") else None
    if not path or not Path(str(path)).is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return {s: tok.decode_batch([r[m > 0].tolist() for r, m in zip(data[s]["input_ids"], data[s]["attention_mask"])])
            for s in names}


def id_words(ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """Token ids as space-separated words (padding left out), for a tf-idf over a tokenizer's tokens."""
    return [" ".join(map(str, row[m > 0].tolist())) for row, m in zip(ids, mask)]


def pair_features(first: dict, second: dict, splits: list[str]):
    """[u, v, u·v, |u − v|, cos(u, v)] of the two documents' tf-idf vectors (fitted on the training documents)."""
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = {s: (byte_texts(*first[s]), byte_texts(*second[s])) for s in splits}
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"\S+")
    vec.fit(texts["train"][0] + texts["train"][1])
    out = {}
    for s in splits:
        u, v = vec.transform(texts[s][0]), vec.transform(texts[s][1])
        uv = u.multiply(v)
        out[s] = sp.hstack([u, v, uv, abs(u - v), sp.csr_matrix(np.asarray(uv.sum(1)))]).tocsr()
    return out

