"""The ListOps stand-in: an offline generator of the released TSVs (data/listops.py reads them).

It follows the procedure of google-research/long-range-arena `lra_benchmarks/data/listops.py`:
random expression trees over MIN / MAX / MED / SUM_MOD with values 0-9, kept when
`min_length < length < max_length` (length counts operators, values and `]`, not parentheses), written
as `basic_{train,val,test}.tsv` with a `Source\\tTarget` header. Sources are built as strings directly
(no deeply nested tuples), and a tree is abandoned as soon as it reaches `max_length`: it would be
rejected anyway and every tree draws fresh random numbers, so the accepted trees have the official
distribution. Randomness comes from one `random.Random(seed)`, so the files are a function of the seed.

CLI: `python -m condattn.data.listops --out DIR [--train N --val N --test N --seed S ...]`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from ...utils.files import ensure_generated as ensure_recorded
from ...utils.files import write_text_atomic
from ..lra_layouts import LISTOPS_HEADER, LISTOPS_SPLITS, MAX, MED, MIN, OPERATORS, SUM_MOD, VALUES, listops_file

VALUE_P = 0.25
GENERATOR_VERSION = 1
_MAX_STALE_ATTEMPTS = 1_000_000


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


def write_tsv(path: Path, examples: list[tuple[str, int]]) -> None:
    """Write examples in the released LRA layout (`Source\\tTarget` header, one example a line)."""
    lines = ["\t".join(LISTOPS_HEADER)] + [f"{source}\t{label}" for source, label in examples]
    write_text_atomic(path, "\n".join(lines) + "\n")


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
        paths[split] = out / listops_file(split)
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
    paths = {split: Path(out_dir) / listops_file(split) for split in LISTOPS_SPLITS}
    ensure_recorded(out_dir, params, [p.name for p in paths.values()], lambda out: generate(
        out, n_train, n_val, n_test, seed, min_length, max_length, max_depth, max_args))
    return paths
