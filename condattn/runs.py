"""The run directory, read and written in one place.

A run is named by its identity (`RunId`: table, row, method, scale, seed -> `<table>_<row>_<method>_<scale>_s<seed>`,
then its variant, if any: the protocol's own in words, `-lr2x` for an lr-grid multiplier and `-steps2x` for the length
check, then `-<8 hex>` for overrides the words do not carry (`VARIANT`), under `<runs root>/<scale>/`) and recorded
in its directory (`RunRecord`); `RunLock` lets one process at a time train it:

    config.yaml         the resolved config (written at start)
    metrics.jsonl       one row per log / eval / diagnostics step ({"step", "split", ...})
    checkpoints/        step_NNNNNNN/ (accelerate's state, model.safetensors; COMPLETE once whole)
    best_model.pt       the best-validation weights (tasks with a test split)
    patch_report.json   what the conditioning patch touched
    submission.json     the SLURM job of the cell (launch)
    summary.json        written last: status finished (with "metrics") or failed (with "error")

Whether a run finished is decided here only (`RunRecord.status`, `RunRecord.summary`). A finished run is kept beside
its table as one compressed record (`KeptRecord`); `python -m condattn.runs compact | train-dict` are the records'
one-time tools (`main`). The run record is a leaf of the harness: it imports the standard library, condattn.utils and
zstandard (the records' format), nothing above.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .utils.io import read_json, read_jsonl, write_json_atomic

SUMMARY = "summary.json"
CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step_"
BEST_MODEL = "best_model.pt"
PATCH_REPORT = "patch_report.json"
SUBMISSION = "submission.json"
TOKENIZER = "tokenizer.json"
# What a finished run keeps beside its table (results/<scale>/runs/<run name>.json.zst, committed: `KeptRecord`): the
# evidence a table is rendered from, without checkpoints, weights or wandb files (about 7 kB a run compressed).
KEPT_FILES = (CONFIG, METRICS, PATCH_REPORT, SUMMARY)


@dataclass(frozen=True)
class RunId:
    """Who a run is: one cell (row × method × seed) of a table at a scale, and its variant: '' for the config the
    cell's own overrides compose, else what the run changes (`variant_of`): 'lr2x', 'steps2x', 'lr0.5x-steps2x', and
    after them 8 hex digits of the hash of its science config (engine/identity.py) when it has options the words do
    not say (e.g. an extra `conditioning.lam=2`: 'lr2x-1a2b3c4d', or '1a2b3c4d' alone)."""

    table: str
    row: str
    method: str
    scale: str
    seed: int
    variant: str = ""

    @property
    def name(self) -> str:
        return f"{self.table}_{self.row}_{self.method}_{self.scale}_s{self.seed}" + \
            (f"-{self.variant}" if self.variant else "")

    def dir(self, runs_root: str | Path) -> Path:
        return Path(runs_root) / self.scale / self.name

    @classmethod
    def parse(cls, name: str, table: str, rows, methods, scale: str) -> RunId | None:
        """The RunId whose name is `name`, given the table's rows and methods (names alone are ambiguous: rows and
        methods may hold underscores), or None. Longer methods are tried first ("spectral+embedded" before
        "embedded"). Names without a variant parse with variant ''."""
        for method in sorted(methods, key=len, reverse=True):
            for row in rows:
                prefix = f"{table}_{row}_{method}_{scale}_s"
                if name.startswith(prefix) and (m := SEED_VARIANT.fullmatch(name[len(prefix):])):
                    return cls(table, row, method, scale, int(m.group(1)), m.group(2)[1:])
        return None


# What follows a run name's seed: the protocol's variants in words, then the hash of overrides they do not say.
VARIANT = r"(?:-lr[0-9.]+x)?(?:-steps[0-9.]+x)?(?:-[0-9a-f]{8})?"
SEED_VARIANT = re.compile(rf"(-?[0-9]+)({VARIANT})")


def variant_of(lr: float = 1.0, steps: float = 1.0, digest: str = "") -> str:
    """A run's variant (`RunId.variant`): 'lr2x' for an lr multiplier, 'steps2x' for a length factor (1: not said),
    then `digest`, the science hash of overrides the words do not say: variant_of(0.5, 2) == 'lr0.5x-steps2x'."""
    def x(v: float) -> str:
        return f"{float(v):.10f}".rstrip("0").rstrip(".")
    return "-".join([*([f"lr{x(lr)}x"] if lr != 1 else []), *([f"steps{x(steps)}x"] if steps != 1 else []),
                     *([digest] if digest else [])])


@dataclass
class RunSummary:
    """A typed view of summary.json: the keys its readers use. Missing keys (older summaries, failed runs) are None;
    `raw` keeps the whole dict."""

    status: str | None = None
    run_name: str | None = None
    run_dir: str | None = None
    table: str | None = None
    row: str | None = None
    method: str | None = None
    scale: str | None = None
    seed: int | None = None
    metrics: dict[str, Any] | None = None
    steps: int | None = None
    wall_time_s: float | None = None
    train_time_s: float | None = None
    hardware_line: str | None = None
    commit: str | None = None
    data: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    finished_at: str | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSummary:
        return cls(**{f.name: d.get(f.name) for f in fields(cls) if f.name != "raw"}, raw=d)

    @property
    def run_id(self) -> RunId | None:
        """The identity recorded in the summary (None when a key is missing, e.g. a failed run's summary)."""
        parts = (self.table, self.row, self.method, self.scale, self.seed)
        if any(p is None for p in parts):
            return None
        plain = RunId(*parts[:4], int(parts[4]))  # type: ignore[arg-type]
        name = str(self.run_name or "")
        rest = name[len(plain.name):] if name.startswith(plain.name) else ""
        return replace(plain, variant=rest[1:]) if re.fullmatch(VARIANT, rest) else plain


class RunRecord:
    """One run directory: its status, summary, files, and the writers of its summary."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)

    @classmethod
    def of(cls, runs_root: str | Path, run_id: RunId, variants: Mapping[str, str] | None = None) -> RunRecord:
        """The record of `run_id`; `variants` ({plain name: variant}, a plan's `Plan.variants`) gives the variant the
        cell ran under: its lr pick's words (`lr2x`) and the hash of the command's own overrides."""
        if variants and not run_id.variant and run_id.name in variants:
            run_id = replace(run_id, variant=variants[run_id.name])
        return cls(run_id.dir(runs_root))

    def __repr__(self) -> str:
        return f"RunRecord({str(self.dir)!r})"

    # ----------------------------------------------------------------------------------------- paths
    @property
    def summary_path(self) -> Path:
        return self.dir / SUMMARY

    @property
    def config_path(self) -> Path:
        return self.dir / CONFIG

    @property
    def metrics_path(self) -> Path:
        return self.dir / METRICS

    @property
    def checkpoints_dir(self) -> Path:
        return self.dir / CHECKPOINTS

    @property
    def best_model_path(self) -> Path:
        return self.dir / BEST_MODEL

    @property
    def patch_report_path(self) -> Path:
        return self.dir / PATCH_REPORT

    @property
    def submission_path(self) -> Path:
        return self.dir / SUBMISSION

    def looks_like_run(self) -> bool:
        """A directory a run has written to (a summary, metrics rows or checkpoints)."""
        return self.dir.is_dir() and (self.summary_path.exists() or self.metrics_path.exists()
                                      or self.checkpoints_dir.is_dir())

    # ----------------------------------------------------------------------------------------- status
    def read_summary(self) -> dict | None:
        """summary.json as written, whatever its status (None: missing or unreadable)."""
        s = read_json(self.summary_path)
        return s if isinstance(s, dict) else None

    @property
    def status(self) -> str:
        """finished | failed | corrupt (unreadable, or finished without metrics: treated as unfinished) | absent |
        <other status>."""
        if not self.summary_path.exists():
            return "absent"
        s = self.read_summary()
        if s is None or (s.get("status") == "finished" and "metrics" not in s):
            return "corrupt"
        return str(s.get("status", "corrupt"))

    @property
    def summary(self) -> dict | None:
        """The summary of a finished run (status finished, with metrics), else None."""
        s = self.read_summary()
        return s if s is not None and s.get("status") == "finished" and "metrics" in s else None

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def summary_view(self) -> RunSummary | None:
        """The typed view of summary.json, whatever its status (None: missing or unreadable)."""
        s = self.read_summary()
        return None if s is None else RunSummary.from_dict(s)

    def failure(self) -> str | None:
        """A failed run's error message ("" when it recorded none); None unless the run failed."""
        s = self.read_summary()
        return str(s.get("error") or "") if s is not None and s.get("status") == "failed" else None

    # ----------------------------------------------------------------------------------------- files
    def metrics_rows(self, split: str | None = None) -> list[dict]:
        """metrics.jsonl rows in order (a torn last line is dropped), optionally only one split's."""
        rows = read_jsonl(self.metrics_path)
        return rows if split is None else [r for r in rows if r.get("split") == split]

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (their COMPLETE marker written), oldest first."""
        return list_checkpoints(self.dir)

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.dir)

    def final_weights(self) -> Path | None:
        """The run's last weights: its latest checkpoint's model.safetensors, else best_model.pt, else None."""
        ckpt = self.latest_checkpoint()
        for f in ([ckpt / "model.safetensors"] if ckpt else []) + [self.best_model_path]:
            if f.is_file():
                return f
        return None

    def tokenizer_file(self) -> Path | None:
        """The tokenizer.json of the run's data: the run's own copy (engine/setup.py keep_tokenizer), else the data
        cache its summary names (text builders cache it there), else the `data.tokenizer` of its config.yaml; None
        when none names one."""
        own = self.dir / TOKENIZER
        if own.is_file() and (why := unreadable_tokenizer(own)):  # set aside, named; the next source is used
            import sys

            moved = set_aside(own)
            print(f"[condattn] warning: {own} is unreadable ({why}); set it aside as {moved.name} and looking for the "
                  "run's tokenizer in its data cache", file=sys.stderr, flush=True)
        if own.is_file():
            return own
        cache = ((self.read_summary() or {}).get("data") or {}).get("cache")
        if cache and (Path(cache) / TOKENIZER).is_file():
            return Path(cache) / TOKENIZER
        if self.config_path.is_file():
            import yaml

            tok = ((yaml.safe_load(self.config_path.read_text()) or {}).get("data") or {}).get("tokenizer")
            if tok:
                return Path(tok)
        return None

    def submission(self) -> dict | None:
        rec = read_json(self.submission_path)
        return rec if isinstance(rec, dict) else None

    def patch_report(self) -> dict | None:
        rec = read_json(self.patch_report_path)
        return rec if isinstance(rec, dict) else None

    # ----------------------------------------------------------------------------------------- writers
    def write_summary(self, summary: dict) -> None:
        """Atomically: a crash never leaves a half-written summary behind."""
        write_json_atomic(self.summary_path, summary)

    def write_failure(self, error: str, step: int, last_good_checkpoint: str | Path | None, run_name: str,
                      config: Any) -> dict:
        """The summary of a run that failed (diverged): what happened, where, and the last checkpoint to resume
        from; a rerun treats the run as unfinished."""
        summary = {"status": "failed", "error": error, "step": step, "last_good_checkpoint": str(last_good_checkpoint
                                                                                                 or ""),
                   "run_name": run_name, "run_dir": str(self.dir), "config": config}
        self.write_summary(summary)
        return summary

    def keep_in(self, root: str | Path) -> bool:
        """Store this finished run's KEPT_FILES as one compressed record `<root>/<run name>.json.zst` (a table's
        committed run records, `KeptRecord`); False when the run is not finished, is itself a restored record or a
        link to another table's run (a twin: its own record is stored once, under its own name), or the record kept
        there is the same run or a later one (its `finished_at`), so a clone never writes back what it restored nor
        replaces a newer record."""
        summary = self.summary
        if summary is None or summary.get("restored_from") or self.dir.is_symlink():
            return False
        dest = KeptRecord.of(root, self.dir.name)
        kept = dest.summary
        if kept is not None and (same_run(kept, summary) or str(kept.get("finished_at") or "") >=
                                 str(summary.get("finished_at") or "")):
            return False
        files = {n: (self.dir / n).read_text() for n in KEPT_FILES[:-1] if (self.dir / n).is_file()}
        dest.write({**files, SUMMARY: summary})
        return True

    def restore_from(self, kept: KeptRecord) -> bool:
        """Make this run dir the finished run `kept` records (a committed run record); its summary's run_dir names the
        new place and `restored_from` the record. Done only while no process trains the dir (its RunLock) and when the
        dir is absent, or holds an earlier restore of another record (a newer record came with a pull). False
        otherwise, and when `kept` is not a finished run."""
        summary = kept.summary
        if summary is None or self.dir.is_symlink():
            return False
        lock = RunLock(self.dir)
        if not lock.try_acquire():
            return False
        try:
            if self.dir.exists():
                mine = self.read_summary() or {}
                if not mine.get("restored_from") or same_run(mine, summary):
                    return False
                import shutil

                shutil.rmtree(self.dir)
            self.dir.mkdir(parents=True, exist_ok=True)
            for name, text in (kept.files or {}).items():
                if name != SUMMARY:
                    (self.dir / name).write_text(text)
            self.write_summary({**summary, "run_dir": str(self.dir), "restored_from": str(kept.path)})
            return True
        finally:
            lock.release()

    def write_submission(self, record: dict) -> None:
        write_json_atomic(self.submission_path, record)

    def write_patch_report(self, report: dict) -> None:
        write_json_atomic(self.patch_report_path, report)


KEPT_SUFFIX = ".json.zst"  # a kept record: a zstd frame of its files' JSON, made with a shared dictionary
GZIP_SUFFIX = ".json.gz"  # the earlier format (gzip -9 of the same JSON): still read, never written
# The dictionaries of kept records, `<dict id>.zdict` (package data). A record's frame names its dictionary's id, so a
# dictionary added later leaves the earlier records readable; new records are written with RECORD_DICT_ID's, trained
# by `python -m condattn.runs train-dict results/small/runs` (`train_dict`: its sample and parameters).
RECORD_DICTS = Path(__file__).resolve().parent / "record_dicts"
RECORD_DICT_ID = 1973140013
RECORD_LEVEL = 19
DICT_SIZE, DICT_EVERY = 512 * 1024, 4  # measured: docs/architecture.md, "The record format"


def record_dict(dict_id: int) -> Any:
    """The zstandard dictionary `dict_id` (RECORD_DICTS/<dict id>.zdict, read once a process), or None without it."""
    path = RECORD_DICTS / f"{dict_id}.zdict"
    return _load_dict(path) if path.is_file() else None


@functools.cache
def _load_dict(path: Path) -> Any:
    import zstandard

    return zstandard.ZstdCompressionDict(path.read_bytes())


@functools.cache
def _writing_dict() -> Any:
    """The newest dictionary, prepared once a process for RECORD_LEVEL (a record then compresses in milliseconds,
    not the tenth of a second that loading the dictionary takes)."""
    d = record_dict(RECORD_DICT_ID)
    if d is None:
        raise FileNotFoundError(f"the records' dictionary {RECORD_DICT_ID} is not in {RECORD_DICTS} (an install "
                                "without condattn's package data?)")
    d.precompute_compress(level=RECORD_LEVEL)
    return d


def _encode(data: bytes) -> bytes:
    """`data` as a kept record's zstd frame: level RECORD_LEVEL, the newest dictionary (its id in the frame), the
    content size written, no checksum; the same data gives the same bytes."""
    import zstandard

    return zstandard.ZstdCompressor(level=RECORD_LEVEL, dict_data=_writing_dict(), write_checksum=False,
                                    write_content_size=True, write_dict_id=True).compress(data)


def _decode(path: Path) -> tuple[bytes | None, str | None]:
    """(the JSON bytes a record at `path` holds, None) or (None, why they cannot be read), for either format."""
    if path.name.endswith(GZIP_SUFFIX):
        import gzip
        import zlib

        try:
            return gzip.decompress(path.read_bytes()), None
        except (OSError, EOFError, zlib.error) as e:  # truncated, or not gzip
            return None, f"not a whole gzip file ({type(e).__name__}: {e})"
    import zstandard

    try:
        data = path.read_bytes()
        dict_id = zstandard.get_frame_parameters(data).dict_id
        d = record_dict(dict_id) if dict_id else None
        if dict_id and d is None:
            return None, (f"written with zstd dictionary {dict_id}, which {RECORD_DICTS} does not hold "
                          f"({dict_id}.zdict: a record from a newer condattn? update it)")
        return zstandard.ZstdDecompressor(dict_data=d).decompress(data), None
    except (OSError, zstandard.ZstdError) as e:  # truncated, or not zstd
        return None, f"not a whole zstd file ({type(e).__name__}: {e})"


def _write_atomic(path: Path, data: bytes) -> None:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class KeptRecord:
    """A finished run's committed record, stored once and compactly: `<root>/<run name>.json.zst` holds the texts of
    its KEPT_FILES (config, metrics, patch report) and its summary, as the JSON of {file name: text, summary.json:
    dict}; a record of the earlier format, `<run name>.json.gz`, reads the same. Tables are rendered from runs
    restored out of these (`RunRecord.restore_from`); a run is never stored twice (a twin links to the one record of
    its science config)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._files: dict | None = None

    @classmethod
    def of(cls, root: str | Path, name: str) -> KeptRecord:
        """The record of `name` under `root`: its .json.zst, else its .json.gz, else (none yet) the .json.zst."""
        zst, gz = Path(root) / f"{name}{KEPT_SUFFIX}", Path(root) / f"{name}{GZIP_SUFFIX}"
        return cls(gz if gz.is_file() and not zst.is_file() else zst)

    @property
    def name(self) -> str:
        n = self.path.name
        return next((n[: -len(s)] for s in (KEPT_SUFFIX, GZIP_SUFFIX) if n.endswith(s)), n)

    @property
    def files(self) -> dict | None:
        """{file name: text} (the summary as a dict); None when absent or unreadable."""
        if self._files is None and self.path.is_file():
            got, _ = self._read()
            self._files = got if isinstance(got, dict) else None
        return self._files

    def _read(self) -> tuple[Any, str | None]:
        """(the decoded JSON, None) or (None, why it cannot be read)."""
        import json

        data, why = _decode(self.path)
        if why:
            return None, why
        try:
            return json.loads(data), None
        except ValueError as e:
            return None, f"not JSON inside its {'gzip' if self.path.name.endswith(GZIP_SUFFIX) else 'zstd frame'} ({e})"

    @property
    def unreadable(self) -> str | None:
        """Why the record at `path` is not a finished run's (truncated, not zstd / gzip, not JSON, its dictionary
        missing, no finished summary), or None: it reads, or there is none."""
        if not self.path.exists() or self.finished:
            return None
        got, why = self._read()
        if why:
            return why
        if not isinstance(got, dict) or not isinstance(got.get(SUMMARY), dict):
            return f"it holds no {SUMMARY}"
        return f"its {SUMMARY} is not a finished run's (status {got[SUMMARY].get('status')!r}, or no metrics)"

    @property
    def summary(self) -> dict | None:
        """The summary of a finished run, else None (as `RunRecord.summary`)."""
        s = (self.files or {}).get(SUMMARY)
        return s if isinstance(s, dict) and s.get("status") == "finished" and "metrics" in s else None

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def status(self) -> str:
        return "finished" if self.finished else "absent"

    def write(self, files: dict) -> None:
        """Write the record atomically as `<name>.json.zst` (the same files give the same bytes), then remove the
        run's `<name>.json.gz`, if any: one record a run. `path` is the .json.zst after."""
        import json

        dest = self.path.with_name(self.name + KEPT_SUFFIX)
        _write_atomic(dest, _encode(json.dumps(files, sort_keys=True).encode()))
        dest.with_name(self.name + GZIP_SUFFIX).unlink(missing_ok=True)
        self.path, self._files = dest, files


def kept_records(root: str | Path) -> list[KeptRecord]:
    """Every record kept under `root`, one a run (its .json.zst where a .json.gz of it is there too), in the order of
    their file names."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = {}
    for p in sorted(root.glob(f"*{GZIP_SUFFIX}")) + sorted(root.glob(f"*{KEPT_SUFFIX}")):  # a .json.zst last: it wins
        found[KeptRecord(p).name] = p
    return [KeptRecord(found[n]) for n in sorted(found, key=lambda n: f"{n}.json")]  # the file names' order


def compact(roots: list[str | Path]) -> int:
    """Rewrite each `.json.gz` record under `roots` as `.json.zst` holding the same JSON bytes, checked by reading the
    new file back before the old one is removed; print counts and sizes. Returns how many were left as they were
    (unreadable, or a .json.zst of other content beside them)."""
    import json

    left = 0
    for root in map(Path, roots):
        olds = sorted(root.glob(f"*{GZIP_SUFFIX}")) if root.is_dir() else []
        before = after = kept = 0
        for gz in olds:
            zst = gz.with_name(KeptRecord(gz).name + KEPT_SUFFIX)
            data, why = _decode(gz)
            if why is None:
                try:
                    json.loads(data)  # JSON inside, too
                except ValueError as e:
                    why = f"not JSON inside its gzip ({e})"
            fresh = why is None and not zst.exists()
            if fresh:
                _write_atomic(zst, _encode(data))
            if why is None and _decode(zst)[0] != data:
                why = "the .json.zst written does not read back the same" if fresh else \
                    f"{zst.name} is there too, with other content (remove the one not wanted)"
                if fresh:
                    zst.unlink()
            if why:
                print(f"  left {gz}: {why}")
                left += 1
                continue
            before, after, kept = before + gz.stat().st_size, after + zst.stat().st_size, kept + 1
            gz.unlink()
        print(f"{root}: {kept} of {len(olds)} .json.gz records rewritten as .json.zst: {before:,} -> {after:,} bytes"
              + (f" ({after / before:.0%})" if before else "")
              + f"; {len(kept_records(root))} records there now")
    return left


def train_dict(root: str | Path, size: int = DICT_SIZE, every: int = DICT_EVERY, out: Path | None = None) -> Path:
    """Train a records dictionary (`size` bytes) on every `every`-th record under `root` in name order (the JSON each
    holds), with fixed parameters (fastCOVER k=2048, d=8, all samples, one thread), so the same records give the same
    dictionary and id; write it as `<out>/<dict id>.zdict` (RECORD_DICTS by default) and return its path."""
    import json

    import zstandard

    samples = [json.dumps(r.files, sort_keys=True).encode() for r in kept_records(root)[::every] if r.files]
    d = zstandard.train_dictionary(size, samples, k=2048, d=8, split_point=1.0, level=RECORD_LEVEL, threads=1)
    path = Path(out or RECORD_DICTS) / f"{d.dict_id()}.zdict"
    _write_atomic(path, d.as_bytes())
    return path


def same_run(a: dict, b: dict) -> bool:
    """Whether two summaries record the same run, wherever it lies (`run_dir`, `restored_from` aside)."""
    def strip(s: dict) -> dict:
        return {k: v for k, v in s.items() if k not in ("run_dir", "restored_from")}
    return strip(a) == strip(b)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run directory, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
            and p.name[len(CHECKPOINT_PREFIX):].isdigit() and (p / "COMPLETE").exists()]  # not step_N.corrupt
    return sorted(done, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def unreadable_json(path: str | Path) -> str | None:
    """Why `path` is not a JSON object (None: it is one): empty, truncated, or another format."""
    import json

    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot be read as text: {type(e).__name__}"
    if not text.strip():
        return "it is empty (0 bytes)" if not text else "it holds only whitespace"
    try:
        obj = json.loads(text)
    except ValueError as e:
        return f"not valid JSON, truncated or another format: {e}"
    return None if isinstance(obj, dict) else f"it holds a JSON {type(obj).__name__}, not an object"


def unreadable_tokenizer(path: str | Path) -> str | None:
    """Why `path` is not a tokenizers `tokenizer.json` (None: it is one)."""
    if why := unreadable_json(path):
        return why
    import json

    return None if "model" in json.loads(Path(path).read_text()) else "a JSON object without a tokenizer 'model'"


def set_aside(checkpoint: str | Path) -> Path:
    """Rename an unreadable checkpoint (or run file) to `step_N.corrupt` (`summary.json.corrupt`, ...: kept for
    inspection, no longer listed or read); returns the new path."""
    p = Path(checkpoint)
    dest = p.with_name(p.name + ".corrupt")
    n = 1
    while dest.exists():
        dest, n = p.with_name(f"{p.name}.corrupt{n}"), n + 1
    p.rename(dest)
    return dest


class RunLock:
    """An exclusive lock on a run directory, held by the process that trains it (fcntl; the kernel releases it when
    the process dies, so a killed run never leaves a stale lock). The lock file is `<scale dir>/.locks/<run name>.lock`
    (beside the run directory, which is only created once the run starts) and says who holds it: pid, host, since.

    `acquire` waits for the holder to finish, printing once who it is: two `reproduce` of the same table then train
    each cell once, the later one finding it finished (and `launch.run_local` leaves a held cell for last, so each
    takes the next free one meanwhile)."""

    def __init__(self, run_dir: str | Path, poll_s: float = 1.0):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir.parent / ".locks" / f"{self.run_dir.name}.lock"
        self.poll_s = poll_s
        self._fd: int | None = None

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "another process"
        except OSError:
            return "another process"

    def try_acquire(self) -> bool:
        import fcntl
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        import socket
        import time

        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}\n".encode())
        self._fd = fd
        return True

    def held_elsewhere(self) -> bool:
        """Whether another process (or another holder in this one) trains the run now. Takes the lock for an instant
        only, without writing who holds it (a waiting process keeps naming the real holder); creates nothing when no
        lock file exists yet (nobody has trained the run)."""
        import fcntl
        import os

        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing the descriptor drops an flock taken through it
        return False

    def acquire(self, timeout_s: float | None = None) -> None:
        """Wait until the lock is ours (TimeoutError after timeout_s)."""
        import sys
        import time

        t0, told = time.time(), False
        while not self.try_acquire():
            if not told:
                print(f"[condattn] {self.run_dir} is being trained by {self.holder()}; waiting for it to end",
                      file=sys.stderr, flush=True)
                told = True
            if timeout_s is not None and time.time() - t0 > timeout_s:
                raise TimeoutError(f"{self.run_dir} is still locked by {self.holder()} after {timeout_s:.0f} s")
            time.sleep(self.poll_s if timeout_s is None else min(self.poll_s, max(0.0, t0 + timeout_s - time.time())))

    def release(self) -> None:
        if self._fd is not None:
            import fcntl
            import os

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def resolve_run_dir(init_from: str, runs_root: str | Path) -> Path:
    """The run dir of `init_from`: a run dir, a file inside one (or inside its checkpoints/step_N/), or a run name
    found exactly once under runs_root/*/."""
    p = Path(init_from)
    if p.is_file():
        return p.parent.parent.parent if p.parent.name.startswith(CHECKPOINT_PREFIX) else p.parent
    if p.is_dir():
        return p
    found = sorted(Path(runs_root).glob(f"*/{init_from}"))
    if len(found) == 1:
        return found[0]
    why = f"several runs match: {', '.join(map(str, found))}" if found else \
        f"it is no file or run dir, and {runs_root}/*/{init_from} does not exist"
    raise FileNotFoundError(f"{init_from!r}: {why}. Give the earlier run's directory (runs/<scale>/<run name>), a "
                            "unique run name (finish that run first), or a weights file.")


def summary_is_finished(run_dir: str | Path) -> dict | None:
    """The summary of a finished run, else None (RunRecord(run_dir).summary)."""
    return RunRecord(run_dir).summary


def summary_status(run_dir: str | Path) -> str:
    """finished | failed | corrupt | absent | <other status> (RunRecord(run_dir).status)."""
    return RunRecord(run_dir).status


def main(argv: list[str] | None = None) -> int:
    """`python -m condattn.runs compact DIR...` | `train-dict DIR`: the kept records' one-time tools."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m condattn.runs", description="Tools for kept run records.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compact", help="rewrite the .json.gz records under each DIR as .json.zst (the same JSON)")
    c.add_argument("dirs", nargs="+", metavar="DIR")
    t = sub.add_parser("train-dict", help=f"train a records dictionary into {RECORD_DICTS} from DIR's records")
    t.add_argument("dir", metavar="DIR")
    t.add_argument("--size", type=int, default=DICT_SIZE, help="dictionary size in bytes (default %(default)s)")
    t.add_argument("--every", type=int, default=DICT_EVERY, help="sample every Nth record (default %(default)s)")
    args = p.parse_args(argv)
    if args.cmd == "compact":
        return 1 if compact(args.dirs) else 0
    path = train_dict(args.dir, args.size, args.every)
    print(f"wrote {path} ({path.stat().st_size:,} bytes); set RECORD_DICT_ID = {path.stem} in condattn/runs.py to "
          "write new records with it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
