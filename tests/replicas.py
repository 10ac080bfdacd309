"""Tiny replicas of the paper-scale datasets in their official on-disk layouts and encodings, for the tests that run
the paper-scale readers on them (tests/test_release_formats.py):

- COCO 2017 (cocodataset.org's archives): train2017/ val2017/ *.jpg (RGB and grayscale JPEGs) and
  annotations/instances_{train,val}2017.json with single- and multi-part polygons, uncompressed-RLE crowd
  annotations (`counts` a list of run lengths), category ids with gaps, an image without annotations, a crowd-only
  image and one 4-coordinate polygon (a 2-point "polygon", which pycocotools would take for a box);
- the Pile (its mirror): train/NN.jsonl.zst and val.jsonl.zst / test.jsonl.zst, zstd-compressed JSON lines
  {"text", "meta": {"pile_set_name"}}, plus SHA256SUMS.txt and per-file .md5 checksums beside them;
- the LRA release as lra_release.gz unpacks: DEST/lra_release/lra_release/{listops-1000,tsv_data,pathfinder32}, next
  to DEST/aclImdb (aclImdb_v1.tar.gz) and DEST/cifar-10-batches-py (cifar-10-python.tar.gz);
- ImageNet (ILSVRC2012 train tar per class): train/<wnid>/<wnid>_<i>.JPEG holding RGB, CMYK and grayscale JPEGs and
  PNG bytes under a .JPEG name (as a few files of the real release), val/ sorted into class folders or flat.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# ---------------------------------------------------------------------------------------------------- COCO

COCO_CATEGORIES = [{"supercategory": "person", "id": 1, "name": "person"},
                   {"supercategory": "vehicle", "id": 3, "name": "car"},
                   {"supercategory": "vehicle", "id": 7, "name": "train"}]  # ids with gaps, as COCO's 1..90


def uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE of a binary mask: run lengths over the column-major pixels, starting with 0s."""
    flat = np.asarray(mask, dtype=np.uint8).flatten(order="F")
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0] == 1:
        counts = [0, *counts]
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(c) for c in counts]}


def _polygon(cx: float, cy: float, r: float, k: int, rng: np.random.Generator) -> list[float]:
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radii = r * rng.uniform(0.7, 1.0, k)
    return [round(float(v), 2) for a, rr in zip(angles, radii) for v in (cx + rr * np.cos(a), cy + rr * np.sin(a))]


def _coco_split(folder: Path, first_id: int, n: int, rng: np.random.Generator, size=(48, 64)) -> dict:
    from pycocotools import mask as mask_util

    h, w = size
    folder.mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for k in range(n):
        image_id = first_id + k
        canvas = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(0, 80, 3)))
        draw = ImageDraw.Draw(canvas)
        objects: list[dict] = []
        if k == 1:  # an image without any annotation
            pass
        elif k == 2:  # crowd only: one uncompressed-RLE crowd region
            m = np.zeros((h, w), np.uint8)
            m[h // 4 : 3 * h // 4, w // 8 : w // 2] = 1
            objects.append({"iscrowd": 1, "segmentation": uncompressed_rle(m), "category_id": 1})
        else:
            for j in range(int(rng.integers(1, 3))):
                cat = COCO_CATEGORIES[int(rng.integers(0, 3))]["id"]
                cx, cy = rng.uniform(0.3 * w, 0.7 * w), rng.uniform(0.3 * h, 0.7 * h)
                parts = [_polygon(cx, cy, 0.18 * min(h, w), 6, rng)]
                if j == 1:  # multi-part: a second, separate piece of the same object
                    parts.append(_polygon(min(cx + 0.3 * w, w - 6), cy, 0.08 * min(h, w), 5, rng))
                objects.append({"iscrowd": 0, "segmentation": parts, "category_id": cat})
            if k == 0:  # a crowd region beside the objects, as COCO's crowds of people
                m = np.zeros((h, w), np.uint8)
                m[: h // 5, : w // 3] = 1
                objects.append({"iscrowd": 1, "segmentation": uncompressed_rle(m), "category_id": 1})
            if k == 3:  # a 2-point "polygon" (4 coordinates): real COCO has a few such annotations
                objects.append({"iscrowd": 0, "segmentation": [[5.0, 5.0, 9.0, 9.0]], "category_id": 3})
        for o in objects:
            seg = o["segmentation"]
            rle = mask_util.frPyObjects(seg, h, w) if isinstance(seg, dict) else (
                mask_util.merge(mask_util.frPyObjects(seg, h, w)) if len(seg[0]) >= 6 else None)
            if rle is not None:
                m = mask_util.decode(rle)
                colour = 200 if o["iscrowd"] else 120 + 40 * [c["id"] for c in COCO_CATEGORIES].index(o["category_id"])
                canvas.paste(Image.new("RGB", (w, h), (colour, colour, 255 - colour)),
                             mask=Image.fromarray(m * 255))
                area, bbox = float(mask_util.area(rle)), [float(v) for v in mask_util.toBbox(rle)]
            else:
                draw.line(seg[0], fill=(255, 255, 255))
                area, bbox = 0.0, [5.0, 5.0, 4.0, 4.0]
            anns.append({"id": 1000 * image_id + len(anns), "image_id": image_id, "category_id": o["category_id"],
                         "iscrowd": o["iscrowd"], "segmentation": seg, "area": area, "bbox": bbox})
        name = f"{image_id:012d}.jpg"
        (canvas.convert("L") if k % 3 == 2 else canvas).save(folder / name, "JPEG", quality=90)  # grayscale too
        images.append({"id": image_id, "file_name": name, "height": h, "width": w, "license": 1,
                       "coco_url": "", "date_captured": "2013-11-14 11:18:45", "flickr_url": ""})
    return {"info": {"description": "COCO 2017 replica"}, "licenses": [{"id": 1, "name": "replica", "url": ""}],
            "images": images, "annotations": anns, "categories": COCO_CATEGORIES}


def write_coco_release(root: Path, n_train: int = 8, n_val: int = 5, seed: int = 0,
                       val_categories: list[dict] | None = None) -> Path:
    """The COCO 2017 layout under `root` (module docstring); `val_categories` replaces val's category list."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for split, first, n in (("train", 1, n_train), ("val", 10_000, n_val)):
        data = _coco_split(root / f"{split}2017", first, n, rng)
        if split == "val" and val_categories is not None:
            data["categories"] = val_categories
        # cocodataset.org's key order: the categories come last
        (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(data))
    return root


# ---------------------------------------------------------------------------------------------------- the Pile

PILE_SETS = ("Pile-CC", "PubMed Central", "Github", "Wikipedia (en)")
WORDS = ("the model reads a long document and the data set holds many words about science history code and art "
         "while each sentence ends with a period and some numbers like 42 or 7 appear").split()


def pile_documents(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        sentences = [" ".join(rng.choice(WORDS, int(rng.integers(5, 12)))).capitalize() + "."
                     for _ in range(int(rng.integers(2, 5)))]
        docs.append({"text": f"Document {seed}-{i}. " + " ".join(sentences),
                     "meta": {"pile_set_name": PILE_SETS[i % len(PILE_SETS)]}})
    return docs


def write_pile_release(root: Path, shards: int = 2, per_shard: int = 60, n_val: int = 12, seed: int = 0) -> Path:
    """The Pile mirror layout under `root`: train/00..NN.jsonl.zst, val.jsonl.zst, test.jsonl.zst, SHA256SUMS.txt and
    a .md5 per file."""
    import zstandard

    root = Path(root)
    (root / "train").mkdir(parents=True, exist_ok=True)
    files = {root / "train" / f"{k:02d}.jsonl.zst": pile_documents(per_shard, seed + k) for k in range(shards)}
    files[root / "val.jsonl.zst"] = pile_documents(n_val, seed + 100)
    files[root / "test.jsonl.zst"] = pile_documents(n_val, seed + 200)
    sums = []
    for path, docs in files.items():
        raw = "".join(json.dumps(d) + "\n" for d in docs).encode()
        path.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
        data = path.read_bytes()
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {path.relative_to(root).as_posix()}")
        path.with_name(path.name + ".md5").write_text(f"{hashlib.md5(data).hexdigest()}  {path.name}\n")
    (root / "SHA256SUMS.txt").write_text("\n".join(sums) + "\n")
    return root


# ---------------------------------------------------------------------------------------------------- LRA


def write_lra_release(dest: Path, seed: int = 0) -> Path:
    """What `tar -xzf lra_release.gz -C DEST` leaves (the doubled lra_release/lra_release/ folder), plus IMDb and
    CIFAR-10 as their own archives unpack into DEST. Returns DEST."""
    from condattn.data.standins import listops as listops_gen
    from condattn.data.standins import lra_image, lra_retrieval, lra_text, pathfinder

    dest = Path(dest)
    release = dest / "lra_release" / "lra_release"
    listops_gen.generate(release / "listops-1000", 24, 8, 8, seed=seed, min_length=10, max_length=60, max_depth=3,
                         max_args=3)
    lra_retrieval.generate(release / "tsv_data", 16, 6, 6, seed=seed)
    pathfinder.generate(release / "pathfinder32", 20, seed=seed)
    lra_text.generate(dest, 16, 8, seed=seed)  # DEST/aclImdb
    lra_image.generate(dest, seed=seed, n=120)  # DEST/cifar-10-batches-py
    return dest


# ---------------------------------------------------------------------------------------------------- ImageNet

IMAGENET_KINDS = ("rgb", "cmyk", "gray", "png")


def imagenet_file_bytes(kind: str, rng: np.random.Generator, size=(40, 52)) -> bytes:
    """One .JPEG file's bytes: an RGB JPEG, a CMYK JPEG, a grayscale JPEG or a PNG (the release's odd files)."""
    h, w = size
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    if kind == "rgb":
        img.save(buf, "JPEG")
    elif kind == "cmyk":
        img.convert("CMYK").save(buf, "JPEG")
    elif kind == "gray":
        img.convert("L").save(buf, "JPEG")
    elif kind == "png":
        img.save(buf, "PNG")
    else:
        raise ValueError(kind)
    return buf.getvalue()


def write_imagenet_release(root: Path, wnids=("n01440764", "n01443537", "n01484850"), per_class: int = 4,
                           flat_val: bool = False, seed: int = 0) -> Path:
    """train/<wnid>/<wnid>_<i>.JPEG (each kind in turn) and val/<wnid>/ILSVRC2012_val_<k>.JPEG, or a flat val/."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    k = 0
    for c in wnids:
        for i in range(per_class):
            kind = IMAGENET_KINDS[i % len(IMAGENET_KINDS)]
            (root / "train" / c).mkdir(parents=True, exist_ok=True)
            (root / "train" / c / f"{c}_{i}.JPEG").write_bytes(imagenet_file_bytes(kind, rng))
            k += 1
            val = root / "val" if flat_val else root / "val" / c
            val.mkdir(parents=True, exist_ok=True)
            (val / f"ILSVRC2012_val_{k:08d}.JPEG").write_bytes(imagenet_file_bytes(kind, rng))
    return root
