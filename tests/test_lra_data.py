"""The four LRA loaders on tiny files written in the released formats, and the offline stand-in generators."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from condattn.data import lra_common as C
from condattn.data import lra_image, lra_retrieval, lra_text
from condattn.data import pathfinder as P
from condattn.data.standins import lra_image as image_gen
from condattn.data.standins import lra_retrieval as retrieval_gen
from condattn.data.standins import lra_text as text_gen
from condattn.data.standins import pathfinder as PG
from condattn.data.standins import rotten_tomatoes as RT

# ---------------------------------------------------------------------------------------------------- common


def test_pack_and_sequence_items():
    values, lengths, cut = C.pack([b"ab", b"", b"xyz12"], max_length=4)
    assert cut == 1 and lengths.tolist() == [2, 0, 4]
    ds = C.SequenceDataset(values, lengths, [1, 0, 1], seq_len=6)
    item = ds[0]
    assert item["input_ids"].tolist() == C.byte_ids(b"ab") + [0] * 4 == [98, 99, 0, 0, 0, 0]
    assert item["attention_mask"].tolist() == [1, 1, 0, 0, 0, 0]
    assert item["input_ids"].dtype == torch.long and item["labels"].shape == ()
    assert ds[2]["input_ids"].tolist() == C.byte_ids(b"xyz12", 4) + [0, 0]
    # pixels: value 0 is a token (id 1) unless zero_is_padding
    px = np.array([[0, 5, 0, 255]], dtype=np.uint8)
    assert C.SequenceDataset(px, [4], [0], 4)[0]["input_ids"].tolist() == [1, 6, 1, 256]
    assert C.SequenceDataset(px, [4], [0], 4)[0]["attention_mask"].tolist() == [1, 1, 1, 1]
    assert C.SequenceDataset(px, [4], [0], 4, zero_is_padding=True)[0]["attention_mask"].tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="max_length"):
        C.check_lengths(8, 16)


def test_split_groups_is_a_seeded_partition():
    names = [f"m{i}" for i in range(50)] * 3
    a = RT.split_groups(names, {"train": 0.8, "test": 0.2}, seed=3)
    assert sorted(a["train"] + a["test"]) == sorted(set(names)) and len(a["test"]) == 10
    assert a == RT.split_groups(names, {"train": 0.8, "test": 0.2}, seed=3)
    assert a != RT.split_groups(names, {"train": 0.8, "test": 0.2}, seed=4)


# ---------------------------------------------------------------------------------------------------- text


def write_imdb(root: Path) -> dict:
    reviews = {
        ("train", "pos", "0_9.txt"): "  A fine film.<br /><br />Loved it \n",
        ("train", "neg", "1_2.txt"): "Dull — très ennuyeux.",
        ("train", "neg", "2_1.txt"): "x" * 40,
        ("test", "pos", "0_10.txt"): "Great!",
        ("test", "neg", "0_3.txt"): "Bad.",
    }
    for (split, lab, name), text in reviews.items():
        (root / "aclImdb" / split / lab).mkdir(parents=True, exist_ok=True)
        (root / "aclImdb" / split / lab / name).write_bytes(text.encode("utf-8"))
    (root / "aclImdb" / "train" / "unsup").mkdir()  # present in the archive, ignored
    return reviews


def test_imdb_release_layout_loads(tmp_path):
    write_imdb(tmp_path)
    for root in (tmp_path, tmp_path / "aclImdb"):
        ds, checksum, info = lra_text.load(root, seq_len=32, max_length=30, val_source="test")
        assert len(checksum) == 64 and info["sizes"] == {"train": 3, "test": 2} and info["val_is_test"]
        assert ds["val"] is ds["test"]
        train = [ds["train"][i] for i in range(3)]
        assert [int(x["labels"]) for x in train] == [0, 0, 1]  # neg files (sorted), then pos
        expected = "Dull — très ennuyeux.".encode()
        assert train[0]["input_ids"].tolist() == C.byte_ids(expected) + [0] * (32 - len(expected))
        assert int(train[1]["attention_mask"].sum()) == 30 and info["truncated"] == {"train": 2, "test": 0}
        stripped = b"A fine film.<br /><br />Loved it"  # surrounding whitespace stripped, as tfds does
        assert train[2]["input_ids"][:30].tolist() == C.byte_ids(stripped, 30)
        assert int(train[2]["attention_mask"].sum()) == 30  # 32 bytes, cut to 30


def test_imdb_validation_is_a_seeded_holdout_of_train_unless_told_test(tmp_path):
    """IMDb has no validation split: by default a seeded part of train is held out, so checkpoint selection never
    sees the test set; val_source=test is the LRA code's reading."""
    write_imdb(tmp_path)
    ds, _, info = lra_text.load(tmp_path, seq_len=32, max_length=30, val_fraction=0.34)
    assert info["val_source"] == "holdout" and not info["val_is_test"] and ds["val"] is not ds["test"]
    assert info["sizes"] == {"train": 2, "val": 1, "test": 2} and "held-out 0.34 of train" in info["validation"]
    val = ds["val"][0]["input_ids"].tolist()
    assert all(ds["train"][i]["input_ids"].tolist() != val for i in range(2))  # disjoint from what is trained
    assert all(ds["test"][i]["input_ids"].tolist() != val for i in range(2))
    again, _, _ = lra_text.load(tmp_path, seq_len=32, max_length=30, val_fraction=0.34)
    assert again["val"][0]["input_ids"].tolist() == val  # seeded
    keep, held = lra_text.holdout(1000, 0.1, seed=0)
    assert len(held) == 100 and not set(keep) & set(held) and len(keep) + len(held) == 1000
    assert lra_text.holdout(1000, 0.1, seed=1)[1].tolist() != held.tolist()
    with pytest.raises(ValueError, match="data.val_source='dev' is not one of holdout, test"):
        lra_text.load(tmp_path, 32, 30, val_source="dev")
    with pytest.raises(ValueError, match=r"data.val_fraction=1.5 must be between 0 and 1"):
        lra_text.load(tmp_path, 32, 30, val_fraction=1.5)


def test_imdb_missing_names_path_and_files(tmp_path):
    (tmp_path / "aclImdb" / "train" / "pos").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as e:
        lra_text.load(tmp_path, 64, 60)
    msg = str(e.value)
    assert str(tmp_path) in msg and "train/pos/*.txt" in msg and "test/neg/*.txt" in msg and "aclImdb_v1" in msg


def test_text_standin_is_deterministic_and_balanced(tmp_path):
    kw = dict(n_train=40, n_test=10, snippets_per_doc=3)
    a = text_gen.generate(tmp_path / "a", seed=1, **kw)
    b = text_gen.generate(tmp_path / "b", seed=1, **kw)
    c = text_gen.generate(tmp_path / "c", seed=2, **kw)
    files = sorted(p.relative_to(a) for p in a.rglob("*.txt"))
    assert len(files) == 50
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert any((a / f).read_bytes() != (c / f).read_bytes() for f in files if (c / f).exists())
    assert len(list((a / "train" / "pos").glob("*.txt"))) == 20  # balanced labels
    texts, labels, _, _ = RT.rotten_tomatoes()
    fresh = {t for t, y in zip(texts, labels) if y}
    doc = (a / "train" / "pos" / "0.txt").read_text()
    assert sum(t in doc for t in fresh) >= 3  # made of snippets of its label
    ds, _, _ = lra_text.load(a.parent, seq_len=512, max_length=500)
    assert len(ds["train"]) == 36 and len(ds["val"]) == 4 and len(ds["test"]) == 10  # 10% of train held out


# ---------------------------------------------------------------------------------------------------- retrieval

AAN = (
    b"1.0\tW04-1011\tP03-1022\tb'Automatic evaluation of \\n summaries'\tb'A maximum entropy parser'\n"
    b"0\tJ93-2004\tC00-1001\tPlain text one\tPlain \xc3\xa9 text two\r\n"
    b"\n"
    b"1\tA\tB\tshort\t" + b"y" * 20 + b"\n"
)


def write_aan(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in lra_retrieval.FILES.values():
        (folder / name).write_bytes(AAN)


def test_aan_release_format_loads(tmp_path):
    write_aan(tmp_path / "lra_release" / "tsv_data")
    for root in (tmp_path / "lra_release", tmp_path / "lra_release" / "tsv_data"):
        ds, checksum, info, files = lra_retrieval.load(root, seq_len=64, max_length=20)
        assert files["val"].name == "new_aan_pairs.eval.tsv" and len(checksum) == 64
        assert info["sizes"] == {"train": 3, "val": 3, "test": 3}
        item = ds["train"][0]
        assert set(item) == {"input_ids_0", "attention_mask_0", "input_ids_1", "attention_mask_1", "labels"}
        assert [int(ds["test"][i]["labels"]) for i in range(3)] == [1, 0, 1]
        # the bytes literal is encoded as stored (as the LRA pipeline does), cut to 20 bytes
        assert item["input_ids_0"][:20].tolist() == C.byte_ids(b"b'Automatic evaluation of \\n summaries'", 20)
        assert int(item["attention_mask_0"].sum()) == 20 and int(item["attention_mask_0"][20:].sum()) == 0
        assert info["truncated_documents"]["train"] == 2
        second = ds["train"][1]
        assert second["input_ids_1"][:17].tolist() == C.byte_ids("Plain é text two".encode())  # \r stripped
        assert int(second["attention_mask_1"].sum()) == 17


@pytest.mark.parametrize("line", [b"1\tA\tB\tonly four\n", b"2\tA\tB\tx\ty\n", b"yes\tA\tB\tx\ty\n"])
def test_aan_malformed_line_is_named(tmp_path, line):
    path = tmp_path / "new_aan_pairs.train.tsv"
    path.write_bytes(AAN + line)
    with pytest.raises(ValueError, match="new_aan_pairs.train.tsv:5:"):
        lra_retrieval.read_tsv(path)


def test_aan_missing_names_path_and_files(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        lra_retrieval.load(tmp_path / "nowhere", 64, 60)
    msg = str(e.value)
    assert str(tmp_path / "nowhere") in msg and "lra_release.gz" in msg
    assert all(n in msg for n in ("new_aan_pairs.train.tsv", "new_aan_pairs.eval.tsv", "new_aan_pairs.test.tsv"))


def test_retrieval_standin_pairs(tmp_path):
    a = retrieval_gen.generate(tmp_path / "a", 30, 8, 8, seed=5, snippets_per_doc=2)
    b = retrieval_gen.generate(tmp_path / "b", 30, 8, 8, seed=5, snippets_per_doc=2)
    c = retrieval_gen.generate(tmp_path / "c", 30, 8, 8, seed=6, snippets_per_doc=2)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a) and a["train"].read_bytes() != c["train"].read_bytes()
    movies = {}
    for split, path in a.items():
        t1, t2, labels = lra_retrieval.read_tsv(path)
        assert len(labels) == {"train": 30, "val": 8, "test": 8}[split] and sum(labels) == len(labels) // 2
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        movies[split] = {r[1].split(":")[1] for r in rows} | {r[2].split(":")[1] for r in rows}
        for label, id1, id2, _text1, _text2 in rows:
            assert (id1.split(":")[1] == id2.split(":")[1]) == (label == "1")  # 1 = same movie
            if label == "1":  # disjoint snippets of that movie
                assert not set(id1.split(":")[2].split(".")) & set(id2.split(":")[2].split("."))
    assert not movies["train"] & movies["test"] and not movies["train"] & movies["val"]


# ---------------------------------------------------------------------------------------------------- image


def write_cifar(folder: Path, per_batch: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    batches = []
    for name in (*lra_image.TRAIN_FILES, lra_image.TEST_FILE):
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * per_batch}, f, protocol=2)
        batches.append((data, labels))
    return np.concatenate([d for d, _ in batches]), np.concatenate([y for _, y in batches])


def reference_gray(rgb_row: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale on one CIFAR row (R plane, G plane, B plane), written independently."""
    r, g, b = (rgb_row[k * 1024 : (k + 1) * 1024].astype(np.float32) / np.float32(255) for k in range(3))
    gray = r * np.float32(0.2989) + g * np.float32(0.5870) + b * np.float32(0.1140)
    return np.floor(gray * np.float32(255.5)).astype(np.uint8)


def test_cifar_release_format_loads(tmp_path):
    data, labels = write_cifar(tmp_path / "cifar-10-batches-py")
    ds, checksum, info = lra_image.load(tmp_path, seq_len=1024)
    assert info["sizes"] == {"train": 18, "val": 2, "test": 4} and len(checksum) == 64  # 90 % / 10 % of 20
    first, val0, test0 = ds["train"][0], ds["val"][0], ds["test"][3]
    gray = reference_gray(data[0])
    assert np.abs(first["input_ids"].numpy() - 1 - gray.astype(int)).max() <= 1  # float rounding at most
    assert (first["input_ids"].numpy() - 1 == gray).mean() > 0.99
    assert first["attention_mask"].tolist() == [1] * 1024
    assert int(first["labels"]) == labels[0] and int(val0["labels"]) == labels[18]
    assert int(test0["labels"]) == labels[23]
    small, _, info16 = lra_image.load(tmp_path, seq_len=256, image_size=16)
    assert small["train"][0]["input_ids"].shape == (256,) and info16["image_size"] == 16
    with pytest.raises(ValueError, match="seq_len"):
        lra_image.load(tmp_path, seq_len=512)


def test_cifar_grey_planes_convert_back_exactly():
    grey = np.arange(256, dtype=np.uint8)
    rgb = np.stack([grey, grey, grey], axis=-1)
    assert (lra_image.to_grayscale(rgb) == grey).all()


def test_cifar_bad_and_missing_files(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="test_batch"):
        lra_image.load(tmp_path, 1024)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError) as e:
        lra_image.load(tmp_path, 1024)
    assert str(tmp_path) in str(e.value) and "data_batch_5" in str(e.value) and "test_batch" in str(e.value)


def test_image_standin_round_trips_through_the_loader(tmp_path):
    a = image_gen.generate(tmp_path / "a", "digits", seed=3, n=60)
    b = image_gen.generate(tmp_path / "b", "digits", seed=3, n=60)
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in (*lra_image.TRAIN_FILES, lra_image.TEST_FILE))
    ds, _, info = lra_image.load(a, seq_len=1024)
    assert info["sizes"] == {"train": 45, "val": 5, "test": 10}
    images, labels = image_gen.standin_images("digits")
    order = np.random.default_rng(3).permutation(len(images))[:60]
    test = ds["test"][0]
    assert (test["input_ids"].numpy() - 1 == images[order[0]].ravel()).all()  # grey survives the RGB planes
    assert int(test["labels"]) == labels[order[0]]


# ---------------------------------------------------------------------------------------------------- pathfinder


def write_png(path: Path, arr: np.ndarray, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(buf, format="PNG")
    path.write_bytes(buf.getvalue())


def write_pathfinder(root: Path, variant: str = "curv_contour_length_14", n: int = 20) -> list[np.ndarray]:
    """n images over metadata files 0.npy, 2.npy and 10.npy (numeric order), plus one zero-byte image."""
    base = root / "pathfinder32" / variant
    rng = np.random.default_rng(0)
    images, lines = [], {0: [], 2: [], 10: []}
    for i in range(n):
        k = (0, 2, 10)[i * 3 // n]
        img = rng.integers(0, 256, (32, 32), dtype=np.uint8)
        write_png(base / "imgs" / str(k) / f"sample_{i}.png", img)
        images.append(img)
        lines[k].append(f"imgs/{k} sample_{i}.png {i} {i % 2} 14 2\n")
    (base / "imgs" / "10" / "sample_empty.png").write_bytes(b"")
    lines[10].append("imgs/10 sample_empty.png 99 1 14 2\n")
    (base / "metadata").mkdir(parents=True)
    for k, rows in lines.items():
        (base / "metadata" / f"{k}.npy").write_text("".join(rows))
    return images


def test_pathfinder_release_layout_loads(tmp_path):
    images = write_pathfinder(tmp_path)
    for root in (tmp_path, tmp_path / "pathfinder32"):
        ds, checksum, info = P.load(root, "curv_contour_length_14", seq_len=1024, split_seed=0)
        assert info["skipped_empty_images"] == 1 and info["variant"] == "curv_contour_length_14"
        assert info["sizes"] == {"train": 16, "val": 2, "test": 2} and len(checksum) == 64
        order = np.random.default_rng(0).permutation(20)  # numeric metadata order = sample order here
        item = ds["train"][0]
        assert (item["input_ids"].numpy() - 1 == images[order[0]].ravel()).all()
        assert int(item["labels"]) == order[0] % 2
    other, _, _ = P.load(tmp_path, "curv_contour_length_14", seq_len=1024, split_seed=1)
    assert not torch.equal(other["train"][0]["input_ids"], ds["train"][0]["input_ids"])


def test_pathfinder_rgb_png_and_resize(tmp_path):
    base = tmp_path / "curv_baseline"
    rgb = np.zeros((32, 32, 3), dtype=np.uint8)
    rgb[..., 1] = 200
    for i in range(3):
        write_png(base / "imgs" / "0" / f"sample_{i}.png", rgb, mode="RGB")
    (base / "metadata").mkdir()
    (base / "metadata" / "0.npy").write_text("".join(f"imgs/0 sample_{i}.png {i} 1\n" for i in range(3)))
    ds, _, _ = P.load(tmp_path, "curv_baseline", seq_len=64, image_size=8)
    grey = np.asarray(Image.fromarray(rgb).convert("L"))[0, 0]
    assert ds["test"][0]["input_ids"].tolist() == [int(grey) + 1] * 64


def test_pathfinder_bad_metadata_and_missing(tmp_path):
    write_pathfinder(tmp_path)
    meta = tmp_path / "pathfinder32" / "curv_contour_length_14" / "metadata" / "2.npy"
    meta.write_text(meta.read_text() + "imgs/2 sample_x.png 7\n")
    with pytest.raises(ValueError, match="2.npy:"):
        P.load(tmp_path, "curv_contour_length_14", 1024)
    meta.write_text("imgs/2 sample_gone.png 7 1\n")
    with pytest.raises(FileNotFoundError, match="sample_gone.png"):
        P.load(tmp_path, "curv_contour_length_14", 1024)
    with pytest.raises(FileNotFoundError) as e:
        P.load(tmp_path, "curv_contour_length_9", 1024)
    msg = str(e.value)
    assert str(tmp_path) in msg and "curv_contour_length_9/metadata/*.npy" in msg and "lra_release.gz" in msg


def test_pathfinder_generator_is_deterministic_and_round_trips(tmp_path):
    a = PG.generate(tmp_path / "a", 12, seed=4, variant="curv_baseline", per_folder=5)
    b = PG.generate(tmp_path / "b", 12, seed=4, variant="curv_baseline", per_folder=5)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 12 + 3 and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert not np.array_equal(PG.render(4, 0, 0, contour_length=6), PG.render(5, 0, 0, contour_length=6))
    assert np.array_equal(PG.render(4, 7, 1, contour_length=6), PG.render(4, 7, 1, contour_length=6))
    ds, _, info = P.load(tmp_path / "a", "curv_baseline", seq_len=1024)
    assert sum(info["sizes"].values()) == 12 and info["positive_fraction"] == 0.5
    entries = P.read_metadata(a)
    assert [p.name for p, _ in entries[:6]] == [f"sample_{i}.png" for i in range(6)]
    assert [lab for _, lab in entries] == [i % 2 for i in range(12)]


@pytest.mark.parametrize("variant", ["curv_baseline", "curv_contour_length_14"])
def test_pathfinder_generator_geometry(variant):
    """Strokes never touch; a marker disc touches no other stroke; label 1 marks both ends of one long snake,
    label 0 one end of each."""
    for i in range(12):
        label = i % 2
        img, parts = PG.render_parts(9, i, label, contour_length=P.VARIANTS[variant])
        strokes, ends, markers = parts["strokes"], parts["ends"], parts["markers"]
        assert img.dtype == np.uint8 and img.shape == (32, 32) and len(ends) == 2
        for a in range(len(strokes)):
            for b in range(a + 1, len(strokes)):
                assert not (PG._dilate(strokes[a]) & strokes[b]).any()
        for m in markers:
            disc = PG._coverage(32, m[None], m[None], 2.0)[0] > 0
            owners = [k for k, s in enumerate(strokes) if (PG._dilate(disc) & s).any()]
            assert len(owners) == 1 and owners[0] in (0, 1)
        owner = [min(range(2), key=lambda k: min(np.abs(e - m).sum() for e in ends[k])) for m in markers]
        assert (owner[0] == owner[1]) == bool(label)
        if label:
            assert np.allclose(sorted(map(tuple, markers)), sorted(map(tuple, ends[0])))


def test_pathfinder_cli(tmp_path, capsys):
    P.main(["--out", str(tmp_path), "--n", "6", "--seed", "2", "--variant", "curv_baseline"])
    out = capsys.readouterr().out
    assert "6 images (3 connected)" in out and "sha256" in out
    assert len(list((tmp_path / "curv_baseline" / "imgs" / "0").glob("sample_*.png"))) == 6


def test_the_tables_provenance_says_how_text_was_validated():
    from helpers import experiment_raw, plan_of

    from condattn.reporting.tables import validation
    from condattn.table.observed import TableCell
    from condattn.table.provenance import provenance

    plan = plan_of(experiment_raw("table4_lra"), "small", "runs", "results")
    held = {"data": {"validation": "held-out 0.1 of train (seed 0)"}}
    def cell(row, method, s):
        return TableCell(row, method, [0], summaries=[s])

    cells = {("text", "none"): cell("text", "none", held), ("text", "spectral"): cell("text", "spectral", held),
             ("listops", "none"): cell("listops", "none", {"data": {}})}
    assert provenance(plan, cells, done=[]).validation == (("held-out 0.1 of train (seed 0)", ("text",)),)
    assert validation(provenance(plan, cells, done=[])) == \
        "; validation of text: held-out 0.1 of train (seed 0) (data.val_source)"
    assert validation(provenance(plan, {("listops", "none"): cell("listops", "none", {"data": {}})}, done=[])) == ""
