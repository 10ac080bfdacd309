"""LRA Pathfinder-32: are the two marked dots joined by one dashed path? (1024 pixels, 2 classes).

Paper scale reads the Pathfinder images of the `lra_release` archive, as the Nyströmformer
`LRA/datasets/pathfinder.py` does. Expected layout under `data.root` (default
`$CONDATTN_DATA/lra_release/pathfinder32`; `root` may also be the unpacked `lra_release` folder):

    <variant>/metadata/<k>.npy       text files despite the suffix, one line per image:
                                     `<image dir> <image file> <index> <label> ...` (space separated)
    <variant>/imgs/<k>/sample_<i>.png  32×32 grayscale PNGs named by those lines

`data.variant` picks the difficulty folder: `curv_contour_length_14` (default; the variant behind the
Nyströmformer paper's Pathfinder number; LRA's "hard"), `curv_contour_length_9` or
`curv_baseline`. As in the Nyströmformer script, metadata files are read in order (here: numeric order of
their names), zero-byte images are skipped (the release has a few; their count is recorded), the examples
are shuffled (there unseeded; here by `data.split_seed`) and cut 80 % / 10 % / 10 % into train / val / test.
Pixel v is token v + 1 (lra_common); `data.image_size` resizes (the smoke scale uses 16 = 256 tokens).

Stand-in (smoke/small scales): our own generator (data/standins/pathfinder.py: two long snakes of paddles, the
markers on the ends of one or of both), written in the layout above so the same loader reads it.

CLI: `python -m condattn.data.pathfinder --out DIR [--n N --seed S --variant V]`.
"""

from __future__ import annotations

import argparse
import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.files import Checksum
from . import common
from . import lra_common as C
from .lra_layouts import PATHFINDER_FOLDER, release_folders, where
from .lra_layouts import PATHFINDER_VARIANTS as VARIANTS
from .registry import DataBundle, register_dataset
from .standins import pathfinder as generator

SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
HOW = ("Download lra_release.gz (linked from the google-research/long-range-arena README: "
       "https://storage.googleapis.com/long-range-arena/lra_release.gz), unpack it and point data.root at its "
       "lra_release/pathfinder32 folder, or generate a stand-in with `python -m condattn.data.pathfinder --out DIR`.")


def find_variant_dir(root: str | os.PathLike[str], variant: str) -> Path:
    """`<variant>` under `root`, `root/pathfinder32` or the release archive's doubled
    `lra_release/lra_release/pathfinder32` (lra_layouts.release_folders)."""
    root = Path(root)
    for folder in (f / variant for f in release_folders(root, PATHFINDER_FOLDER)):
        if (folder / "metadata").is_dir() and any((folder / "metadata").glob("*.npy")):
            return folder
    raise common.missing(f"Pathfinder ({variant})", root,
                         f"{variant}/metadata/*.npy and {variant}/imgs/<k>/sample_<i>.png in one of "
                         f"{where(root, PATHFINDER_FOLDER)}", HOW)


def _numeric(path: Path):
    m = re.fullmatch(r"\d+", path.stem)
    return (0, int(path.stem), "") if m else (1, 0, path.stem)


def read_metadata(variant_dir: Path, checksum: Checksum | None = None) -> list[tuple[Path, int]]:
    """(image path, label) of every metadata line, metadata files in numeric order."""
    out = []
    for meta in sorted((variant_dir / "metadata").glob("*.npy"), key=_numeric):
        data = meta.read_bytes()
        if checksum is not None:
            checksum.add_bytes(data)
        for lineno, line in enumerate(data.decode("utf-8").split("\n"), start=1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise ValueError(f"{meta}:{lineno}: expected '<image dir> <image file> <index> <label 0/1> ...', "
                                 f"got {line[:80]!r}")
            out.append((variant_dir / fields[0] / fields[1], int(fields[3])))
    return out


def read_images(entries: list[tuple[Path, int]], resolution: int, checksum: Checksum | None = None):
    """(uint8 [N, res, res] images, labels, number of zero-byte files skipped)."""
    from PIL import Image

    images = np.empty((len(entries), resolution, resolution), dtype=np.uint8)
    labels, skipped, k = [], 0, 0
    for path, label in entries:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"Pathfinder image {path} (named in the metadata) is missing") from None
        if not data:
            skipped += 1
            continue
        if checksum is not None:
            checksum.add_bytes(data)
        img = Image.open(io.BytesIO(data))
        arr = np.asarray(img if img.mode == "L" else img.convert("L"))
        if arr.shape != (resolution, resolution):
            raise ValueError(f"{path}: expected a {resolution}x{resolution} image (data.resolution), got {arr.shape}")
        images[k] = arr
        labels.append(label)
        k += 1
    return images[:k], np.asarray(labels, dtype=np.int64), skipped


def load(root: str | os.PathLike[str], variant: str, seq_len: int, resolution: int = 32, image_size: int = 32,
         split_seed: int = 0, zero_is_padding: bool = False):
    """({train, val, test} datasets, sha256 of metadata and images, info)."""
    folder = find_variant_dir(root, variant)
    checksum = Checksum()
    entries = read_metadata(folder, checksum)
    images, labels, skipped = read_images(entries, resolution, checksum)
    if len(labels) < 3:
        raise ValueError(f"{folder}: only {len(labels)} readable images; need at least 3 for train/val/test")
    images = C.resize_images(images, image_size)
    order = np.random.default_rng(split_seed).permutation(len(labels))
    n_train = int(len(order) * SPLIT_FRACTIONS[0])
    n_val = int(len(order) * (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1])) - n_train
    parts = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
    splits = {}
    for split, idx in parts.items():
        values, lengths = C.image_rows(images[idx], seq_len)
        splits[split] = C.SequenceDataset(values, lengths, labels[idx], seq_len, zero_is_padding)
    info = {"root": str(folder), "variant": variant, "sizes": {s: len(ds) for s, ds in splits.items()},
            "skipped_empty_images": skipped, "split_seed": split_seed, "resolution": resolution,
            "image_size": image_size, "zero_is_padding": zero_is_padding,
            "positive_fraction": round(float(labels.mean()), 4), "encoding": "grayscale pixel + 1, row-major"}
    return splits, checksum.hexdigest(), info


def check_paper_data(cfg: Any) -> None:
    """Preflight: the variant's metadata are under `data.root` in a release layout
    (FileNotFoundError naming the places looked)."""
    find_variant_dir(cfg.data.root, str(cfg.data.variant))


@register_dataset("lra_pathfinder", check=check_paper_data)
def build(cfg: Any) -> DataBundle:
    d = cfg.data
    if d.variant not in VARIANTS:
        raise ValueError(f"data.variant={d.variant!r} is not a Pathfinder variant; choose one of {sorted(VARIANTS)}")
    if d.generate:
        size = int(d.resolution)
        root, gen = common.generated_stand_in(
            cfg, "lra_pathfinder", generator.GENERATOR_VERSION, [f"{d.variant}/metadata"],
            lambda o, g: generator.generate(o, g["n"], seed=g["seed"], variant=d.variant, size=size),
            extra={"variant": d.variant, "resolution": size})
        source = f"stand-in: our Pathfinder generator ({d.variant}), written in the release layout: {gen}"
    else:
        root = Path(d.root)
        source = f"LRA release Pathfinder images under {root}"
    ds, checksum, info = load(root, d.variant, int(d.seq_len), int(d.resolution), int(d.image_size),
                              int(d.split_seed), bool(d.zero_is_padding))
    info = {"source": source, "stand_in": bool(d.generate), **info}
    return DataBundle(ds["train"], ds["val"], ds["test"], checksum, info)


def main(argv: list[str] | None = None) -> None:
    """Generate stand-in Pathfinder images in the release layout and print counts and a checksum."""
    p = argparse.ArgumentParser(prog="python -m condattn.data.pathfinder", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (the images go to OUT/<variant>/)")
    p.add_argument("--n", type=int, default=2000, help="number of images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="curv_contour_length_14", choices=sorted(VARIANTS))
    p.add_argument("--size", type=int, default=32)
    a = p.parse_args(argv)
    root = generator.generate(a.out, a.n, seed=a.seed, variant=a.variant, size=a.size)
    checksum = Checksum()
    entries = read_metadata(root, checksum)
    _, labels, _ = read_images(entries, a.size, checksum)
    print(f"{len(labels)} images ({int(labels.sum())} connected) in {root}")
    print(f"sha256 {checksum.hexdigest()}")


if __name__ == "__main__":
    main()
