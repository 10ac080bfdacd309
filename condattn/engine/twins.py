"""Twins: a finished run of the same science config under another name, reused instead of trained again.

Two tables often hold one experiment: table 1's ViT row at small scale is table 9's baseline / SCA / CET /
conditioned-initialisation readings, cell for cell; table 4's ListOps row is table 9's ListOps readings. Their run names
differ (`RunId` carries the table), their science configs (`identity.science_config`) do not. Whether a run is a
cell's twin is `identity.answers`, the rule of every run dir: the same science config (and, under --refresh-stale,
the same code). `reproduce` asks
`TwinIndex.find` before it trains a cell whose run dir does not exist yet; a twin found is linked
(`link`: the cell's run dir becomes a relative symlink to it), so every reader of the cell — the tables, `compare`, the
curves — reads the one finished run. `--force` unlinks such a cell and trains it in its own dir (the twin is never
touched). The tables' provenance line counts the runs they read that were made under another name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..runs import RunRecord
from .identity import _container, answers, config_hash, recorded_config, science_config


class TwinIndex:
    """The finished runs under one runs root (its direct subdirectories, links excluded), by science-config hash;
    built on the first lookup (one config.yaml read per finished run)."""

    def __init__(self, runs_root: str | Path):
        self.root = Path(runs_root)
        self._by_hash: dict[str, list[Path]] | None = None

    def _build(self) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if d.is_symlink() or not d.is_dir() or not RunRecord(d).finished:
                continue
            recorded = recorded_config(d)
            if recorded is None:
                continue
            try:
                out.setdefault(config_hash(science_config(recorded)), []).append(d)
            except Exception:  # a config from an older layout that no longer resolves: not a twin of anything
                continue
        return out

    def find(self, cfg: Any, run_dir: str | Path, code: dict | None = None) -> Path | None:
        """A finished run other than `run_dir` that answers for `cfg` (`identity.answers`: its science config and,
        with `code` (--refresh-stale), engine/provenance.fingerprint for its method, the code that made it), the first
        by name; or None. The hash only finds the candidates; `answers` decides."""
        if self._by_hash is None:
            self._by_hash = self._build()
        here = Path(run_dir).resolve()
        for d in self._by_hash.get(config_hash(science_config(_container(cfg))), []):
            if d.resolve() != here and answers(cfg, recorded_config(d), code,
                                               (RunRecord(d).summary or {}).get("code")) is None:
                return d
        return None


def link(run_dir: str | Path, twin: str | Path) -> None:
    """Make `run_dir` (absent) a relative symlink to the finished run `twin`."""
    run_dir, twin = Path(run_dir), Path(twin)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(twin, run_dir.parent), run_dir, target_is_directory=True)


def made_elsewhere(summaries: list[dict], table: str) -> dict[str, int]:
    """{table: runs} of the summaries whose run was made for another table than `table` (reused twins)."""
    out: dict[str, int] = {}
    for s in summaries:
        made_for = s.get("table") or ((s.get("config") or {}).get("run") or {}).get("table")
        if made_for and made_for != table:
            out[made_for] = out.get(made_for, 0) + 1
    return out
