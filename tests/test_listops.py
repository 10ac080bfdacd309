"""ListOps generator and loader (condattn.data.listops)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from condattn.data import listops as L
from condattn.data.standins import listops as G

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(seed=0, min_length=20, max_length=250, max_depth=10, max_args=10)
SPLITS = ("train", "val", "test")


def evaluate(source: str) -> int:
    """Independent stack evaluator of a parenthesised ListOps string (also checks paren balance)."""
    ops = {
        "[MIN": min,
        "[MAX": max,
        "[MED": lambda v: int(np.median(v)),
        "[SM": lambda v: sum(v) % 10,
    }
    stack: list[tuple[str, list[int]]] = []
    depth, result = 0, None

    def push(value: int) -> None:
        nonlocal result
        if stack:
            stack[-1][1].append(value)
        else:
            assert result is None, "more than one top-level expression"
            result = value

    for tok in source.split():
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
            assert depth >= 0, "unbalanced ')'"
        elif tok in ops:
            stack.append((tok, []))
        elif tok == "]":
            op, values = stack.pop()
            assert len(values) >= 2, "operator with fewer than 2 arguments"
            push(ops[op](values))
        else:
            push(int(tok))
    assert depth == 0 and not stack and result is not None
    return result


def rows(path: Path) -> list[tuple[str, int]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "Source\tTarget"
    out = []
    for line in lines[1:]:
        source, target = line.split("\t")
        out.append((source, int(target)))
    return out


def length(source: str) -> int:
    return sum(tok not in ("(", ")") for tok in source.split())


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return G.generate(tmp_path_factory.mktemp("small"), 300, 60, 60, **SMALL)


def test_generate_returns_split_paths(small: dict[str, Path]) -> None:
    assert list(small) == list(SPLITS)
    assert all(p.name == f"basic_{s}.tsv" for s, p in small.items())
    assert [len(rows(small[s])) for s in SPLITS] == [300, 60, 60]
    assert not list(small["train"].parent.glob("*.tmp"))


def test_determinism_by_seed(tmp_path: Path) -> None:
    kw = dict(SMALL, n_train=40, n_val=10, n_test=10)
    a = G.generate(tmp_path / "a", **kw)
    b = G.generate(tmp_path / "b", **kw)
    c = G.generate(tmp_path / "c", **{**kw, "seed": 1})
    for s in SPLITS:
        assert a[s].read_bytes() == b[s].read_bytes()
    assert a["train"].read_bytes() != c["train"].read_bytes()


def test_format_labels_and_lengths(small: dict[str, Path]) -> None:
    for path in small.values():
        for source, target in rows(path):
            assert 0 <= target <= 9
            assert target == evaluate(source)
            n = length(source)
            assert SMALL["min_length"] < n < SMALL["max_length"]
            # left-nested pairs: an expression of length n has 2 * (n - 1) parentheses
            assert len(source.split()) - n == 2 * (n - 1)


def test_official_lengths_deep_trees(tmp_path: Path) -> None:
    paths = G.generate(tmp_path, 12, 2, 2, seed=3)  # min 500, max 2000, depth 10, args 10
    examples = [ex for p in paths.values() for ex in rows(p)]
    assert len(examples) == 16
    for source, target in examples:
        assert 500 < length(source) < 2000
        assert target == evaluate(source)


def test_no_duplicates_across_splits(small: dict[str, Path]) -> None:
    sources = [source for p in small.values() for source, _ in rows(p)]
    assert len(sources) == len(set(sources))


def test_apply_op_median_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    for n in range(2, 11):
        values = rng.integers(0, 10, n).tolist()
        assert G.apply_op(L.MED, values) == int(np.median(values))


def test_infeasible_request_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(G, "_MAX_STALE_ATTEMPTS", 2000)
    with pytest.raises(RuntimeError, match="too few distinct trees"):
        G.sample_examples(11, min_length=0, max_length=2, max_depth=1)  # only 10 single values exist
    with pytest.raises(ValueError):
        G.generate("unused", 1, 1, 1, min_length=10, max_length=11)


def test_vocab_and_encode() -> None:
    assert L.VOCAB[L.PAD_ID] == "<pad>" and L.VOCAB[L.UNK_ID] == "<unk>" and len(L.VOCAB) == 19
    assert L.NUM_CLASSES == 10
    ids = L.encode("( ( ( [MAX 2 ) 9 ) ] )", "full")
    assert [L.VOCAB[i] for i in ids] == "( ( ( [MAX 2 ) 9 ) ] )".split()
    assert L.encode("[SM 7 foo ]") == [L.TOKEN_TO_ID["[SM"], L.TOKEN_TO_ID["7"], L.UNK_ID, L.TOKEN_TO_ID["]"]]
    # the official LRA pipeline deletes ( ) and keeps ] (renamed X): the default
    assert L.encode("( ( [MIN 1 ) 2 ] )") == L.encode("[MIN 1 2 ]", "full")
    assert L.encode("( ( [MIN 1 ) 2 ] )", "lra") == L.encode("[MIN 1 2 ]", "full")
    assert L.encode("( ( [MIN 1 ) 2 ] )", "full") == L.encode("( ( [MIN 1 ) 2 ] )", "full")
    assert L.encode("( ( [MIN 1 ) 2 ] )", "no_close_bracket") == L.encode("[MIN 1 2", "full")


RELEASED = "Source\tTarget\r\n( ( ( [MAX 2 ) 9 ) ] )\t9\r\n( ( ( ( [SM 4 ) 8 ) 3 ) ] )\t5\r\n7\t7\r\n"


def test_released_format_loads(tmp_path: Path) -> None:
    path = tmp_path / "basic_val.tsv"
    path.write_bytes(RELEASED.encode())
    ds = L.ListOpsDataset(path, seq_len=12, tokenization="full")
    assert len(ds) == 3
    assert [int(ds[i]["labels"]) for i in range(3)] == [9, 5, 7]
    item = ds[0]
    assert item["input_ids"].dtype == torch.long and item["input_ids"].shape == (12,)
    assert item["labels"].dtype == torch.long and item["labels"].shape == ()
    expected = L.encode("( ( ( [MAX 2 ) 9 ) ] )", "full")
    assert item["input_ids"].tolist() == expected + [0] * (12 - len(expected))
    assert item["attention_mask"].tolist() == [1] * len(expected) + [0] * (12 - len(expected))
    # truncation: first 4 tokens kept, still padded to seq_len
    short = L.ListOpsDataset(path, seq_len=12, max_length=4, tokenization="full")[1]
    assert short["input_ids"].tolist() == L.encode("( ( ( (", "full") + [0] * 8
    assert short["attention_mask"].sum() == 4
    with pytest.raises(ValueError):
        L.ListOpsDataset(path, seq_len=4, max_length=8)


def test_generated_data_loads(small: dict[str, Path]) -> None:
    ds = L.ListOpsDataset(small["val"], seq_len=256, tokenization="lra")
    examples = rows(small["val"])
    assert ds.num_truncated == 0 and len(ds) == len(examples)
    for i, (source, target) in enumerate(examples):
        item = ds[i]
        assert int(item["labels"]) == target
        assert int(item["attention_mask"].sum()) == length(source)
        assert (item["input_ids"][item["attention_mask"] == 0] == 0).all()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Source\tTarget\n( [MIN 1 2 ] )\t1\n( [MIN 1 2 ] )\t12\n", 3),
        ("Source\tTarget\n( [MIN 1 2 ] ) 1\n", 2),
        ("Source\tTarget\n( [MIN 1 2 ] )\t1\n( [MAX 1 2 ] )\tx\n", 3),
        ("Src\tLabel\n( [MIN 1 2 ] )\t1\n", 1),
    ],
)
def test_malformed_file_names_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "basic_train.tsv"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"basic_train.tsv:{line}:"):
        L.ListOpsDataset(path, seq_len=8)


def test_find_split_files(tmp_path: Path) -> None:
    for s in SPLITS:
        (tmp_path / "flat" / f"basic_{s}.tsv").parent.mkdir(exist_ok=True)
        (tmp_path / "flat" / f"basic_{s}.tsv").write_text(RELEASED)
        (tmp_path / "release" / "listops-1000").mkdir(parents=True, exist_ok=True)
        (tmp_path / "release" / "listops-1000" / f"basic_{s}.tsv").write_text(RELEASED)
    assert L.find_split_files(tmp_path / "flat") == {s: tmp_path / "flat" / f"basic_{s}.tsv" for s in SPLITS}
    nested = L.find_split_files(tmp_path / "release")
    assert nested["test"] == tmp_path / "release" / "listops-1000" / "basic_test.tsv"
    (tmp_path / "flat" / "basic_test.tsv").unlink()
    for root in (tmp_path / "flat", tmp_path / "missing"):
        with pytest.raises(FileNotFoundError) as info:
            L.find_split_files(root)
        msg = str(info.value)
        assert str(root) in msg
        for s in SPLITS:
            assert f"basic_{s}.tsv" in msg
        assert "lra_release.gz" in msg and "python -m condattn.data.listops --out" in msg


def test_file_checksum(small: dict[str, Path], tmp_path: Path) -> None:
    expected = hashlib.sha256(b"".join(small[s].read_bytes() for s in sorted(small))).hexdigest()
    assert L.file_checksum(small) == expected
    assert L.file_checksum(dict(reversed(small.items()))) == expected
    copy = {s: tmp_path / p.name for s, p in small.items()}
    for s in SPLITS:
        copy[s].write_bytes(small[s].read_bytes())
    copy["val"].write_bytes(copy["val"].read_bytes() + b"\n")
    assert L.file_checksum(copy) != expected


@pytest.mark.slow
def test_cli(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = "--train 20 --val 5 --test 5 --seed 2 --min-length 5 --max-length 60 --max-depth 6 --max-args 4"
    cmd = [sys.executable, "-m", "condattn.data.listops", "--out", str(tmp_path), *args.split()]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for s, n in zip(SPLITS, (20, 5, 5)):
        path = tmp_path / f"basic_{s}.tsv"
        assert len(rows(path)) == n and str(path) in proc.stdout
    assert "labels" in proc.stdout and "sha256" in proc.stdout
    kw = dict(seed=2, min_length=5, max_length=60, max_depth=6, max_args=4)
    direct = G.generate(tmp_path / "direct", 20, 5, 5, **kw)
    assert direct["train"].read_bytes() == (tmp_path / "basic_train.tsv").read_bytes()


def test_ensure_generated_reuses_and_regenerates(tmp_path: Path) -> None:
    kw = dict(n_train=30, n_val=5, n_test=5, **SMALL)
    paths = G.ensure_generated(tmp_path, **kw)
    meta = json.loads((tmp_path / "generation.json").read_text())
    assert meta["seed"] == 0 and meta["n_train"] == 30 and meta["max_length"] == 250
    stamps = {s: p.stat().st_mtime_ns for s, p in paths.items()}
    first = L.file_checksum(paths)
    assert G.ensure_generated(tmp_path, **kw) == paths
    assert {s: p.stat().st_mtime_ns for s, p in paths.items()} == stamps
    G.ensure_generated(tmp_path, **{**kw, "seed": 1})
    assert json.loads((tmp_path / "generation.json").read_text())["seed"] == 1
    assert L.file_checksum(paths) != first
    G.ensure_generated(tmp_path, **{**kw, "n_val": 7})
    assert len(rows(paths["val"])) == 7
    paths["test"].unlink()  # a missing file also forces regeneration
    G.ensure_generated(tmp_path, **{**kw, "n_val": 7})
    assert len(rows(paths["test"])) == 5


def test_parse_ids_recovers_every_generated_tree(small: dict[str, Path]) -> None:
    """The trees behind the ListOps floors: parsed from the encoded ids ("]" kept), each evaluates to its label."""
    ds = L.ListOpsDataset(small["val"], seq_len=256)
    for ids, label in zip(ds.input_ids, ds.labels.tolist()):
        tree = L.parse_ids(ids)
        assert isinstance(tree, tuple) and L.tree_value(tree) == label
        assert L.evaluate_to_depth(tree, 20, {}) == label  # deep enough: exact


def test_evaluate_to_depth_guesses_below_the_depth() -> None:
    ids = L.encode("( ( ( [MAX 2 ) ( ( [MIN 7 5 ) ] ) ) ]")
    tree = L.parse_ids(ids)
    assert tree == ("[MAX", [2, ("[MIN", [7, 5])])
    assert L.tree_value(tree) == 5
    assert L.evaluate_to_depth(tree, 0, {"[MAX": 9}) == 9
    assert L.evaluate_to_depth(tree, 1, {"[MIN": 0}) == 2  # max(2, guess 0)
    assert L.evaluate_to_depth(tree, 2, {}) == 5
    assert L.parse_ids(ids[:-1]) == tree  # a truncated example closes its open lists
    assert L.parse_ids([0, 0]) is None
