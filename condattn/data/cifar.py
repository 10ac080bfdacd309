"""CIFAR-10 and CIFAR-100 from their official python releases, for the medium scale's vision tables.

The archives `cifar-10-python.tar.gz` and `cifar-100-python.tar.gz` (https://www.cs.toronto.edu/~kriz/cifar.html)
unpack to

    cifar-10-batches-py/data_batch_1 … data_batch_5, test_batch   (pickled dicts: b'data' uint8 [N, 3072], b'labels')
    cifar-100-python/train, test                                  (b'data', b'fine_labels', b'coarse_labels')

`data.root` may be that folder or the folder holding it (e.g. $CONDATTN_DATA, where both releases can sit side by
side). The training split is the 50,000 training images, validation is the official 10,000-image test set: the
protocol of the ViT-on-CIFAR recipes the medium scale follows (they report accuracy on the test set at the end of
training). Labels: CIFAR-100's 100 fine labels. Images go through the same timm transforms as ImageNet
(condattn/data/images.py), at 32×32.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from ..utils.files import files_checksum
from . import common

SIZE = 32
RELEASES = {  # classes -> (folder the archive unpacks to, training files, test file, label key)
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels"),
    100: ("cifar-100-python", ["train"], "test", "fine_labels"),
}


def _release(classes: int) -> tuple[str, list[str], str, str]:
    if int(classes) not in RELEASES:
        raise ValueError(f"data.classes={classes!r} is not a CIFAR release; use data.classes=10 or data.classes=100")
    return RELEASES[int(classes)]


def how(classes: int) -> str:
    folder = _release(classes)[0]
    archive = "cifar-10-python.tar.gz" if int(classes) == 10 else "cifar-100-python.tar.gz"
    return (f"Download {archive} (https://www.cs.toronto.edu/~kriz/cifar.html), unpack it under $CONDATTN_DATA "
            f"(it makes {folder}/) or set data.root to the folder holding {folder}/; nothing is downloaded.")


def find_root(root: str | os.PathLike[str], classes: int) -> Path:
    """The release folder under `root` (root itself or root/<release folder>); a clear error if it is not there."""
    folder, train_files, test_file, _ = _release(classes)
    root = Path(root).expanduser()
    for cand in (root, root / folder):
        if all((cand / f).is_file() for f in (*train_files, test_file)):
            return cand
    raise common.missing(f"CIFAR-{classes}", root, f"{', '.join(train_files)} and {test_file} (python pickles) "
                         f"here or in {root / folder}", how(classes))


def read_pickle(path: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(RGB images uint8 [N, 32, 32, 3], labels int64 [N]) of one release file."""
    label_key = _release(classes)[3]
    with open(path, "rb") as f:
        try:
            d = pickle.load(f, encoding="bytes")
        except Exception as e:  # any unpickling failure means a file that is not a release file
            raise ValueError(f"{path}: not a CIFAR-{classes} python file (pickle load failed: {e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(d).__name__}")
    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
    if "data" not in d or label_key not in d:
        raise ValueError(f"{path}: expected keys 'data' and {label_key!r} (CIFAR-{classes}), found {sorted(d)}")
    data, labels = np.asarray(d["data"]), np.asarray(d[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * SIZE * SIZE or len(data) != len(labels):
        raise ValueError(f"{path}: expected uint8 data [N, 3072] and N labels, got {data.dtype} {data.shape} "
                         f"and {labels.shape}")
    if labels.size and not (labels.min() >= 0 and labels.max() < classes):
        raise ValueError(f"{path}: labels outside 0-{classes - 1}: is data.classes={classes} the right release?")
    return data.reshape(-1, 3, SIZE, SIZE).transpose(0, 2, 3, 1), labels


def load(root: str | os.PathLike[str], classes: int) -> tuple[dict, str, dict]:
    """({"train": (images, labels), "val": (images, labels)}, sha256 of the release files, info)."""
    folder = find_root(root, classes)
    _, train_files, test_file, _ = _release(classes)
    parts = [read_pickle(folder / f, classes) for f in train_files]
    train = (np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))
    val = read_pickle(folder / test_file, classes)
    checksum = files_checksum([folder / f for f in (*train_files, test_file)])
    info = {"origin": f"CIFAR-{classes} python release at {folder}", "classes": int(classes),
            "val_split": "the official test set", "checksum_of": "the release files"}
    return {"train": train, "val": val}, checksum, info


def check(root: str | os.PathLike[str], classes: int) -> None:
    """Preflight: the release files are where data.root says (raises FileNotFoundError naming the path)."""
    find_root(root, classes)
