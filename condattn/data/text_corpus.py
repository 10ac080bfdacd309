"""The MLM pretraining corpus on disk (cramming's recipe uses the Pile): its layouts, its checksum and its documents.

Paper scale reads a corpus from disk (cramming's recipe uses the Pile); nothing is downloaded. Under `data.root`
(default `$CONDATTN_DATA/pile`) the first of these layouts found is used:

    dataset_dict.json + split folders   a `datasets` DatasetDict saved with `save_to_disk`: split `train` (+ one of
                                        validation / valid / val), text in column `data.text_column` (default `text`)
    state.json + dataset_info.json      a single `datasets` Dataset saved with `save_to_disk` (training text only)
    *.parquet                           parquet files, read with `datasets`' parquet builder
    *.jsonl / *.json (also .gz/.zst/.bz2/.xz)   JSON lines, one document per record (the Pile's `train/NN.jsonl.zst`;
                                        .zst needs the `zstandard` package)
    *.txt                               plain text, one document per non-empty line

Files are searched recursively; one whose path (below root) has a part named val / valid / validation / dev is
validation text, one named test is ignored, every other one is training text. Checksum lists a mirror ships beside the
shards (SHA256SUMS.txt, MD5SUMS, checksums.txt, *.md5, ...) are not text and are skipped. A `.zst` file needs the
`zstandard` package (a dependency of condattn); without it the check fails before any job starts.

Subset (`data.max_train_docs`, cramming the-pile: `max_entries_in_raw_dataset: 8e6`, a random subset after its
shuffle). A saved dataset is shuffled with `data.split_seed` and the first N kept. Files (the Pile's shards) are not
converted whole: they are streamed (`datasets`' streaming mode) in a seeded order (shard order shuffled and a
`data.stream_buffer`-document shuffle buffer, both with `data.split_seed`; the Pile's shards already hold shuffled
documents) and only the first N training documents are written, as one Arrow file of their text column, under
`paths.cache/hf_datasets/corpus_subset/`. Without validation files each streamed document is held out as validation
with probability `data.val_fraction` (a coin seeded with `data.split_seed`) until N training documents are read.
Without `data.max_train_docs` every file is converted to Arrow and, without validation files,
`data.val_fraction` of the documents are held out with `data.split_seed`.

The run's data checksum is the sha256 of the files (of the saved splits' fingerprints for a saved
dataset); above 2 GiB of files it hashes each file's path, size and first and last MiB instead (`checksum_kind`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..utils.files import files_checksum
from . import common

FILE_KINDS = (("parquet", (".parquet",)),
              ("json", tuple(f"{b}{c}" for b in (".jsonl", ".json") for c in ("", ".gz", ".zst", ".bz2", ".xz"))),
              ("text", (".txt",)))
VAL_SPLIT_NAMES = ("validation", "valid", "val")
VAL_PART = re.compile(r"(?:^|[^a-z])(?:val|valid|validation|dev)(?:[^a-z]|$)")
TEST_PART = re.compile(r"(?:^|[^a-z])test(?:[^a-z]|$)")
# checksum lists of a mirror (SHA256SUMS.txt, md5sums, checksums.txt) and hash files (x.jsonl.zst.sha256, x.md5)
CHECKSUM_FILE = re.compile(r"^(?:(?:sha\d*|md5|b2|blake2b?)sums?|checksums?)(?:\.txt)?$|\.(?:md5|sha\d+|b2)(?:\.txt)?$")
CONTENT_HASH_LIMIT = 2 << 30  # bytes: above this the checksum reads path, size and the first and last MiB per file
EXPECTED = ("a `save_to_disk` DatasetDict (dataset_dict.json; splits train + validation/valid/val) or Dataset "
            "(state.json + dataset_info.json), or *.parquet, or *.jsonl / *.json (.gz/.zst/.bz2/.xz: one document per "
            "record, column data.text_column), or *.txt (one document per line) files, searched recursively; files "
            "under a val/valid/validation/dev name are validation text, test files are ignored")
HOW = ("Prepare the Pile (or any text corpus) on a machine with access, e.g. its train/NN.jsonl.zst shards, or "
       "`datasets.load_dataset(...).save_to_disk(ROOT)`, and point data.root at that folder.")


def _file_kind(p: Path) -> str | None:
    name = p.name.lower()
    if CHECKSUM_FILE.search(name):
        return None
    for kind, suffixes in FILE_KINDS:
        if name.endswith(suffixes):
            return kind
    return None


def find_source(root: str | os.PathLike[str]) -> tuple[str, Path, dict[str, list[Path]]]:
    """(kind, folder, {train: [...], val: [...]}) of the corpus under `root` (module docstring); kind is hf_disk or a
    `datasets` packaged builder (parquet | json | text). FileNotFoundError naming `root` and the layouts when there is
    none; ValueError when files of several kinds are mixed."""
    root = Path(root)
    if (root / "dataset_dict.json").is_file() or ((root / "state.json").is_file()
                                                  and (root / "dataset_info.json").is_file()):
        return "hf_disk", root, {}
    if root.is_dir():
        found: dict[str, dict[str, list[Path]]] = {}
        for p in sorted(root.rglob("*")):
            kind = _file_kind(p)
            if kind is None or not p.is_file():
                continue
            rel = p.relative_to(root).as_posix().lower()
            if TEST_PART.search(rel):
                continue
            found.setdefault(kind, {"train": [], "val": []})["val" if VAL_PART.search(rel) else "train"].append(p)
        found = {k: v for k, v in found.items() if v["train"]}
        if len(found) > 1:
            raise ValueError(f"{root} holds training files of several kinds ({', '.join(sorted(found))}); point "
                             "data.root at a folder with one kind")
        if found:
            kind, files = next(iter(found.items()))
            compression_support([*files["train"], *files["val"]])
            return kind, root, files
    raise common.missing("MLM pretraining corpus (crammed BERT)", root, EXPECTED, HOW)


def compression_support(paths: list[Path]) -> None:
    """ImportError naming the package and a file that needs it when a compressed file cannot be read here."""
    import importlib.util

    zst = [p for p in paths if p.name.lower().endswith(".zst")]
    if zst and importlib.util.find_spec("zstandard") is None:
        raise ImportError(f"{len(zst)} .zst file(s) (e.g. {zst[0]}) need the `zstandard` package, which is not "
                          "installed: `pip install zstandard` (a condattn dependency: rerun `make install`)")


def check_paper_data(cfg: Any) -> None:
    """Preflight: the paper-scale corpus exists (raises FileNotFoundError naming the path and the layouts) and can be
    read here (ImportError when `.zst` files lack `zstandard`)."""
    find_source(cfg.data.root)


def _stat_checksum(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        size = p.stat().st_size
        h.update(f"{p.name}|{size}|".encode())
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read(1 << 20))
    return h.hexdigest()


def source_checksum(kind: str, folder: Path, files: dict[str, list[Path]],
                    content_limit: int | None = CONTENT_HASH_LIMIT) -> tuple[str, str]:
    """(sha256, kind of checksum): `content` of the files, `stat` (path, size, first/last MiB) above `content_limit`
    bytes (None: always the content; the LM data's choice), or `fingerprint` of a saved dataset's splits."""
    if kind == "hf_disk":
        train, val = hf_disk_splits(folder)
        prints = [train._fingerprint, val._fingerprint if val is not None else ""]
        return hashlib.sha256("|".join(prints).encode()).hexdigest(), "fingerprint"
    paths = [*files.get("train", []), *files.get("val", [])]
    if content_limit is None or sum(p.stat().st_size for p in paths) <= content_limit:
        return files_checksum(paths), "content"
    return _stat_checksum(paths), "stat"


def hf_disk_splits(folder: Path):
    """(train, validation or None) of a dataset saved with `save_to_disk` (a DatasetDict, or one Dataset)."""
    import datasets

    ds = datasets.load_from_disk(str(folder))
    if isinstance(ds, datasets.Dataset):
        return ds, None
    if "train" not in ds:
        raise FileNotFoundError(f"{folder}: the saved DatasetDict has splits {list(ds)}, no `train`")
    return ds["train"], next((ds[s] for s in VAL_SPLIT_NAMES if s in ds), None)


def _load_splits(kind: str, folder: Path, files: dict[str, list[Path]], cache: Path):
    """(train, val or None) as `datasets.Dataset`s."""
    if kind == "hf_disk":
        return hf_disk_splits(folder)
    import datasets

    data_files = {"train": [str(p) for p in files["train"]]}
    if files.get("val"):
        data_files["validation"] = [str(p) for p in files["val"]]
    dd = datasets.load_dataset(kind, data_files=data_files, cache_dir=str(cache))
    return dd["train"], dd.get("validation")


class Docs:
    """A sequence of documents: a list of str, or one column of a `datasets.Dataset` (read in batches)."""

    def __init__(self, data, column: str = "text"):
        self.data, self.column = data, column
        if not isinstance(data, list) and column not in data.column_names:
            raise ValueError(f"no text column {column!r} in the corpus (columns {data.column_names}); set "
                             "data.text_column")

    def __len__(self) -> int:
        return len(self.data)

    def batches(self, size: int = 1000, limit: int | None = None) -> Iterator[list[str]]:
        n = len(self) if limit is None else min(len(self), int(limit))
        if isinstance(self.data, list):
            for s in range(0, n, size):
                yield [t for t in self.data[s : min(s + size, n)] if t and t.strip()]
            return
        data = self.data.select_columns([self.column])
        if n < len(data):
            data = data.select(range(n))
        for batch in data.iter(batch_size=size):
            yield [str(t) for t in batch[self.column] if t is not None and str(t).strip()]


class _ArrowTexts:
    """Documents appended in batches to one Arrow stream file (column `text`, the format `Dataset.from_file` maps),
    written under a temporary name and renamed when closed."""

    def __init__(self, path: Path):
        import pyarrow as pa

        self.pa, self.path, self.tmp = pa, path, path.with_name(path.name + ".partial")
        self.schema = pa.schema([("text", pa.large_string())])
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        self.sink = pa.OSFile(str(self.tmp), "wb")
        self.writer = pa.ipc.new_stream(self.sink, self.schema)
        self.buffer: list[str] = []
        self.count = 0

    def add(self, text: str) -> None:
        self.buffer.append(text)
        self.count += 1
        if len(self.buffer) >= 10_000:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            arr = self.pa.array(self.buffer, self.pa.large_string())
            self.writer.write_batch(self.pa.record_batch([arr], schema=self.schema))
            self.buffer = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.sink.close()
        os.replace(self.tmp, self.path)


def _stream_subset(kind: str, files: dict[str, list[Path]], d: Any, cache: Path, column: str, n_train: int):
    """(train, val or None) Datasets: the first n_train training documents of the seeded stream (module docstring)
    and, without validation files, the documents the seeded coin held out on the way; nothing else is converted."""
    import datasets
    import numpy as np

    seed, buffer, frac = int(d.split_seed), int(d.get("stream_buffer") or 10_000), float(d.val_fraction)
    val = None
    if files.get("val"):
        val = datasets.load_dataset(kind, data_files={"validation": [str(p) for p in files["val"]]},
                                    cache_dir=str(cache))["validation"]
    key = {"files": [(str(p), p.stat().st_size) for p in files["train"]], "seed": seed, "buffer": buffer,
           "train": n_train, "val_fraction": None if val is not None else frac, "column": column, "kind": kind}
    digest = hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:16]
    out = Path(cache) / "corpus_subset" / digest
    parts = {"train": out / "train.arrow", "val": out / "val.arrow"}
    if not all(p.is_file() for p in parts.values()):
        stream = datasets.load_dataset(kind, data_files={"train": [str(p) for p in files["train"]]},
                                       streaming=True)["train"]
        if stream.column_names is not None and column not in stream.column_names:
            raise ValueError(f"no text column {column!r} in the corpus (columns {stream.column_names}); set "
                             "data.text_column")
        coin = np.random.default_rng(seed)
        writers = {s: _ArrowTexts(p) for s, p in parts.items()}
        for row in stream.shuffle(seed=seed, buffer_size=buffer):
            text = row.get(column)
            if text is None or not str(text).strip():
                continue
            held_out = val is None and coin.random() < frac
            writers["val" if held_out else "train"].add(str(text))
            if writers["train"].count >= n_train:
                break
        for w in writers.values():
            w.close()
    train = datasets.Dataset.from_file(str(parts["train"]))
    return train, val if val is not None else datasets.Dataset.from_file(str(parts["val"]))


def corpus_documents(kind: str, folder: Path, files: dict[str, list[Path]], d: Any, cache: Path) -> tuple:
    """(train Docs, val Docs, description of the validation split) of a paper-scale source."""
    column = str(d.get("text_column") or "text")
    seed = int(d.split_seed)
    max_docs = d.get("max_train_docs")
    if kind != "hf_disk" and max_docs is not None:
        train, val = _stream_subset(kind, files, d, cache, column, int(max_docs))
        split = ("the source's validation split" if files.get("val") else
                 f"seeded {float(d.val_fraction):g} of the streamed documents (data.split_seed={seed})")
        return Docs(train, "text"), Docs(val, "text" if not files.get("val") else column), split
    train, val = _load_splits(kind, folder, files, cache)
    val_split = "the source's validation split"
    if val is None:
        parts = train.train_test_split(test_size=float(d.val_fraction), seed=seed, shuffle=True)
        train, val = parts["train"], parts["test"]
        val_split = f"seeded {float(d.val_fraction):g} of the training documents (data.split_seed={seed})"
    if max_docs is not None and int(max_docs) < len(train):
        train = train.shuffle(seed=seed).select(range(int(max_docs)))
    return Docs(train, column), Docs(val, column), val_split
