"""Reading the run records (JSON, JSON lines) tolerantly; writing them atomically (utils/files.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .files import write_json_atomic

__all__ = ["read_json", "read_jsonl", "write_json_atomic"]


def read_json(path: str | Path) -> Any | None:
    """The parsed file, or None when it is missing or corrupt (e.g. truncated by a crash)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a torn last line from a crash
    except OSError:
        pass
    return rows
