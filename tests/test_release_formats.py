"""The paper-scale readers on tiny replicas of each dataset's official release layout and encoding (tests/replicas.py):
COCO (polygons, multi-part polygons, uncompressed crowd RLE, category-id gaps, empty and crowd-only images, grayscale
JPEGs, a 4-coordinate polygon) through a Mask R-CNN run that evaluates three times; the Pile's zstd JSONL shards in a
mirror folder with checksum files; LRA's doubled lra_release/lra_release folder found from CONDATTN_DATA; ImageNet's
CMYK / grayscale / PNG-in-.JPEG files. Preflight checks the same things before any job is submitted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from replicas import (
    COCO_CATEGORIES,
    IMAGENET_KINDS,
    write_coco_release,
    write_imagenet_release,
    write_lra_release,
    write_pile_release,
)

from condattn.config import compose
from condattn.data.registry import build_datasets
from condattn.engine.preflight import preflight

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")


def data_messages(cfg) -> list[str]:
    return [p.message for p in preflight(cfg, check_run_dir=False) if p.kind == "data"]


# ---------------------------------------------------------------------------------------------------- COCO


def coco_overrides(root: Path, tmp: Path, *extra: str) -> list[str]:
    """A paper-scale table-2 config (task, scale=paper) on the replica, with the tiny XCiT and tiny image sizes."""
    return ["task=coco_maskrcnn_xcit_small", "scale=paper", "model=maskrcnn_xcit_tiny", "model.pretrained=false",
            f"data.root={root}", "data.num_classes=3", f"paths.cache={tmp / 'cache'}", f"paths.runs={tmp / 'runs'}",
            "logger=none", "task.batch_size=2", "task.steps=6", "task.eval_every=2", "task.log_every=2",
            "optim.milestones=[5]", "optim.warmup_steps=1", "impl.num_workers=0", "impl.threads=1",
            "impl.checkpoint_every=6", "diagnostics.batch_size=2", "task.augment.scales=[48,64]",
            "task.augment.max_size=96", "task.augment.crop_resize=[48,64]", "task.augment.crop_size=[32,48]",
            "task.augment.eval_size=64", "task.augment.eval_max_size=96", *extra]


def test_coco_replica_reads_every_annotation_kind(tmp_path):
    root = write_coco_release(tmp_path / "coco")
    cfg = compose(coco_overrides(root, tmp_path))
    assert data_messages(cfg) == []
    b = build_datasets(cfg)
    train, val = b.train, b.val
    assert train.cat_ids == [1, 3, 7] and b.info["categories"] == ["person", "car", "train"]
    assert b.info["skipped_annotations"]["train"] == {"polygon_parts_under_3_points": 1,
                                                      "annotations_without_a_usable_polygon": 1}
    assert b.info["skipped_annotations"]["val"]["annotations_without_a_usable_polygon"] == 1
    # training skips the empty (k=1) and crowd-only (k=2) images; validation keeps every image
    assert len(train) == 6 and len(val) == 5
    for ds in (train, val):
        for i in range(len(ds)):
            img, t = ds[i]
            assert img.shape[0] == 3 and t["masks"].shape[0] == t["boxes"].shape[0] == t["labels"].shape[0]
            assert set(t["labels"].tolist()) <= {1, 2, 3}
    _, empty = val[1]
    assert empty["boxes"].shape == (0, 4)
    crowd = [a for a in val.coco.dataset["annotations"] if a["iscrowd"]]
    assert crowd and all(isinstance(a["segmentation"]["counts"], list) for a in crowd)  # still uncompressed


def test_coco_category_lists_are_compared(tmp_path):
    other = [*COCO_CATEGORIES[:2], {"supercategory": "vehicle", "id": 8, "name": "truck"}]
    root = write_coco_release(tmp_path / "coco", val_categories=other)
    cfg = compose(coco_overrides(root, tmp_path))
    (msg,) = data_messages(cfg)
    assert "category lists differ" in msg and "ids only in train [(7, 'train')]" in msg
    assert "ids only in val [(8, 'truck')]" in msg
    with pytest.raises(ValueError, match=r"ids only in val \[\(8, 'truck'\)\]"):
        build_datasets(cfg)
    (msg,) = data_messages(compose(coco_overrides(write_coco_release(tmp_path / "ok"), tmp_path,
                                                  "data.num_classes=80")))
    assert "data.num_classes=80 but" in msg and "has 3 categories" in msg


def test_coco_categories_read_from_the_end_of_a_large_file(tmp_path):
    from condattn.data.coco import read_categories

    path = tmp_path / "big.json"
    path.write_text(json.dumps({"images": [], "annotations": [{"id": i, "pad": "x" * 50} for i in range(4000)],
                                "categories": COCO_CATEGORIES}))
    assert path.stat().st_size > 8 * 16384
    assert read_categories(path, window=16384) == COCO_CATEGORIES


@pytest.mark.slow
def test_maskrcnn_xcit_on_the_coco_replica_evaluates_three_times(tmp_path):
    """The real train entry point, paper scale (task=coco_maskrcnn_xcit_small) with the tiny XCiT: evaluations at
    steps 2, 4 and 6 each write box and mask AP (the ground truth stays decodable between them)."""
    root = write_coco_release(tmp_path / "coco")
    cmd = [sys.executable, "-m", "condattn.train", *coco_overrides(root, tmp_path, "conditioning=spectral")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    (summary,) = (tmp_path / "runs" / "paper").glob("*/summary.json")
    s = json.loads(summary.read_text())
    assert s["status"] == "finished" and s["steps"] == 6 and not s["data"]["stand_in"]
    rows = [json.loads(x) for x in (summary.parent / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("split") == "val"]
    assert [r["step"] for r in evals] == [2, 4, 6]
    for r in evals:
        assert all(-1 <= r[k] <= 1 for k in ("ap_box", "ap50_box", "ap_mask", "ap50_mask")), r
    assert "final_val_ap_mask" in s["metrics"]


# ---------------------------------------------------------------------------------------------------- the Pile


def mlm_overrides(root: Path, tmp: Path, *extra: str) -> list[str]:
    return ["task=mlm_crammed", "scale=paper", f"data.root={root}", f"paths.cache={tmp / 'cache'}",
            "data.vocab_size=300", "data.seq_len=16",
            "data.trash_cutoff=null", *extra]  # every document kept: these tests count them (trash removal is tested
                                               # in test_official_recipes)


def test_pile_zst_shards_with_checksum_files(tmp_path):
    root = write_pile_release(tmp_path / "pile")
    cfg = compose(mlm_overrides(root, tmp_path))
    assert data_messages(cfg) == []
    b = build_datasets(cfg)
    assert b.info["docs"] == {"train": 120, "val": 12} and b.info["val_split"] == "the source's validation split"
    assert sorted(Path(f).name for f in b.info["files"]) == ["00.jsonl.zst", "01.jsonl.zst", "val.jsonl.zst"]
    assert len(b.train) > 10 and int(b.train[0]["tokenizer_size"]) <= 300


def test_pile_subset_is_taken_while_streaming(tmp_path):
    """max_train_docs keeps N documents of the seeded stream; only they are written (one Arrow file), never the
    whole corpus; the same seed gives the same subset, another seed another one."""
    root = write_pile_release(tmp_path / "pile", shards=3, per_shard=50)
    subsets = {}
    for seed in (0, 0, 1):
        cfg = compose(mlm_overrides(root, tmp_path / f"s{seed}", "data.max_train_docs=40", f"data.split_seed={seed}",
                                    "data.stream_buffer=16"))
        b = build_datasets(cfg)
        assert b.info["docs"] == {"train": 40, "val": 12}
        (arrow,) = (tmp_path / f"s{seed}" / "cache" / "hf_datasets" / "corpus_subset").glob("*/train.arrow")
        import datasets

        texts = datasets.Dataset.from_file(str(arrow))["text"]
        assert len(texts) == 40
        subsets.setdefault(seed, []).append(texts)
        cached = list((tmp_path / f"s{seed}" / "cache" / "hf_datasets").rglob("*.arrow"))
        assert not any("train" in p.name and "corpus_subset" not in str(p) for p in cached)  # no whole-train Arrow
    assert subsets[0][0] == subsets[0][1] and subsets[0][0] != subsets[1][0]
    assert len({t.split(".")[0] for t in subsets[0][0]}) == 40  # 40 distinct documents


def test_pile_subset_without_validation_files_holds_out_a_seeded_fraction(tmp_path):
    root = write_pile_release(tmp_path / "pile")
    (root / "val.jsonl.zst").unlink()
    import numpy as np

    cfg = compose(mlm_overrides(root, tmp_path, "data.max_train_docs=1000", "data.val_fraction=0.25"))
    b = build_datasets(cfg)
    held = int((np.random.default_rng(0).random(120) < 0.25).sum())  # the coin of every streamed document
    assert b.info["docs"] == {"train": 120 - held, "val": held} and "seeded 0.25" in b.info["val_split"]


def test_zst_without_zstandard_is_refused_by_preflight(tmp_path, monkeypatch):
    import importlib.util

    root = write_pile_release(tmp_path / "pile")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zstandard" else real(name, *a))
    cfg = compose(mlm_overrides(root, tmp_path))
    (msg,) = data_messages(cfg)
    assert "paper-scale data unusable" in msg and "zstandard" in msg and "00.jsonl.zst" in msg
    with pytest.raises(ImportError, match="pip install zstandard"):
        build_datasets(cfg)


@pytest.mark.slow
def test_mlm_trains_on_the_zst_shards(tmp_path):
    from condattn.engine.trainer import train

    root = write_pile_release(tmp_path / "pile")
    s = train(compose([*mlm_overrides(root, tmp_path), f"paths.runs={tmp_path / 'runs'}", "logger=none",
                       "model=crammed_bert_tiny", "task.steps=2", "task.eval_every=2", "task.log_every=1",
                       "task.batch_size=4", "impl.micro_batch_size=4", "task.budget_hours=null",
                       "impl.checkpoint_every=2", "impl.num_workers=0", "data.val_max_blocks=4"]))
    assert s["status"] == "finished" and s["steps"] == 2 and not s["data"]["stand_in"]
    assert s["data"]["docs"] == {"train": 120, "val": 12} and s["metrics"]["final_val_loss"] > 0


# ---------------------------------------------------------------------------------------------------- LRA

# task -> (the table-4 row's overrides, as experiments/table4_lra.yaml, and a part of the path it must read)
LRA_TASKS = {
    "lra_listops": (["model=nystromformer_lra", "data=listops"], "listops-1000"),
    "lra_text": (["model=nystromformer_lra", "data=lra_text"], "aclImdb"),
    "lra_retrieval": (["model=nystromformer_lra_dual", "data=lra_retrieval"], "tsv_data"),
    "lra_image": (["model=nystromformer_lra", "data=lra_image"], "cifar-10-batches-py"),
    "lra_pathfinder32": (["model=nystromformer_lra", "data=lra_pathfinder"], "curv_contour_length_14"),
}


def lra_cfg(task: str, *extra: str):
    return compose([f"task={task}", *LRA_TASKS[task][0], "scale=paper", *extra])


@pytest.fixture(scope="module")
def lra_dest(tmp_path_factory):
    return write_lra_release(tmp_path_factory.mktemp("lra"))


@pytest.mark.parametrize("task", sorted(LRA_TASKS))
@pytest.mark.slow
def test_lra_tasks_read_the_release_as_it_unpacks(task, lra_dest, tmp_path, monkeypatch):
    monkeypatch.setenv("CONDATTN_DATA", str(lra_dest))
    cfg = lra_cfg(task, f"paths.cache={tmp_path}")
    assert str(cfg.data.root).startswith(str(lra_dest))  # the default data root, from CONDATTN_DATA
    assert data_messages(cfg) == []
    b = build_datasets(cfg)
    assert len(b.train) > 0 and len(b.val) > 0 and not b.info.get("stand_in")
    read = json.dumps(b.info, default=str)
    assert LRA_TASKS[task][1] in read
    if task in ("lra_listops", "lra_retrieval", "lra_pathfinder32"):
        assert "lra_release/lra_release" in read
    item = b.train[0]
    ids = item.get("input_ids", item.get("input_ids_0"))
    assert ids.dtype == torch.long and ids.numel() == int(cfg.data.seq_len)


def test_lra_single_level_layout_still_found(lra_dest, tmp_path, monkeypatch):
    import shutil

    single = tmp_path / "single"
    shutil.copytree(lra_dest / "lra_release" / "lra_release", single / "lra_release")
    monkeypatch.setenv("CONDATTN_DATA", str(single))
    for task in ("lra_listops", "lra_retrieval", "lra_pathfinder32"):
        assert data_messages(lra_cfg(task)) == []


def test_lra_missing_names_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDATTN_DATA", str(tmp_path))
    (msg,) = data_messages(lra_cfg("lra_retrieval"))
    assert f"{tmp_path}/lra_release/lra_release/tsv_data" in msg and f"{tmp_path}/lra_release/tsv_data" in msg


# ---------------------------------------------------------------------------------------------------- ImageNet


def imagenet_cfg(root: Path, *extra: str):
    return compose(["task=imagenet_deit", "scale=paper", "logger=none", f"data.root={root}", "data.img_size=32",
                    "data.num_classes=3", *extra])


def test_imagenet_replica_decodes_cmyk_gray_and_png_bytes(tmp_path):
    from PIL import Image

    root = write_imagenet_release(tmp_path / "imagenet")
    modes = {Image.open(p).mode + "/" + Image.open(p).format for p in sorted((root / "train").rglob("*.JPEG"))}
    assert {"RGB/JPEG", "CMYK/JPEG", "L/JPEG", "RGB/PNG"} <= modes  # the odd files really are there
    cfg = imagenet_cfg(root)
    assert data_messages(cfg) == []
    b = build_datasets(cfg)
    assert (len(b.train), len(b.val)) == (12, 12) and b.info["classes"] == 3
    for ds in (b.train, b.val):
        for i in range(len(IMAGENET_KINDS)):
            x = ds[i]["pixel_values"]
            assert x.shape == (3, 32, 32) and torch.isfinite(x).all()


def test_imagenet_num_classes_checked_against_the_class_folders(tmp_path):
    root = write_imagenet_release(tmp_path / "imagenet")
    cfg = imagenet_cfg(root, "data.num_classes=1000")
    (msg,) = data_messages(cfg)
    assert "data.num_classes=1000 but" in msg and "has 3 class folders" in msg
    with pytest.raises(ValueError, match="set data.num_classes=3"):
        build_datasets(cfg)


def test_imagenet_saved_copy_label_count_checked_by_preflight(tmp_path):
    import datasets
    from PIL import Image

    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    split = datasets.Dataset.from_dict({"image": [Image.new("RGB", (8, 8))] * 3, "label": [0, 1, 2]}, features=feats)
    datasets.DatasetDict({"train": split, "validation": split}).save_to_disk(str(tmp_path / "hf"))
    assert data_messages(imagenet_cfg(tmp_path / "hf")) == []
    (msg,) = data_messages(imagenet_cfg(tmp_path / "hf", "data.num_classes=1000"))
    assert "data.num_classes=1000 but the label feature of" in msg and "has 3 classes" in msg


def test_flat_imagenet_val_gets_the_sorting_help(tmp_path):
    root = write_imagenet_release(tmp_path / "imagenet", flat_val=True)
    cfg = imagenet_cfg(root)
    (msg,) = data_messages(cfg)
    assert "holds 12 files and no class folders" in msg and "valprep.sh" in msg
    assert "ILSVRC2012_validation_ground_truth.txt" in msg
    with pytest.raises(FileNotFoundError, match="torchvision.datasets.ImageNet"):
        build_datasets(cfg)
