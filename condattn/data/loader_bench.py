"""How many decoded, augmented training samples per second one data worker (one CPU core) delivers, on a replica in
the release format written on the fly: ImageNet's ImageFolder tree of JPEGs at ImageNet's typical size (about 400 ×
350, quality 90), or COCO's train2017/ + instances json at COCO's size (640 × 480), with the recipe's own training
transform. `make bench ARGS="--loader imagenet"` (or coco) prints the options side by side.

ImageNet options (each is the same recipe: RandomResizedCrop, flip, RandAugment rand-m9-mstd0.5-inc1, erasing):
- `pil`: the trainer's loader today: PIL decode at full size + timm's transform (ToTensor, Normalize, RandomErasing
  on the CPU).
- `pil+prefetcher`: timm's `use_prefetcher` split (timm train.py's default): the worker hands over uint8 tensors;
  normalisation and random erasing run on the GPU in timm's PrefetchLoader.
- `pil-draft+prefetcher`: also PIL's JPEG draft mode (the decoder's DCT scaling), never below the crop size of the
  smallest RandomResizedCrop area at full resolution, so the crops keep at least their full-resolution detail.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np


def _natural_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth random image with edges and texture (JPEG-compresses like a photo, unlike white noise)."""
    small = rng.integers(0, 256, (max(h // 16, 2), max(w // 16, 2), 3)).astype(np.float32)
    from PIL import Image

    base = np.asarray(Image.fromarray(small.astype(np.uint8)).resize((w, h), Image.BICUBIC), dtype=np.float32)
    base += rng.normal(0, 12, (h, w, 3))
    return np.clip(base, 0, 255).astype(np.uint8)


def write_imagenet_replica(root: Path, n: int = 96, classes: int = 4, seed: int = 0) -> Path:
    """root/train/<wnid>/*.JPEG (ImageFolder layout, ImageNet-like sizes) and an empty-but-valid val tree."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", n), ("val", classes)):
        for i in range(count):
            d = root / split / f"n{1440764 + i % classes:08d}"
            d.mkdir(parents=True, exist_ok=True)
            h, w = int(rng.integers(300, 420)), int(rng.integers(360, 520))
            Image.fromarray(_natural_image(rng, h, w)).save(d / f"{split}_{i:05d}.JPEG", quality=90)
    return root


def write_coco_replica(root: Path, n: int = 32, seed: int = 0) -> Path:
    """root/train2017/*.jpg + root/annotations/instances_train2017.json with 3-8 polygon instances per image."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "train2017").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i in range(n):
        h, w = 480, 640
        name = f"{i:012d}.jpg"
        Image.fromarray(_natural_image(rng, h, w)).save(root / "train2017" / name, quality=90)
        images.append({"id": i + 1, "file_name": name, "height": h, "width": w})
        for _ in range(int(rng.integers(3, 9))):
            cx, cy, r = float(rng.uniform(60, w - 60)), float(rng.uniform(60, h - 60)), float(rng.uniform(15, 60))
            angles = [k * math.pi / 6 for k in range(12)]
            poly = [v for a in angles for v in (cx + r * math.cos(a), cy + r * math.sin(a))]
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(rng.integers(1, 4)),
                         "segmentation": [poly], "area": math.pi * r * r, "bbox": [cx - r, cy - r, 2 * r, 2 * r],
                         "iscrowd": 0})
    cats = [{"id": c, "name": f"c{c}"} for c in (1, 2, 3)]
    (root / "annotations" / "instances_train2017.json").write_text(
        json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return root


class DraftLoader:
    """PIL loader in draft mode: the JPEG decoder scales by 1/2, 1/4 or 1/8 while decoding, but never below
    `min_side` on the shorter side (so a RandomResizedCrop of the smallest area still has ≥ its output size)."""

    def __init__(self, min_side: int):
        self.min_side = min_side

    def __call__(self, path: str):
        from PIL import Image

        img = Image.open(path)
        w, h = img.size
        scale = min(w, h) / self.min_side
        if scale >= 2:
            img.draft("RGB", (math.ceil(w / scale), math.ceil(h / scale)))
        return img.convert("RGB")


def imagenet_options(cfg: Any) -> dict[str, Any]:
    """name -> a dataset yielding the recipe's training sample, one per loader option."""
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    from .images import _fix_posterize, build_transforms

    d, aug = cfg.data, cfg.task.augment
    size = int(d.img_size)
    full, _ = build_transforms(d, aug)  # exactly the trainer's training transform
    prefetch = create_transform(  # the same, handing uint8 to timm's PrefetchLoader (normalise + erase on the GPU)
        input_size=size, is_training=True, scale=tuple(aug.scale), ratio=tuple(aug.ratio), hflip=float(d.hflip),
        color_jitter=float(aug.color_jitter), auto_augment=aug.auto_augment or None, interpolation=aug.interpolation,
        mean=tuple(d.mean), std=tuple(d.std), use_prefetcher=True)
    _fix_posterize(prefetch)
    # the smallest crop side at full resolution is sqrt(min area) × the short side: keep that ≥ the output size
    min_side = math.ceil(size / math.sqrt(float(aug.scale[0])))
    root = Path(str(d.root)) / "train"
    return {
        "pil": ImageFolder(str(root), transform=full),
        "pil+prefetcher": ImageFolder(str(root), transform=prefetch),
        "pil-draft+prefetcher": ImageFolder(str(root), transform=prefetch, loader=DraftLoader(min_side)),
    }


def write_cifar_replica(root: Path, n: int = 96, seed: int = 0) -> Path:
    """CIFAR-100's python release (cifar-100-python/{train,test}: pickled dicts, uint8 rows of 3 × 32 × 32) with
    `n` natural-looking training images."""
    import pickle

    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", n), ("test", max(n // 4, 4))):
        images = np.stack([_natural_image(rng, 32, 32) for _ in range(count)])  # (N, 32, 32, 3)
        rows = images.transpose(0, 3, 1, 2).reshape(count, -1).astype(np.uint8)
        labels = [int(v) for v in rng.integers(0, 100, count)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": rows, b"fine_labels": labels, b"coarse_labels": [v // 5 for v in labels]}, f,
                        protocol=2)
    return folder


def cifar_options(cfg: Any) -> dict[str, Any]:
    """The medium recipe's CIFAR training split, exactly as the trainer builds it (decoded arrays in memory)."""
    from .images import build_image_bundle

    return {"arrays+pil": build_image_bundle(cfg).train}


def coco_options(cfg: Any) -> dict[str, Any]:
    from .coco import CocoInstances, train_transforms

    root = Path(str(cfg.data.root))
    ann = root / "annotations" / "instances_train2017.json"
    return {"torchvision-v2": CocoInstances(root / "train2017", ann, train_transforms(cfg.task.augment),
                                            masks=bool(cfg.data.masks))}


def samples_per_s(options: dict[str, Any], seconds: float = 10.0, per_round: int = 6) -> dict[str, dict[str, float]]:
    """Samples/s of one worker per option: `dataset[i]` in the calling process (one core, torch threads 1), the
    options interleaved in rounds of `per_round` samples each (so a shared machine's drift hits all of them alike)
    until `seconds` × the number of options have passed; the median over rounds of each option's rate, and the
    median of its ratio to the first option in the same round."""
    import statistics

    import torch

    torch.set_num_threads(1)  # one worker = one core, as a DataLoader worker
    for ds in options.values():
        ds[0]  # warm-up (file cache, imports)
    rates: dict[str, list[float]] = {k: [] for k in options}
    pos, t_end = 0, time.perf_counter() + seconds * len(options)
    while time.perf_counter() < t_end or len(rates[next(iter(options))]) < 3:
        for name, ds in options.items():
            t0 = time.perf_counter()
            for j in range(per_round):
                ds[(pos + j) % len(ds)]
            rates[name].append(per_round / (time.perf_counter() - t0))
        pos += per_round
    first = rates[next(iter(options))]
    return {name: {"samples_per_s_per_worker": round(statistics.median(r), 1),
                   "ratio_to_first": round(statistics.median(a / b for a, b in zip(r, first)), 3),
                   "rounds": len(r), "samples": len(r) * per_round} for name, r in rates.items()}
