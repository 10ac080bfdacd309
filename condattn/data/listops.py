"""ListOps (Long Range Arena): the loader of the released TSV format, its data builder and the generator's CLI.

Paper scale reads `basic_{train,val,test}.tsv` of the `lra_release` archive (`listops-1000/`); the smoke and small
scales generate the same files offline with the official procedure (data/standins/listops.py).

CLI: `python -m condattn.data.listops --out DIR [--train N --val N --test N --seed S ...]`.
"""

from __future__ import annotations

import argparse
import collections
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from ..utils.files import files_checksum, params_dir
from .lra_layouts import (
    END,
    LISTOPS_FOLDER,
    LISTOPS_HEADER,
    LISTOPS_SPLITS,
    MAX,
    MED,
    MIN,
    SUM_MOD,
    VALUES,
    listops_file,
    release_folders,
    where,
)
from .registry import DataBundle, register_dataset
from .standins import listops as generator

VOCAB = ["<pad>", "<unk>", *map(str, VALUES), MIN, MAX, MED, SUM_MOD, END, "(", ")"]
PAD_ID, UNK_ID = 0, 1
NUM_CLASSES = 10
TOKEN_TO_ID = {tok: i for i, tok in enumerate(VOCAB)}
# Tokens dropped before encoding (each TSV token is one id; "[MAX" etc. are single tokens).
# "lra" (default) = the official LRA input pipeline (google-research/long-range-arena
#   lra_benchmarks/listops/input_pipeline.py, `rename_close_brackets`): "(" and ")" are deleted and "]" is renamed to
#   "X" before its alphanumeric tokenizer, so operators, digits and the closing bracket remain; the Nyströmformer LRA
#   code (mlpen/Nystromformer LRA/datasets/listops.py) builds its pickles with that pipeline.
# "full" keeps every TSV token, "(" and ")" included (most official-length examples then exceed 2000 tokens).
# "no_close_bracket" also drops "]" (operators and digits only): what this project used before; the trees are then
#   ambiguous ("[MAX 1 [MIN 2 3 4" has no closing points), kept only to compare with runs made with it.
TOKENIZATIONS: dict[str, frozenset[str]] = {
    "lra": frozenset({"(", ")"}),
    "full": frozenset(),
    "no_close_bracket": frozenset({"(", ")", END}),
}
_LABELS = frozenset(map(str, range(NUM_CLASSES)))


def encode(source: str, tokenization: str = "lra") -> list[int]:
    """Token ids of a whitespace-separated source (unknown tokens -> `<unk>`); see TOKENIZATIONS."""
    drop = TOKENIZATIONS[tokenization]
    return [TOKEN_TO_ID.get(t, UNK_ID) for t in source.split() if t not in drop]


def read_tsv(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """(source, label) pairs of one TSV; ValueError naming file and line on anything malformed."""
    path = Path(path)
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().splitlines()
    if not lines or tuple(lines[0].split("\t")) != LISTOPS_HEADER:
        got = lines[0][:60] if lines else "an empty file"
        raise ValueError(f"{path}:1: expected header 'Source<TAB>Target', got {got!r}")
    examples = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        label = fields[1].strip() if len(fields) == 2 else ""
        if not (fields[0].strip() and label in _LABELS):
            raise ValueError(
                f"{path}:{lineno}: expected '<source><TAB><label 0-9>', got {line[:60]!r}"
                + ("..." if len(line) > 60 else "")
            )
        examples.append((fields[0], int(label)))
    return examples


# ----------------------------------------------------------------------------------------------------
# Trees (the ListOps floors: condattn/floors/)
# ----------------------------------------------------------------------------------------------------

Tree = int | tuple[str, list]  # a value 0-9, or (operator, children)
_OPERATOR_IDS = {TOKEN_TO_ID[op]: op for op in (MIN, MAX, MED, SUM_MOD)}
_VALUE_IDS = {TOKEN_TO_ID[str(v)]: v for v in VALUES}
_END_ID = TOKEN_TO_ID[END]


def parse_ids(ids: Any) -> Tree | None:
    """The expression tree of one encoded example (token ids, padding 0), read with "]" closing an operator's list.

    Needs a tokenization that keeps "]" ("lra", "full"); parentheses and unknown ids are skipped. Tolerant: a list
    left open (a truncated example) closes at the end, an empty one counts as the value 0, and tokens after the
    root's end are ignored. None when the ids hold no value or operator."""
    stack: list[tuple[str, list]] = []
    for i in (int(t) for t in ids):
        if i in _OPERATOR_IDS:
            stack.append((_OPERATOR_IDS[i], []))
        elif i in _VALUE_IDS or i == _END_ID:
            if i == _END_ID:
                if not stack:
                    continue
                node: Tree = stack.pop()
            else:
                node = _VALUE_IDS[i]
            if not stack:
                return node
            stack[-1][1].append(node)
    while stack:
        node = stack.pop()
        if not stack:
            return node
        stack[-1][1].append(node)
    return None


def tree_value(tree: Tree) -> int:
    """The exact value of a tree (the label of a well-formed example)."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    return generator.apply_op(op, [tree_value(c) for c in children]) if children else 0


def subtrees(tree: Tree):
    """Every operator node of a tree, the root first."""
    if isinstance(tree, int):
        return
    yield tree
    for child in tree[1]:
        yield from subtrees(child)


def evaluate_to_depth(tree: Tree, depth: int, guess: Mapping[str, int]) -> int:
    """The tree evaluated exactly through its top `depth` operator levels; an operator node below them is replaced by
    `guess[operator]` (e.g. that operator's most frequent value in the training data). depth 0: guess[root op]."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    if depth <= 0:
        return int(guess.get(op, 0))
    if not children:
        return 0
    return generator.apply_op(op, [evaluate_to_depth(c, depth - 1, guess) for c in children])


class ListOpsDataset(Dataset):
    """One ListOps TSV, encoded once into a `[N, seq_len]` uint8 tensor (ids < 256), right-padded with 0."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        seq_len: int,
        max_length: int | None = None,
        tokenization: str = "lra",
    ) -> None:
        max_length = seq_len if max_length is None else max_length
        if not 0 < max_length <= seq_len:
            raise ValueError(f"need 0 < max_length <= seq_len, got {max_length}, {seq_len}")
        if tokenization not in TOKENIZATIONS:
            raise ValueError(f"tokenization must be one of {sorted(TOKENIZATIONS)}, got {tokenization!r}")
        self.path, self.seq_len = Path(path), seq_len
        examples = read_tsv(self.path)
        ids = np.zeros((len(examples), seq_len), dtype=np.uint8)
        self.num_truncated = 0
        for i, (source, _) in enumerate(examples):
            row = encode(source, tokenization)
            self.num_truncated += len(row) > max_length
            row = row[:max_length]
            ids[i, : len(row)] = row
        self.input_ids = torch.from_numpy(ids)
        self.labels = torch.tensor([label for _, label in examples], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[index].long()
        return {"input_ids": ids, "attention_mask": (ids != PAD_ID).long(), "labels": self.labels[index]}


def find_split_files(root: str | os.PathLike[str]) -> dict[str, Path]:
    """`basic_{train,val,test}.tsv` in `root`, `root/listops-1000` or the release archive's doubled
    `lra_release/lra_release/listops-1000` (lra_layouts.release_folders)."""
    root = Path(root)
    names = {split: listops_file(split) for split in LISTOPS_SPLITS}
    for folder in release_folders(root, LISTOPS_FOLDER):
        paths = {split: folder / name for split, name in names.items()}
        if all(p.is_file() for p in paths.values()):
            return paths
    raise FileNotFoundError(
        f"ListOps data not found in {root} (looked in {where(root, LISTOPS_FOLDER)}): expected "
        f"{', '.join(names.values())}. Either download lra_release.gz (linked from the "
        "google-research/long-range-arena README: https://storage.googleapis.com/long-range-arena/"
        "lra_release.gz), unpack it and point data.root at its listops-1000 folder, or generate the "
        f"files with `python -m condattn.data.listops --out {root}`."
    )


def file_checksum(paths: Mapping[str, str | os.PathLike[str]]) -> str:
    """sha256 hex of the files' bytes, concatenated in sorted split-name order."""
    return files_checksum(paths[split] for split in sorted(paths))


def check_paper_data(cfg: Any) -> None:
    """Preflight: the three release TSVs are under `data.root`."""
    find_split_files(cfg.data.root)


@register_dataset("listops", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d = cfg.data
    if d.generate:
        gen = OmegaConf.to_container(d.generate, resolve=True)
        out = params_dir(cfg.paths.cache, "listops", gen)
        files = generator.ensure_generated(
            out, gen["train"], gen["val"], gen["test"], seed=gen["seed"], min_length=gen["min_length"],
            max_length=gen["max_length"], max_depth=gen["max_depth"], max_args=gen["max_args"],
        )
        source = f"generated offline with the official LRA ListOps procedure (stand-in for the release): {gen}"
    else:
        files = find_split_files(d.root)
        source = f"LRA release files under {d.root}"
    splits = {
        s: ListOpsDataset(files[s], d.seq_len, max_length=d.max_length, tokenization=d.tokenization)
        for s in ("train", "val", "test")
    }
    info = {
        "source": source,
        "stand_in": bool(d.generate),
        "files": {s: str(p) for s, p in files.items()},
        "sizes": {s: len(ds) for s, ds in splits.items()},
        "truncated": {s: int(ds.num_truncated) for s, ds in splits.items()},
        "tokenization": d.tokenization,
    }
    return DataBundle(splits["train"], splits["val"], splits["test"], file_checksum(files), info)


def main(argv: list[str] | None = None) -> None:
    """Generate ListOps TSVs and print counts, paths and label histograms."""
    p = argparse.ArgumentParser(prog="python -m condattn.data.listops",
                                description="ListOps (Long Range Arena): generate the release TSVs offline.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--train", type=int, default=96000)
    p.add_argument("--val", type=int, default=2000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-length", type=int, default=500)
    p.add_argument("--max-length", type=int, default=2000)
    p.add_argument("--max-depth", type=int, default=10)
    p.add_argument("--max-args", type=int, default=10)
    a = p.parse_args(argv)
    paths = generator.generate(
        a.out, a.train, a.val, a.test, a.seed, a.min_length, a.max_length, a.max_depth, a.max_args
    )
    for split, path in paths.items():
        labels = collections.Counter(label for _, label in read_tsv(path))
        hist = " ".join(f"{k}:{labels[k]}" for k in range(NUM_CLASSES))
        print(f"{split:5s} {sum(labels.values()):6d} examples  {path}  labels {hist}")
    print(f"sha256 {file_checksum(paths)}")


if __name__ == "__main__":
    main()
