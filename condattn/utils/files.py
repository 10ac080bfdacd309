"""The file helpers everything shares: atomic writes, the sha256 of files, and cached generation records.

Atomic: the data goes to a temp file next to the target, then `os.replace` puts it in place, so a crash
mid-write never leaves a half-written summary, checkpoint, split file or generation record behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

PathLike = str | os.PathLike[str]


@functools.cache
def _umask() -> int:
    """The process umask (read once: os.umask can only be read by setting it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The permissions `open(path, "w")` would give: an existing file's own, else 0o666 less the umask (0644 under
    the usual 022). mkstemp creates its temp file 0600, which the rename would otherwise carry over."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def write_bytes_atomic(path: PathLike, data: bytes, *, fsync: bool = False) -> None:
    """Write `data` to a temp file next to `path`, then rename it over `path` (parents are created), with the
    permissions a plain write would give (`_mode_for`). `fsync` also flushes it to disk before the rename (run
    records; generated data can be redone)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: PathLike, text: str, *, fsync: bool = False) -> None:
    """`text` as UTF-8, newlines written as they are (no platform translation)."""
    write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """`obj` as indented JSON (non-JSON values as their str), flushed to disk: the run records' writer."""
    write_text_atomic(path, json.dumps(obj, indent=2, default=str), fsync=True)


class Checksum:
    """sha256 over a sequence of files (or byte strings) in the order they are added."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add_bytes(self, data: bytes) -> bytes:
        self._h.update(data)
        return data

    def add_file(self, path: PathLike) -> None:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                self._h.update(chunk)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def files_checksum(paths: Iterable[PathLike]) -> str:
    """sha256 hex of the files' bytes, concatenated in the given order (the checksum summaries record)."""
    c = Checksum()
    for p in paths:
        c.add_file(p)
    return c.hexdigest()


def params_dir(cache: PathLike, name: str, params: Mapping[str, Any]) -> Path:
    """`cache/name/<hash of params>`: one folder per distinct generation request."""
    digest = hashlib.sha256(json.dumps(dict(params), sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache) / name / digest


GENERATION_RECORD = "generation.json"


def ensure_generated(out: PathLike, params: Mapping[str, Any], expected: Iterable[str],
                     generate: Callable[[Path], Any]) -> Path:
    """`out` as is when its `generation.json` records exactly `params` and every `expected` path (relative to
    `out`) exists; otherwise `generate(out)` and record `params`. The record is removed first, so an
    interrupted generation is never taken for a finished one."""
    out = Path(out)
    meta = out / GENERATION_RECORD
    if meta.is_file() and all((out / e).exists() for e in expected):
        try:
            if json.loads(meta.read_text(encoding="utf-8")) == dict(params):
                return out
        except json.JSONDecodeError:
            pass
    out.mkdir(parents=True, exist_ok=True)
    meta.unlink(missing_ok=True)
    generate(out)
    write_text_atomic(meta, json.dumps(dict(params), indent=2, sort_keys=True) + "\n")
    return out
