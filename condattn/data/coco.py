"""COCO instance detection / segmentation (tables 2 and 7): COCO-format JSON + an image folder per split.

Paper scale reads COCO 2017 under `data.root` (default `${paths.data_root}/coco`), the layout of cocodataset.org's
archives (the one mmdetection, DETR and torchvision's references use):

    <root>/train2017/*.jpg   <root>/val2017/*.jpg
    <root>/annotations/instances_train2017.json   <root>/annotations/instances_val2017.json

(the folder and file names are `data.{train,val}_{images,annotations}`). The smoke and small scales set
`data.generate` and read the offline shapes dataset (data/standins/shapes.py) through the same code: COCO files
written under `paths.cache/coco_shapes/<digest of the parameters>/`.

Loading: torchvision's `CocoDetection` + `wrap_dataset_for_transforms_v2` (pycocotools decodes polygons and RLE into
per-instance masks; boxes become XYXY tv_tensors), crowd annotations dropped (as torchvision's references, DETR and
mmdetection's training do; the evaluation keeps them, pycocotools ignores crowd regions), labels mapped to 1..K in the
order of the sorted category ids (0 is the background of torchvision's detectors; `dataset.cat_ids[label - 1]` maps
back; train and val must list the same categories). Polygon parts of fewer than 3 points are dropped, and an
annotation left without one is skipped (training and evaluation ground truth alike), counted in the summary's
`data.skipped_annotations`. With `data.train_filter_empty` the training split skips images without a non-crowd
annotation (mmdetection's `filter_empty_gt`, torchvision's references; DETR keeps them).

Augmentation (`task.augment`, training split only; torchvision.transforms.v2 on image, boxes and masks together), the
recipe of XCiT's Mask R-CNN configs, taken from DETR: horizontal flip (p = hflip), then one of two policies with equal
probability: (a) resize the short side to a random one of `scales` (long side ≤ `max_size`); (b) resize the short
side to a random one of `crop_resize`, crop a random (h, w) with each side uniform in `crop_size` (capped by the image,
mmdetection's `absolute_range`; crops without objects are kept, `allow_negative_crop`), then (a). Boxes cut below 1 px
are dropped with their masks. The validation split is not resized here: resizing to the evaluation size is the
model's (Mask R-CNN: torchvision's GeneralizedRCNNTransform, short side `eval_size`, long ≤ `eval_max_size`, then
padding to a multiple of 32; DETR: the task, condattn/tasks/detection.py), and predictions come back in the
original image's coordinates, as pycocotools wants them.

A sample is (image float (3, H, W) in [0, 1], target {boxes (N, 4) XYXY float, labels (N,) int64, masks (N, H, W)
uint8 (when data.masks), image_id int, orig_size (2,) int64 (H, W) of the file}); `collate` batches them as
{"images": [...], "targets": [...]} (sizes differ).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2 import query_size

from ..utils.files import files_checksum, params_dir
from .registry import DataBundle, register_dataset
from .standins import shapes

LAYOUT = (
    "<root>/train2017/*.jpg, <root>/val2017/*.jpg, <root>/annotations/instances_train2017.json and "
    "<root>/annotations/instances_val2017.json (cocodataset.org's 2017 archives unpacked into <root>)"
)


class RandomSizeCrop(v2.Transform):
    """DETR's `RandomSizeCrop(min, max)` / mmdetection's `RandomCrop(crop_type='absolute_range')` as a v2 transform:
    crop height and width each uniform in [min(side, lo), min(side, hi)], at a uniform random offset."""

    def __init__(self, lo: int, hi: int):
        super().__init__()
        if not 0 < lo <= hi:
            raise ValueError(f"task.augment.crop_size=[{lo}, {hi}]: need 0 < min <= max")
        self.lo, self.hi = int(lo), int(hi)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        h, w = query_size(flat_inputs)
        ch = int(torch.randint(min(h, self.lo), min(h, self.hi) + 1, ()))
        cw = int(torch.randint(min(w, self.lo), min(w, self.hi) + 1, ()))
        top = int(torch.randint(0, h - ch + 1, ()))
        left = int(torch.randint(0, w - cw + 1, ()))
        return {"top": top, "left": left, "height": ch, "width": cw}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


def train_transforms(aug: Any):
    """The XCiT / DETR training augmentation (module docstring) as one torchvision.transforms.v2 pipeline."""
    scales, max_size = [int(s) for s in aug.scales], int(aug.max_size)
    multiscale = v2.RandomShortestSize(min_size=scales, max_size=max_size)
    crop = v2.Compose([
        v2.RandomShortestSize(min_size=[int(s) for s in aug.crop_resize], max_size=max_size),
        RandomSizeCrop(*(int(s) for s in aug.crop_size)),
        v2.RandomShortestSize(min_size=scales, max_size=max_size),
    ])
    return v2.Compose([
        v2.RandomHorizontalFlip(float(aug.hflip)),
        v2.RandomChoice([multiscale, crop]),
        v2.SanitizeBoundingBoxes(min_size=1.0),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
    ])


def eval_transforms():
    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def drop_unusable_polygons(coco) -> dict[str, int]:
    """Drops, in place, the polygon parts of fewer than 3 points (< 6 coordinates: no area, and pycocotools takes a
    4-coordinate one for a box and fails), and the annotations left without any part, then rebuilds the index.
    Such annotations are skipped for training and for the evaluation's ground truth alike. Returns the counts."""
    parts = dropped = 0
    kept = []
    for ann in coco.dataset.get("annotations", []):
        seg = ann.get("segmentation")
        if isinstance(seg, list) and seg:
            good = [p for p in seg if len(p) >= 6]
            parts += len(seg) - len(good)
            if not good:
                dropped += 1
                continue
            ann["segmentation"] = good
        kept.append(ann)
    if parts:
        coco.dataset["annotations"] = kept
        coco.createIndex()
    return {"polygon_parts_under_3_points": parts, "annotations_without_a_usable_polygon": dropped}


class CocoInstances(Dataset):
    """One split of a COCO-format dataset (module docstring). Attributes for the evaluation: `coco` (the pycocotools
    ground truth), `ids` (image ids, in sample order), `cat_ids` (category id of label 1..K)."""

    def __init__(self, images: str | Path, annotations: str | Path, transforms=None, *, masks: bool = True,
                 filter_empty: bool = False, limit: int | None = None):
        from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            base = CocoDetection(str(images), str(annotations))
            self.skipped = drop_unusable_polygons(base.coco)
        self.coco = base.coco
        self.cat_ids = sorted(self.coco.getCatIds())
        self.label_of = {c: i + 1 for i, c in enumerate(self.cat_ids)}
        ids = list(base.ids)
        if filter_empty:
            ids = [i for i in ids if any(not a.get("iscrowd", 0) for a in self.coco.imgToAnns.get(i, []))]
        if limit is not None:
            ids = ids[: int(limit)]
        base.ids = ids
        self.ids = ids
        self.masks = bool(masks)
        keys = {"image_id", "boxes", "labels", "iscrowd", *(["masks"] if masks else [])}
        self._ds = wrap_dataset_for_transforms_v2(base, target_keys=keys)
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        img, t = self._ds[i]
        h, w = img.height, img.width
        if "boxes" in t:
            keep = torch.tensor([not c for c in t["iscrowd"]], dtype=torch.bool)
            boxes, labels = t["boxes"].as_subclass(torch.Tensor)[keep], t["labels"][keep]
            masks = t["masks"].as_subclass(torch.Tensor)[keep] if self.masks else None
        else:  # an image without annotations
            boxes, labels = torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64)
            masks = torch.zeros(0, h, w, dtype=torch.uint8) if self.masks else None
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(boxes.float(), format="XYXY", canvas_size=(h, w)),
            "labels": torch.tensor([self.label_of[int(c)] for c in labels], dtype=torch.int64),
        }
        if masks is not None:
            target["masks"] = tv_tensors.Mask(masks.to(torch.uint8))
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        out = {k: v.as_subclass(torch.Tensor) for k, v in target.items()}
        out["image_id"] = int(self.ids[i])
        out["orig_size"] = torch.tensor([h, w], dtype=torch.int64)
        return img.as_subclass(torch.Tensor), out


def collate(samples: list) -> dict[str, list]:
    """Detection batches keep images and targets as lists (sizes differ; the detector pads)."""
    images, targets = zip(*samples)
    return {"images": list(images), "targets": list(targets)}


def split_paths(cfg: Any) -> dict[str, tuple[Path, Path]]:
    d, root = cfg.data, Path(cfg.data.root)
    return {s: (root / str(d[f"{s}_images"]), root / str(d[f"{s}_annotations"])) for s in ("train", "val")}


def read_categories(path: Path, window: int = 1 << 20) -> list[dict] | None:
    """The `categories` list of a COCO annotation file without parsing its (up to 450 MB of) annotations: the whole
    file when small, else the key found in its last or first `window` bytes (cocodataset.org's files end with it);
    None when it is in neither."""
    import json

    size = path.stat().st_size
    if size <= 8 * window:
        return json.loads(path.read_text()).get("categories")
    with open(path, "rb") as f:
        head = f.read(window).decode("utf-8", "ignore")
        f.seek(size - window)
        tail = f.read().decode("utf-8", "ignore")
    for text in (tail, head):
        at = text.rfind('"categories"')
        start = text.find("[", at) if at >= 0 else -1
        if start >= 0:
            try:
                return json.JSONDecoder().raw_decode(text, start)[0]
            except ValueError:
                continue
    return None


def category_problem(train: list[dict], val: list[dict], where: dict[str, Path], num_classes: int) -> str | None:
    """Why the train and val category lists (or their count vs data.num_classes) cannot make one label space."""
    a, b = ({int(c["id"]): str(c.get("name")) for c in cats} for cats in (train, val))
    if a != b:
        only_train = sorted(set(a) - set(b))
        only_val = sorted(set(b) - set(a))
        renamed = [f"{i}: {a[i]!r} vs {b[i]!r}" for i in sorted(set(a) & set(b)) if a[i] != b[i]]
        diff = "; ".join(x for x in (
            f"ids only in train {[(i, a[i]) for i in only_train]}" if only_train else "",
            f"ids only in val {[(i, b[i]) for i in only_val]}" if only_val else "",
            f"names differ (train vs val) {renamed}" if renamed else "") if x)
        return (f"COCO category lists differ between {where['train']} and {where['val']}: {diff}. Labels are the "
                "sorted category ids of the training file, so both files need the same categories")
    if len(a) != num_classes:
        return (f"data.num_classes={num_classes} but {where['train']} has {len(a)} categories; "
                f"set data.num_classes={len(a)}")
    return None


def check_paper_data(cfg: Any) -> dict[str, tuple[Path, Path]]:
    """The split paths, or FileNotFoundError naming every missing one and the layout expected; ValueError when the
    train and val category lists differ or do not number data.num_classes (read cheaply, `read_categories`)."""
    paths = split_paths(cfg)
    missing = [str(p) for pair in paths.values() for p in pair if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"COCO not found: missing {', '.join(missing)} (data.root={cfg.data.root}). Expected {LAYOUT}. "
            "Set paths.data_root (env CONDATTN_DATA) or data.root to where it lies; the names are "
            "data.{train,val}_{images,annotations}. Nothing is downloaded. For an offline check use scale=smoke "
            "or scale=small (generated shapes)."
        )
    cats = {s: read_categories(p[1]) for s, p in paths.items()}
    if all(c is not None for c in cats.values()):
        why = category_problem(cats["train"], cats["val"], {s: p[1] for s, p in paths.items()},
                               int(cfg.data.num_classes))
        if why:
            raise ValueError(why)
    return paths


@register_dataset("coco", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d = cfg.data
    if d.get("generate"):
        gen = OmegaConf.to_container(d.generate, resolve=True)
        out = shapes.ensure_generated(params_dir(cfg.paths.cache, "coco_shapes", gen), gen)
        paths = {s: shapes.split_files(out, s) for s in ("train", "val")}
        if len(gen["classes"]) != int(d.num_classes):
            raise ValueError(f"data.num_classes={d.num_classes} but data.generate.classes has {len(gen['classes'])} "
                             f"shapes {gen['classes']}; set data.num_classes={len(gen['classes'])}")
        source = f"generated offline: COCO-format shapes (stand-in for COCO, data/standins/shapes.py): {gen}"
    else:
        paths = check_paper_data(cfg)
        source = f"COCO-format files under {d.root}"
    aug = cfg.task.augment
    splits = {
        "train": CocoInstances(*paths["train"], train_transforms(aug), masks=bool(d.masks),
                               filter_empty=bool(d.train_filter_empty)),
        "val": CocoInstances(*paths["val"], eval_transforms(), masks=bool(d.masks), limit=d.get("val_limit")),
    }
    found = len(splits["train"].cat_ids)
    why = category_problem(*(splits[s].coco.dataset.get("categories", []) for s in ("train", "val")),
                           {s: p[1] for s, p in paths.items()}, int(d.num_classes))
    if why:
        raise ValueError(why)
    info = {
        "source": source,
        "stand_in": bool(d.get("generate")),
        "files": {s: {"images": str(p[0]), "annotations": str(p[1])} for s, p in paths.items()},
        "sizes": {s: len(ds) for s, ds in splits.items()},
        "num_classes": found,
        "categories": [c["name"] for c in splits["train"].coco.loadCats(splits["train"].cat_ids)],
        "checksum_of": "the annotation files (train, val)",
        "skipped_annotations": {s: ds.skipped for s, ds in splits.items()},
    }
    checksum = files_checksum([paths["train"][1], paths["val"][1]])
    return DataBundle(splits["train"], splits["val"], None, checksum, info, collate_fn=collate)
