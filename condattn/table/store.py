"""The run store of one scale: the committed records under `results/<scale>/runs/` (one `<run name>.json.zst` each,
or an older `.json.gz`: `runs.KeptRecord`) and the live runs under `runs/<scale>/`.

A cell counts as finished when its live run is, or when a record of it is kept: under its own name, or under another
table's name with the same science config (a twin, stored once: table 1's ViT row is table 9's ViT readings cell for
cell). Before a plan is read, the records of its cells are restored into the runs root, so every reader (tables,
`compare`, curves) reads one kind of run dir; a twin's cell becomes a link to the one restored record. Whether a record
answers for a cell is `engine/identity.answers`, the rule of every run dir and twin. Dry runs and `reproduce-all`'s
projection read the same records without restoring them (table/kept.py), so they say what the real command will do
and write nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..runs import KeptRecord, RunRecord, kept_records


def kept_root(results_root: str | Path, scale: str) -> Path:
    """Where a scale's finished runs are kept (committed): results/<scale>/runs/."""
    return Path(results_root) / scale / "runs"


EXPLORATORY = "exploratory"  # results/exploratory/: ignored by git (.gitignore), never committed


def exploratory_root(results_root: str | Path) -> Path:
    """Where exploratory output goes (a table made with science overrides, `make compare`, `diagnose`):
    results/exploratory/, a folder git ignores, so that such a run leaves `git status` clean."""
    return Path(results_root) / EXPLORATORY


class RunStore:
    """The kept records of one scale, by run name and (built on the first twin lookup) by science-config hash."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._by_hash: dict[str, list[KeptRecord]] | None = None

    def get(self, name: str) -> KeptRecord:
        return KeptRecord.of(self.root, name)

    def twin(self, cfg: Any) -> KeptRecord | None:
        """The first kept record (by name) that answers for `cfg` (`identity.answers`: its science config), whatever
        table it was made for."""
        from ..engine.identity import _container, answers, config_hash, science_config

        if self._by_hash is None:
            self._by_hash = {}
            for rec in kept_records(self.root):
                s = rec.summary
                if s is None or not isinstance(s.get("config"), dict):
                    continue
                try:
                    self._by_hash.setdefault(config_hash(science_config(s["config"])), []).append(rec)
                except Exception:  # a config of an older layout that no longer resolves: a twin of nothing
                    continue
        return next((rec for rec in self._by_hash.get(config_hash(science_config(_container(cfg))), [])
                     if answers(cfg, rec.summary["config"]) is None), None)

    def record_for(self, name: str, cfg: Any, reuse: bool = True) -> KeptRecord | None:
        """The kept record of a cell: its own, else (`reuse`) its twin's; None when neither is kept, and when its own
        record is there but unreadable (`KeptRecord.unreadable`: reported, never stood in for)."""
        own = self.get(name)
        if own.finished or own.path.exists():
            return own if own.finished else None
        return self.twin(cfg) if reuse else None


class Records:
    """How a plan reads a cell's run, so that one plan sees what a restore would bring: the live run when it is
    finished, else the cell's kept record (its own or its twin's), else the live run (failed, absent, running)."""

    def __init__(self, scale: str, reuse: bool = True):
        self.scale, self.reuse = scale, reuse
        self._stores: dict[Path, RunStore] = {}

    def of(self, name: str, cfg: Any, run_dir: Path) -> RunRecord | KeptRecord:
        live = RunRecord(run_dir)
        if live.finished or not restorable(Path(run_dir)):
            return live
        root = kept_root(cfg.paths.results, self.scale)
        store = self._stores.setdefault(root, RunStore(root))
        return store.record_for(name, cfg, self.reuse) or live


def restorable(run_dir: Path) -> bool:
    """Whether a cell's run dir may take a kept record: not finished here, not set aside by --refresh-stale (a
    `.stale-N` beside it), and absent or itself an earlier restore."""
    own = RunRecord(run_dir)
    if own.finished or any(run_dir.parent.glob(f"{run_dir.name}.stale-*")):
        return False
    return not run_dir.exists() or bool((own.read_summary() or {}).get("restored_from"))


def restore(store: RunStore, name: str, cfg: Any, run_dir: Path, reuse: bool = True) -> str:
    """Restore the kept record of one cell into `run_dir`: its own record ("own"), or (`reuse`) its twin's record
    restored under the twin's name beside it and `run_dir` linked to that ("twin": the record is stored once, the cell
    reads it); "" when there is none to restore."""
    from ..engine.twins import link

    rec = store.record_for(name, cfg, reuse)
    if rec is None:
        return ""
    if rec.name == name:
        return "own" if RunRecord(run_dir).restore_from(rec) else ""
    twin_dir = run_dir.parent / rec.name
    if not RunRecord(twin_dir).finished and not RunRecord(twin_dir).restore_from(rec):
        return ""
    if run_dir.exists() and not run_dir.is_symlink():
        import shutil

        shutil.rmtree(run_dir)  # an earlier restore of this cell (restorable checked it): the link replaces it
    if not run_dir.is_symlink():
        link(run_dir, twin_dir)
    return "twin"
