"""The Pathfinder stand-in: our own generator of Pathfinder-32 images, written in the release layout (data/pathfinder.py
reads them).

Each image has two long "snakes" (chains of `contour_length` short straight paddles separated by
small gaps, turning by at most `max_turn` between paddles, never touching another stroke) and a few short
distractor snakes; two discs mark either both ends of the first snake (label 1) or one end of each long
snake (label 0), so the strokes of both classes are drawn alike and only the connection differs. Image i is a
function of (seed, i) alone; labels alternate, so the classes are balanced. It follows the spirit of the
released generator (drewlinsley/pathfinder, with LRA's Pathfinder-32 settings: contour length 14, distractor
length contour_length // 3, 20 // distractor_length distractors), not its code.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np

from ...utils.files import write_bytes_atomic
from ..lra_layouts import PATHFINDER_VARIANTS

GENERATOR_VERSION = 1


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

    if variant not in PATHFINDER_VARIANTS:
        raise ValueError(f"pathfinder variant must be one of {sorted(PATHFINDER_VARIANTS)}, got {variant!r}")
    root = Path(out) / variant
    lines: dict[int, list[str]] = {}
    for i in range(n):
        label = i % 2
        img = render(seed, i, label, size=size, contour_length=PATHFINDER_VARIANTS[variant])
        folder = i // per_folder
        path = root / "imgs" / str(folder) / f"sample_{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(img, mode="L").save(buf, format="PNG")
        path.write_bytes(buf.getvalue())
        paddles = PATHFINDER_VARIANTS[variant]
        lines.setdefault(folder, []).append(f"imgs/{folder} sample_{i}.png {i} {label} {paddles}\n")
    for folder, rows in lines.items():
        write_bytes_atomic(root / "metadata" / f"{folder}.npy", "".join(rows).encode())
    return root
