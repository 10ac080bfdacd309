"""ListOps (Long Range Arena): an offline generator and a loader for the released TSV format.

The generator follows the procedure of google-research/long-range-arena `lra_benchmarks/data/listops.py`:
random expression trees over MIN / MAX / MED / SUM_MOD with values 0-9, kept when
`min_length < length < max_length` (length counts operators, values and `]`, not parentheses), written
as `basic_{train,val,test}.tsv` with a `Source\\tTarget` header. Sources are built as strings directly
(no deeply nested tuples), and a tree is abandoned as soon as it reaches `max_length`: it would be
rejected anyway and every tree draws fresh random numbers, so the accepted trees have the official
distribution. Randomness comes from one `random.Random(seed)`, so the files are a function of the seed.

CLI: `python -m condattn.data.listops --out DIR [--train N --val N --test N --seed S ...]`.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUES = tuple(range(10))
VALUE_P = 0.25
SPLITS = ("train", "val", "test")
HEADER = ("Source", "Target")
GENERATOR_VERSION = 1

VOCAB = ["<pad>", "<unk>", *map(str, VALUES), MIN, MAX, MED, SUM_MOD, END, "(", ")"]
PAD_ID, UNK_ID = 0, 1
NUM_CLASSES = 10
TOKEN_TO_ID = {tok: i for i, tok in enumerate(VOCAB)}
# Tokens dropped before encoding. "full" keeps every token of the TSV. "no_parens" keeps operators,
# values and "]" (S4-style). "lra" keeps what the official LRA input pipeline keeps (its tfds
# Tokenizer splits on non-alphanumerics: operators and values only), which the Nystromformer
# LRA code inherits.
TOKENIZATIONS: dict[str, frozenset[str]] = {
    "full": frozenset(),
    "no_parens": frozenset({"(", ")"}),
    "lra": frozenset({"(", ")", END}),
}
_LABELS = frozenset(map(str, range(NUM_CLASSES)))
_MAX_STALE_ATTEMPTS = 1_000_000


# ----------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------


class _TooLong(Exception):
    """Raised to abandon a tree that has reached `max_length`."""


def apply_op(op: str, values: list[int]) -> int:
    """Value of operator `op` on `values` (MED is `int(np.median(values))`, SM is the sum mod 10)."""
    if op == MIN:
        return min(values)
    if op == MAX:
        return max(values)
    if op == MED:
        s = sorted(values)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    if op == SUM_MOD:
        return sum(values) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


class _TreeSampler:
    """Samples one LRA ListOps tree at a time as (source string, label, length)."""

    def __init__(self, rng: random.Random, max_depth: int, max_args: int, max_length: int) -> None:
        self.rng, self.max_depth, self.max_args, self.max_length = rng, max_depth, max_args, max_length
        self.length = 0

    def sample(self) -> tuple[str, int, int] | None:
        """A tree from depth 1, or None if it reached `max_length` (and so would be rejected)."""
        self.length = 0
        try:
            source, label = self._node(1)
        except _TooLong:
            return None
        return source, label, self.length

    def _grow(self, n: int) -> None:
        self.length += n
        if self.length >= self.max_length:
            raise _TooLong

    def _node(self, depth: int) -> tuple[str, int]:
        # Same draw order as the official generator: r, then a value or (num_args, children, operator).
        r = self.rng.random() if depth < self.max_depth else 1.0
        if r > VALUE_P:
            self._grow(1)
            value = self.rng.choice(VALUES)
            return str(value), value
        self._grow(2)  # operator + END
        num_args = self.rng.randint(2, self.max_args)
        children = [self._node(depth + 1) for _ in range(num_args)]
        op = self.rng.choice(OPERATORS)
        # The left-nested tuple ((((op, c0), c1), ...), END) printed with "( a b )" per pair.
        source = "( " * (num_args + 1) + op + " " + " ) ".join(c for c, _ in children) + " ) ] )"
        return source, apply_op(op, [v for _, v in children])


def sample_examples(
    n: int,
    seed: int = 0,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
) -> list[tuple[str, int]]:
    """`n` distinct (source, label) pairs with `min_length < length < max_length`, in sampling order."""
    _check_params(n, min_length, max_length, max_depth, max_args)
    sampler = _TreeSampler(random.Random(seed), max_depth, max_args, max_length)
    examples: dict[str, int] = {}
    stale = 0
    while len(examples) < n:
        tree = sampler.sample()
        if tree is not None and tree[2] > min_length and tree[0] not in examples:
            examples[tree[0]] = tree[1]
            stale = 0
            continue
        stale += 1
        if stale > _MAX_STALE_ATTEMPTS:
            raise RuntimeError(
                f"ListOps: no new example in {_MAX_STALE_ATTEMPTS} trees after {len(examples)} of {n}; "
                f"lengths ({min_length}, {max_length}), max_depth {max_depth}, max_args {max_args} "
                "admit too few distinct trees"
            )
    return list(examples.items())


def _check_params(n: int, min_length: int, max_length: int, max_depth: int, max_args: int) -> None:
    if n < 0:
        raise ValueError(f"number of examples must be >= 0, got {n}")
    if min_length < 0 or max_length <= min_length + 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got {min_length}, {max_length}")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file next to `path`, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_tsv(path: Path, examples: list[tuple[str, int]]) -> None:
    """Write examples in the released LRA layout (`Source\\tTarget` header, one example a line)."""
    lines = ["\t".join(HEADER)] + [f"{source}\t{label}" for source, label in examples]
    _write_atomic(path, "\n".join(lines) + "\n")


def generate(
    out_dir: str | os.PathLike[str],
    n_train: int,
    n_val: int,
    n_test: int,
    seed: int = 0,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
) -> dict[str, Path]:
    """Generate distinct examples, split them train/val/test in sampling order, write `basic_*.tsv`."""
    counts = {"train": n_train, "val": n_val, "test": n_test}
    for split, n in counts.items():
        if n < 0:
            raise ValueError(f"n_{split} must be >= 0, got {n}")
    examples = sample_examples(sum(counts.values()), seed, min_length, max_length, max_depth, max_args)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths, start = {}, 0
    for split, n in counts.items():
        paths[split] = out / f"basic_{split}.tsv"
        write_tsv(paths[split], examples[start : start + n])
        start += n
    return paths


def ensure_generated(
    out_dir: str | os.PathLike[str],
    n_train: int,
    n_val: int,
    n_test: int,
    seed: int = 0,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
) -> dict[str, Path]:
    """The files in `out_dir` if its `generation.json` records exactly these parameters, else generate."""
    params = {
        "generator_version": GENERATOR_VERSION,
        "n_train": n_train,
        "n_val": n_val,
        "n_test": n_test,
        "seed": seed,
        "min_length": min_length,
        "max_length": max_length,
        "max_depth": max_depth,
        "max_args": max_args,
    }
    out = Path(out_dir)
    meta = out / "generation.json"
    paths = {split: out / f"basic_{split}.tsv" for split in SPLITS}
    if meta.is_file() and all(p.is_file() for p in paths.values()):
        try:
            if json.loads(meta.read_text(encoding="utf-8")) == params:
                return paths
        except json.JSONDecodeError:
            pass
    meta.unlink(missing_ok=True)  # never leave a record that describes files being replaced
    paths = generate(out, n_train, n_val, n_test, seed, min_length, max_length, max_depth, max_args)
    _write_atomic(meta, json.dumps(params, indent=2, sort_keys=True) + "\n")
    return paths


# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------


def encode(source: str, tokenization: str = "full") -> list[int]:
    """Token ids of a whitespace-separated source (unknown tokens -> `<unk>`); see TOKENIZATIONS."""
    drop = TOKENIZATIONS[tokenization]
    return [TOKEN_TO_ID.get(t, UNK_ID) for t in source.split() if t not in drop]


def read_tsv(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """(source, label) pairs of one TSV; ValueError naming file and line on anything malformed."""
    path = Path(path)
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().splitlines()
    if not lines or tuple(lines[0].split("\t")) != HEADER:
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


class ListOpsDataset(Dataset):
    """One ListOps TSV, encoded once into a `[N, seq_len]` uint8 tensor (ids < 256), right-padded with 0."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        seq_len: int,
        max_length: int | None = None,
        tokenization: str = "full",
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
    """`basic_{train,val,test}.tsv` in `root` or `root/listops-1000` (the release archive layout)."""
    root = Path(root)
    names = {split: f"basic_{split}.tsv" for split in SPLITS}
    for folder in (root, root / "listops-1000"):
        paths = {split: folder / name for split, name in names.items()}
        if all(p.is_file() for p in paths.values()):
            return paths
    raise FileNotFoundError(
        f"ListOps data not found in {root} (nor in {root / 'listops-1000'}): expected "
        f"{', '.join(names.values())}. Either download lra_release.gz (linked from the "
        "google-research/long-range-arena README: https://storage.googleapis.com/long-range-arena/"
        "lra_release.gz), unpack it and point data.root at its listops-1000 folder, or generate the "
        f"files with `python -m condattn.data.listops --out {root}`."
    )


def file_checksum(paths: Mapping[str, str | os.PathLike[str]]) -> str:
    """sha256 hex of the files' bytes, concatenated in sorted split-name order."""
    digest = hashlib.sha256()
    for split in sorted(paths):
        with open(paths[split], "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Generate ListOps TSVs and print counts, paths and label histograms."""
    p = argparse.ArgumentParser(prog="python -m condattn.data.listops", description=__doc__.splitlines()[0])
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
    paths = generate(
        a.out, a.train, a.val, a.test, a.seed, a.min_length, a.max_length, a.max_depth, a.max_args
    )
    for split, path in paths.items():
        labels = collections.Counter(label for _, label in read_tsv(path))
        hist = " ".join(f"{k}:{labels[k]}" for k in range(NUM_CLASSES))
        print(f"{split:5s} {sum(labels.values()):6d} examples  {path}  labels {hist}")
    print(f"sha256 {file_checksum(paths)}")


if __name__ == "__main__":
    main()
