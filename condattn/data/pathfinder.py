"""LRA Pathfinder-32: are the two marked dots joined by one dashed path? (1024 pixels, 2 classes).

Paper scale reads the Pathfinder images of the `lra_release` archive, as the Nyströmformer
`LRA/datasets/pathfinder.py` does. Expected layout under `data.root` (default
`$CONDATTN_DATA/lra_release/pathfinder32`; `root` may also be the unpacked `lra_release` folder):

    <variant>/metadata/<k>.npy       text files despite the suffix, one line per image:
                                     `<image dir> <image file> <index> <label> ...` (space separated)
    <variant>/imgs/<k>/sample_<i>.png  32×32 grayscale PNGs named by those lines

`data.variant` picks the difficulty folder: `curv_contour_length_14` (default; the variant behind the
Nyströmformer paper's Pathfinder number, see ANCHORS.md §6; LRA's "hard"), `curv_contour_length_9` or
`curv_baseline`. As in the Nyströmformer script, metadata files are read in order (here: numeric order of
their names), zero-byte images are skipped (the release has a few; their count is recorded), the examples
are shuffled (there unseeded; here by `data.split_seed`) and cut 80 % / 10 % / 10 % into train / val / test.
Pixel v is token v + 1 (lra_common); `data.image_size` resizes (the smoke scale uses 16 = 256 tokens).

Stand-in (smoke/small scales): our own generator (`generate`), written in the layout above so the same loader
reads it. Each image has two long "snakes" (chains of `contour_length` short straight paddles separated by
small gaps, turning by at most `max_turn` between paddles, never touching another stroke) and a few short
distractor snakes; two discs mark either both ends of the first snake (label 1) or one end of each long
snake (label 0), so the strokes of both classes are drawn alike and only the connection differs. Image i is a
function of (seed, i) alone; labels alternate, so the classes are balanced. It follows the spirit of the
released generator (drewlinsley/pathfinder, with LRA's Pathfinder-32 settings: contour length 14, distractor
length contour_length // 3, 20 // distractor_length distractors), not its code.

CLI: `python -m condattn.data.pathfinder --out DIR [--n N --seed S --variant V]`.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from . import lra_common as C

VARIANTS = {"curv_baseline": 6, "curv_contour_length_9": 9, "curv_contour_length_14": 14}  # paddles per contour
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
GENERATOR_VERSION = 1
HOW = ("Download lra_release.gz (linked from the google-research/long-range-arena README: "
       "https://storage.googleapis.com/long-range-arena/lra_release.gz), unpack it and point data.root at its "
       "lra_release/pathfinder32 folder, or generate a stand-in with `python -m condattn.data.pathfinder --out DIR`.")


# ----------------------------------------------------------------------------------------------------
# Generator
# ----------------------------------------------------------------------------------------------------


def _coverage(size: int, p: np.ndarray, q: np.ndarray, r: float) -> np.ndarray:
    """[n, size, size] anti-aliased coverage of n segments p[k]-q[k] (or discs when p = q):
    clip(r - distance from each pixel centre to the segment, 0, 1)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    pts = np.stack([yy.ravel(), xx.ravel()], axis=1)  # [P, 2]
    d = (q - p)[:, None, :]  # [n, 1, 2]
    rel = pts[None] - p[:, None, :]  # [n, P, 2]
    t = np.clip((rel * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-9), 0.0, 1.0)
    dist = np.linalg.norm(rel - t[..., None] * d, axis=-1)
    return np.clip(r - dist, 0.0, 1.0).reshape(len(p), size, size)


def _dilate(mask: np.ndarray) -> np.ndarray:
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= out[:, :-1].copy()
    out[:, :-1] |= out[:, 1:].copy()
    return out


def _path(rng: np.random.Generator, paddles: int, lo: float, hi: float, paddle_length: float, gap: float,
          max_turn: float, lookahead: float, forbidden: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Start and end points [paddles, 2] of a chain of straight paddles whose heading turns by at most
    `max_turn` between paddles; a paddle that would head out of the image within `lookahead` px turns by
    `max_turn` towards the centre instead. None as soon as a paddle leaves [lo, hi]² or its start, middle or
    end pixel is `forbidden` (a quick test; the caller checks every pixel)."""
    centre = (lo + hi) / 2.0
    y, x = rng.uniform(lo, hi, size=2)
    theta = rng.uniform(0.0, 2 * math.pi)
    starts, ends = [], []
    for j in range(paddles):
        th = theta + (rng.uniform(-max_turn, max_turn) if j else 0.0)
        ay, ax = y + lookahead * math.sin(th), x + lookahead * math.cos(th)
        if j and not (lo <= ay <= hi and lo <= ax <= hi):
            cross = math.cos(theta) * (centre - y) - math.sin(theta) * (centre - x)  # > 0: centre to the left
            th = theta + (max_turn if cross > 0 else -max_turn)
        qy, qx = y + paddle_length * math.sin(th), x + paddle_length * math.cos(th)
        if not (lo <= qy <= hi and lo <= qx <= hi):
            return None
        if (forbidden[round(y), round(x)] or forbidden[round(qy), round(qx)]
                or forbidden[round((y + qy) / 2), round((x + qx) / 2)]):
            return None
        starts.append((y, x))
        ends.append((qy, qx))
        theta = th
        y, x = qy + gap * math.sin(th), qx + gap * math.cos(th)
    return np.asarray(starts, np.float32), np.asarray(ends, np.float32)


def _snake(rng: np.random.Generator, size: int, forbidden: np.ndarray, paddles: int, *, paddle_length: float,
           gap: float, width: float, max_turn: float, margin: float, lookahead: float = 6.0, tries: int = 100):
    """(starts, ends, coverage [size, size]) of a snake inside the image that touches no `forbidden` pixel
    and does not cross itself (no paddle touches one before its neighbour); None after `tries` draws."""
    lo, hi = margin, size - 1 - margin
    for _ in range(tries):
        path = _path(rng, paddles, lo, hi, paddle_length, gap, max_turn, lookahead, forbidden)
        if path is None:
            continue
        # a cheap rejection first: paddle midpoints within 2 px of a non-neighbouring paddle's midpoint
        mid = (path[0] + path[1]) / 2
        near = np.linalg.norm(mid[:, None] - mid[None], axis=-1) < 2.0
        if np.triu(near, 2).any():
            continue
        cov = _coverage(size, path[0], path[1], width / 2.0 + 0.5)
        hit = cov > 0
        if (hit.any(0) & forbidden).any():
            continue
        if paddles > 2:
            before = np.logical_or.accumulate(hit[:-2], axis=0)  # paddles 0..k-2, for paddle k
            if (hit[2:] & before).any():
                continue
        return path[0], path[1], cov.max(0)
    return None


def render_parts(seed: int, index: int, label: int, size: int = 32, contour_length: int = 14,
                 paddle_length: float = 2.0, gap: float = 1.0, width: float = 0.6, marker_radius: float = 1.5,
                 max_turn: float = math.pi / 5, distractor_length: int | None = None,
                 num_distractors: int | None = None) -> tuple[np.ndarray, dict]:
    """(uint8 size×size image, parts) of sample `index`: parts = {"strokes": per-snake pixel masks (the two long
    snakes first), "ends": their two endpoints each, "markers": the two marked points}. Strokes never touch
    (there is an empty pixel between any two), and the disc around either end of a long snake touches no other
    stroke and no other such disc, so a marker never joins two snakes."""
    distractor_length = distractor_length or max(contour_length // 3, 1)
    num_distractors = 20 // distractor_length if num_distractors is None else num_distractors
    style = dict(paddle_length=paddle_length, gap=gap, width=width, max_turn=max_turn, margin=marker_radius + 0.5)
    disc_r = marker_radius + 0.5
    # 50 attempts from the sample's own stream; a rare index whose stream keeps failing (seed 1234, index 1243 of
    # the small recipe) continues from a derived stream instead of stopping the whole dataset
    streams = [np.random.default_rng([seed, index])] + [np.random.default_rng([seed, index, r]) for r in range(1, 5)]
    for attempt in range(50 * len(streams)):
        rng = streams[attempt // 50]
        img = np.zeros((size, size), dtype=np.float32)
        occupied = np.zeros((size, size), dtype=bool)  # every stroke
        zones = np.zeros((size, size), dtype=bool)  # the marker discs around the long snakes' ends
        strokes, ends = [], []
        for k in range(2 + num_distractors):
            long = k < 2
            for _ in range(10 if long else 1):
                snake = _snake(rng, size, _dilate(occupied | zones), contour_length if long else distractor_length,
                               tries=20 if long else 40, **style)
                if snake is None or not long:
                    break
                tips = np.stack([snake[0][0], snake[1][-1]])
                zone = _coverage(size, tips, tips, disc_r).max(0) > 0
                if not (_dilate(zone) & (occupied | zones)).any():
                    break
                snake = None  # a marker there would touch another stroke or marker: draw this snake again
            if snake is None:
                if long:
                    break  # the two long snakes are required: start the image over
                continue  # a distractor that does not fit is left out
            starts, stops, cov = snake
            img = np.maximum(img, cov)
            occupied |= cov > 0
            strokes.append(cov > 0)
            if long:
                zones |= zone
                ends.append((starts[0], stops[-1]))
        if len(ends) < 2:
            continue
        markers = ends[0] if label else (ends[0][rng.integers(2)], ends[1][rng.integers(2)])
        centres = np.stack(markers)
        img = np.maximum(img, _coverage(size, centres, centres, disc_r).max(0))
        parts = {"strokes": strokes, "ends": ends, "markers": centres}
        return np.rint(255.0 * img).astype(np.uint8), parts
    raise RuntimeError(f"pathfinder: could not place two snakes of {contour_length} paddles in a {size}x{size} image")


def render(seed: int, index: int, label: int, **style) -> np.ndarray:
    """One uint8 image whose two markers are joined by a snake iff `label` is 1 (see render_parts)."""
    return render_parts(seed, index, label, **style)[0]


def generate(out: str | os.PathLike[str], n: int, seed: int = 0, variant: str = "curv_contour_length_14",
             size: int = 32, per_folder: int = 1000) -> Path:
    """Write `n` images in the release layout `out/<variant>/{metadata/<k>.npy, imgs/<k>/sample_<i>.png}`
    (labels alternate 0, 1, ...); returns `out/<variant>`."""
    from PIL import Image

    if variant not in VARIANTS:
        raise ValueError(f"pathfinder variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    root = Path(out) / variant
    lines: dict[int, list[str]] = {}
    for i in range(n):
        label = i % 2
        img = render(seed, i, label, size=size, contour_length=VARIANTS[variant])
        folder = i // per_folder
        path = root / "imgs" / str(folder) / f"sample_{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(img, mode="L").save(buf, format="PNG")
        path.write_bytes(buf.getvalue())
        lines.setdefault(folder, []).append(f"imgs/{folder} sample_{i}.png {i} {label} {VARIANTS[variant]}\n")
    for folder, rows in lines.items():
        C.write_atomic(root / "metadata" / f"{folder}.npy", "".join(rows).encode())
    return root


# ----------------------------------------------------------------------------------------------------
# Loader
# ----------------------------------------------------------------------------------------------------


def find_variant_dir(root: str | os.PathLike[str], variant: str) -> Path:
    root = Path(root)
    for folder in (root / variant, root / "pathfinder32" / variant):
        if (folder / "metadata").is_dir() and any((folder / "metadata").glob("*.npy")):
            return folder
    raise C.missing(f"Pathfinder ({variant})", root,
                    f"{variant}/metadata/*.npy and {variant}/imgs/<k>/sample_<i>.png (or them under "
                    f"{root / 'pathfinder32'})", HOW)


def _numeric(path: Path):
    m = re.fullmatch(r"\d+", path.stem)
    return (0, int(path.stem), "") if m else (1, 0, path.stem)


def read_metadata(variant_dir: Path, checksum: C.Checksum | None = None) -> list[tuple[Path, int]]:
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


def read_images(entries: list[tuple[Path, int]], resolution: int, checksum: C.Checksum | None = None):
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
    checksum = C.Checksum()
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


def build(cfg: Any):
    from omegaconf import OmegaConf

    from .build import DataBundle

    d = cfg.data
    if d.variant not in VARIANTS:
        raise ValueError(f"data.variant={d.variant!r} is not a Pathfinder variant; choose one of {sorted(VARIANTS)}")
    if d.generate:
        gen = OmegaConf.to_container(d.generate, resolve=True)
        params = {"generator_version": GENERATOR_VERSION, "variant": d.variant, "resolution": int(d.resolution),
                  **gen}
        root = C.params_dir(cfg.paths.cache, "lra_pathfinder", params)
        C.ensure_generated(root, params, [f"{d.variant}/metadata"], lambda o: generate(
            o, gen["n"], seed=gen["seed"], variant=d.variant, size=int(d.resolution)))
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
    root = generate(a.out, a.n, seed=a.seed, variant=a.variant, size=a.size)
    checksum = C.Checksum()
    entries = read_metadata(root, checksum)
    _, labels, _ = read_images(entries, a.size, checksum)
    print(f"{len(labels)} images ({int(labels.sum())} connected) in {root}")
    print(f"sha256 {checksum.hexdigest()}")


if __name__ == "__main__":
    main()
