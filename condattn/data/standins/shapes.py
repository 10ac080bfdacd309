"""A generated COCO-format instance-segmentation dataset of shapes: the offline stand-in for COCO (tables 2 and 7).

Each image has a smooth random background with noise and 1..`max_objects` filled shapes (circle, rectangle, triangle,
and optionally ellipse / diamond) of random size, colour and place; later shapes occlude earlier ones, so an
instance's mask is what stays visible. Instances with fewer than `min_area` visible pixels are dropped. Everything is
written as real COCO files, so the smoke and small scales read it with the same loader as COCO itself:

    <out>/annotations/instances_train.json   <out>/train/000000000001.png ...
    <out>/annotations/instances_val.json     <out>/val/000000000001.png ...

Annotations carry `bbox` (x, y, w, h of the visible mask), `area` (visible pixels), `segmentation` (compressed RLE,
pycocotools), `iscrowd` 0. Deterministic: the same parameters (and seed) give byte-identical files. The caller
(data/coco.py) places them under `paths.cache` in a directory named by a digest of the parameters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...utils.files import ensure_generated as ensure_recorded

SHAPES = ("circle", "rectangle", "triangle", "ellipse", "diamond")


def _shape_mask(kind: str, h: int, w: int, rng: np.random.Generator, min_frac: float, max_frac: float) -> np.ndarray:
    """A filled shape of `kind` at a random place and size, as an (h, w) bool mask (may be cut by the image border)."""
    from PIL import Image, ImageDraw

    size = float(rng.uniform(min_frac, max_frac)) * min(h, w)
    cx, cy = float(rng.uniform(0.1, 0.9)) * w, float(rng.uniform(0.1, 0.9)) * h
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    r = size / 2
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=1)
    elif kind == "ellipse":
        ry = r * float(rng.uniform(0.35, 0.6))
        draw.ellipse([cx - r, cy - ry, cx + r, cy + ry], fill=1)
    elif kind == "rectangle":
        aspect = float(rng.uniform(0.5, 1.0))
        rw, rh = (r, r * aspect) if rng.random() < 0.5 else (r * aspect, r)
        draw.rectangle([cx - rw, cy - rh, cx + rw, cy + rh], fill=1)
    elif kind == "diamond":
        draw.polygon([(cx, cy - r), (cx + 0.7 * r, cy), (cx, cy + r), (cx - 0.7 * r, cy)], fill=1)
    elif kind == "triangle":
        a = float(rng.uniform(0, 2 * np.pi))
        pts = [(cx + r * np.cos(a + k * 2 * np.pi / 3), cy + r * np.sin(a + k * 2 * np.pi / 3)) for k in range(3)]
        draw.polygon(pts, fill=1)
    else:
        raise ValueError(f"unknown shape {kind!r}; known: {', '.join(SHAPES)}")
    return np.asarray(canvas, dtype=bool)


def _background(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = np.linspace(0, 1, w)[None, :, None] if rng.random() < 0.5 else np.linspace(0, 1, h)[:, None, None]
    img = c0 * (1 - t) + c1 * t + rng.normal(0, 12, (h, w, 3))
    return np.broadcast_to(img, (h, w, 3)).copy()


def _image(image_id: int, rng: np.random.Generator, p: dict[str, Any], ann_id: int) -> tuple[np.ndarray, list[dict]]:
    from pycocotools import mask as mask_util

    h, w = (int(rng.integers(p["min_size"], p["max_size"] + 1)) for _ in range(2))
    img = _background(h, w, rng)
    n = int(rng.integers(p["min_objects"], p["max_objects"] + 1))
    instances: list[tuple[int, np.ndarray]] = []
    for _ in range(n):
        cls = int(rng.integers(len(p["classes"])))
        m = _shape_mask(p["classes"][cls], h, w, rng, p["min_object_frac"], p["max_object_frac"])
        for _, earlier in instances:  # the new shape is painted on top: it hides what it covers
            earlier &= ~m
        colour = rng.uniform(0, 255, 3)
        img[m] = colour + rng.normal(0, 6, (int(m.sum()), 3))
        instances.append((cls, m))
    anns = []
    for cls, m in instances:
        area = int(m.sum())
        if area < p["min_area"]:
            continue
        ys, xs = np.nonzero(m)
        x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
        rle = mask_util.encode(np.asfortranarray(m.astype(np.uint8)))
        anns.append({
            "id": ann_id + len(anns), "image_id": image_id, "category_id": cls + 1, "iscrowd": 0, "area": area,
            "bbox": [x0, y0, x1 - x0, y1 - y0],
            "segmentation": {"size": [h, w], "counts": rle["counts"].decode("ascii")},
        })
    return np.clip(img, 0, 255).astype(np.uint8), anns


def check_params(p: dict[str, Any]) -> None:
    bad = [c for c in p["classes"] if c not in SHAPES]
    if bad or len(p["classes"]) < 1 or len(set(p["classes"])) != len(p["classes"]):
        raise ValueError(f"data.generate.classes={p['classes']!r}: give distinct shapes from {list(SHAPES)}")
    for lo, hi in (("min_size", "max_size"), ("min_objects", "max_objects"), ("min_object_frac", "max_object_frac")):
        if not 0 < p[lo] <= p[hi]:
            raise ValueError(f"data.generate: need 0 < {lo} ({p[lo]}) <= {hi} ({p[hi]})")
    if int(p["train"]) < 1 or int(p["val"]) < 1:
        raise ValueError(f"data.generate: train={p['train']} and val={p['val']} images must both be >= 1")


def split_files(out: Path, split: str) -> tuple[Path, Path]:
    """(image folder, annotation file) of one split of a generated dataset."""
    return out / split, out / "annotations" / f"instances_{split}.json"


def ensure_generated(out: str | Path, params: dict[str, Any]) -> Path:
    """The dataset in `out`, written unless a complete copy of exactly these `params` is there (utils/files.py's
    generation record; an interrupted generation is redone). The train and val splits use independent streams of the
    seed."""
    check_params(params)
    expected = [str(p.relative_to(out)) for s in ("train", "val") for p in split_files(Path(out), s)]
    return ensure_recorded(Path(out), params, expected, lambda o: _write(o, params))


def _write(out: Path, params: dict[str, Any]) -> None:
    from PIL import Image

    categories = [{"id": i + 1, "name": c, "supercategory": "shape"} for i, c in enumerate(params["classes"])]
    for k, split in enumerate(("train", "val")):
        rng = np.random.default_rng([int(params["seed"]), k])
        img_dir, ann_file = split_files(out, split)
        shutil.rmtree(img_dir, ignore_errors=True)  # a half-written earlier attempt
        img_dir.mkdir(parents=True)
        ann_file.parent.mkdir(parents=True, exist_ok=True)
        images, anns = [], []
        for i in range(1, int(params[split]) + 1):
            img, a = _image(i, rng, params, len(anns) + 1)
            name = f"{i:012d}.png"
            Image.fromarray(img).save(img_dir / name, optimize=False)
            images.append({"id": i, "file_name": name, "height": img.shape[0], "width": img.shape[1]})
            anns += a
        info = {"description": "condattn generated shapes (offline COCO stand-in)", "params": params, "split": split}
        ann_file.write_text(json.dumps({"info": info, "images": images, "annotations": anns,
                                        "categories": categories}))
