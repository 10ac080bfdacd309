"""What the byte/pixel-level LRA tasks share: the token encoding and the datasets.

Token ids follow the LRA input pipelines: text is byte level through tfds' `ByteTextEncoder`, whose id is
`byte + 1` (0 is padding, vocabulary 257). Pixels (Image, Pathfinder) take the same shift, `value + 1`,
so that id 0 stays the padding id of the shared Nyströmformer embedding (its `padding_idx` row is a fixed
zero vector, which a black pixel must not get); the vocabulary is again 257 and an image has no padding.

Every sequence is stored once as `uint8` values plus a length, and turned into `input_ids`
(right-padded with 0 to `seq_len`) and `attention_mask` (1 = token) per item.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch.utils.data import Dataset

PAD_ID = 0
VOCAB_SIZE = 257  # 256 byte / pixel values shifted by one, plus padding
SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------------


def pack(rows: Iterable[bytes | np.ndarray], max_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(values [N, max_length] uint8 right-padded with 0, lengths [N] int32, number truncated) of byte rows
    (or uint8 arrays), each cut to its first `max_length` values."""
    rows = list(rows)
    values = np.zeros((len(rows), max_length), dtype=np.uint8)
    lengths = np.zeros(len(rows), dtype=np.int32)
    truncated = 0
    for i, row in enumerate(rows):
        arr = np.frombuffer(row, dtype=np.uint8) if isinstance(row, (bytes, bytearray)) else np.asarray(row, np.uint8)
        truncated += arr.size > max_length
        arr = arr[:max_length]
        values[i, : arr.size] = arr
        lengths[i] = arr.size
    return values, lengths, truncated


def byte_ids(data: bytes, max_length: int | None = None) -> list[int]:
    """tfds `ByteTextEncoder().encode` on bytes: every byte + 1, cut to `max_length` (reference for tests)."""
    return [b + 1 for b in data[:max_length]]


def check_lengths(seq_len: int, max_length: int) -> None:
    if not 0 < max_length <= seq_len:
        raise ValueError(f"need 0 < data.max_length <= data.seq_len, got {max_length}, {seq_len}")


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """[N, H, W] uint8 grayscale images resized to [N, size, size] with PIL (box filter when shrinking, which
    averages whole pixel blocks; bilinear when enlarging); returned unchanged when already that size."""
    from PIL import Image

    if images.shape[1:] == (size, size):
        return images
    shrink = size < images.shape[1]
    resample = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
    out = np.empty((len(images), size, size), dtype=np.uint8)
    for i, img in enumerate(images):
        out[i] = np.asarray(Image.fromarray(img, mode="L").resize((size, size), resample))
    return out


def image_rows(images: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, S, S] uint8 images as pixel sequences in row-major order (values, lengths) for seq_len = S²."""
    n, h, w = images.shape
    if h * w != seq_len:
        raise ValueError(f"{h}x{w} images give {h * w} pixel tokens but data.seq_len={seq_len}; set "
                         f"data.seq_len to data.image_size² ({h * w})")
    return images.reshape(n, h * w), np.full(n, h * w, dtype=np.int32)


# ----------------------------------------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------------------------------------


def _item(values: torch.Tensor, length: int, seq_len: int, keep: torch.Tensor | None = None):
    ids = torch.zeros(seq_len, dtype=torch.long)
    ids[:length] = values[:length].long() + 1
    mask = torch.zeros(seq_len, dtype=torch.long)
    mask[:length] = 1 if keep is None else keep[:length].long()
    return ids, mask


class SequenceDataset(Dataset):
    """Byte or pixel sequences with one label each: items {input_ids, attention_mask, labels}.

    `zero_is_padding` (images only) also masks every position whose value is 0, as the Nyströmformer LRA
    code does (its mask is `input_ids != 0` on raw pixel values, so black pixels are padding there)."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray, labels, seq_len: int, zero_is_padding: bool = False):
        if values.shape[1] > seq_len:
            raise ValueError(f"sequences of {values.shape[1]} values do not fit seq_len={seq_len}")
        self.values = torch.from_numpy(np.ascontiguousarray(values))
        self.lengths = torch.from_numpy(np.asarray(lengths, dtype=np.int64))
        self.labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        if not len(self.values) == len(self.lengths) == len(self.labels):
            raise ValueError("values, lengths and labels must have one row per example")
        self.seq_len, self.zero_is_padding = seq_len, zero_is_padding

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        v = self.values[index]
        ids, mask = _item(v, int(self.lengths[index]), self.seq_len, (v != 0) if self.zero_is_padding else None)
        return {"input_ids": ids, "attention_mask": mask, "labels": self.labels[index]}


class PairDataset(Dataset):
    """Two byte sequences and one label per example (LRA Retrieval): items {input_ids_0, attention_mask_0,
    input_ids_1, attention_mask_1, labels}, the keyword arguments of the two-tower model."""

    def __init__(self, first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray], labels,
                 seq_len: int):
        self.docs = [SequenceDataset(v, n, labels, seq_len) for v, n in (first, second)]
        self.labels = self.docs[0].labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        out = {}
        for k, ds in enumerate(self.docs):
            item = ds[index]
            out[f"input_ids_{k}"], out[f"attention_mask_{k}"] = item["input_ids"], item["attention_mask"]
        out["labels"] = self.labels[index]
        return out
