"""Where a number came from: commit, library versions, hardware. Recorded in every summary.json."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("condattn", "torch", "timm", "transformers", "accelerate", "hydra-core", "datasets", "wandb")


# Tracked paths whose edits do not change what a run computes: the committed tables and figures that `make
# reproduce-*` regenerates. Rebuilding a table must not mark every later run +dirty.
NOT_CODE = ("results",)


def git_commit() -> str:
    """HEAD's short hash, with '+dirty' when tracked files outside NOT_CODE differ from it; 'unknown' outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             *(f":(exclude){p}" for p in NOT_CODE)], cwd=REPO, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def hardware(device: torch.device, num_processes: int, num_nodes: int = 1) -> dict[str, object]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {
        "device_type": device.type,
        "device_name": name,
        "num_processes": num_processes,
        "num_nodes": num_nodes,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # the CPU kernels torch dispatches to (AVX2 / AVX512 ...): they, like the thread count, change CPU results
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "host": socket.gethostname(),
    }


def describe(hw: dict) -> str:
    """One line for tables: '2 × cpu (x86_64, 2 cores)' or '8 × cuda (NVIDIA H100)'."""
    extra = f"{hw['device_name']}, {hw['cpu_count']} cores" if hw["device_type"] == "cpu" else hw["device_name"]
    nodes = int(hw.get("num_nodes", 1) or 1)
    return f"{hw['num_processes']} × {hw['device_type']} ({extra})" + (f" on {nodes} nodes" if nodes > 1 else "")


# The code that can change what a run computes, in parts a table can name: a run records each part's fingerprint
# (a hash of the files' contents, so an uncommitted edit counts too), and a table says where one reading's runs differ.
# Engine files that only record, report, plan or name runs are left out: editing them changes no number.
CODE_PARTS = {
    "conditioning": ("condattn/conditioning",),
    "model": ("condattn/models",),
    "task": ("condattn/tasks", "condattn/data"),
    # utils/typed_config.py: the defaults of impl/optim/task keys a recipe leaves unset (weight decay, warm-up, ...)
    "engine": ("condattn/engine", "condattn/train.py", "condattn/config.py", "condattn/utils/typed_config.py"),
    # the measurements a run records beside its training (table 9's step-0 readings): recorded, and named by a table
    # whose readings differ, but a run is not retrained for them (they change no trained weight)
    "diagnostics": ("condattn/diagnostics",),
}
# Provenance is the code a run executed: the conditioning part of a run covers the library's shared code and its own
# method's modules (MethodSpec.sources), never another method's (an edit to σReparam leaves every SCA run as it was).
# A method with none runs shared code only (the baseline).
LIBRARY = "condattn/conditioning"


def method_files() -> dict[str, tuple[str, ...]]:
    """{registered method: its own modules, repo-relative}, read from the registry (MethodSpec.sources)."""
    from ..conditioning.spec import METHODS, method_spec

    return {m: tuple(f"{LIBRARY}/{f}" for f in method_spec(m).sources) for m in METHODS}


STALE_PARTS = ("conditioning", "model", "task", "engine")  # what --refresh-stale retrains for
NOT_RESULT = tuple(f"condattn/engine/{f}" for f in (
    "cost.py", "flops.py", "logging.py", "errors.py", "provenance.py", "summary.py", "twins.py", "identity.py",
    "preflight.py", "signals.py", "parts/progress.py", "parts/throughput.py", "parts/signals.py",
    "step0.py", "runcost.py"))  # (step0.py: recomputes a record's step-0 readings; a training run never executes it;
# runcost.py: the run's CPU time by cause, timing only)


def _files(paths: tuple[str, ...], root: Path | None = None) -> list[Path]:
    root = root or REPO
    out: list[Path] = []
    for p in paths:
        full = root / p
        found = sorted(full.rglob("*.py")) if full.is_dir() else ([full] if full.exists() else [])
        out += [f for f in found if f.relative_to(root).as_posix() not in NOT_RESULT]
    return out


@functools.lru_cache(maxsize=4096)  # keyed by the bytes themselves: a table plans its cells from the same files
def normalised(source: bytes) -> bytes:
    """A digest of what a Python file does: its syntax tree without docstrings, comments or layout, so that an edit to
    a docstring, a comment or the formatting is not a change of code (an error message's text still is). A file that
    does not parse is taken byte for byte."""
    import ast
    import hashlib

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return hashlib.sha256(source).digest()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).digest()


def source_files() -> dict[str, bytes]:
    """{repo-relative path: `normalised` digest} of every file a fingerprint may cover, read now."""
    return {f.relative_to(REPO).as_posix(): normalised(f.read_bytes()) for part in CODE_PARTS.values()
            for f in _files(part)}


def fingerprint(files: dict[str, bytes], method: str | None = None) -> dict[str, str]:
    """{part: 10-hex hash of its files (paths and `normalised` digests)} over `files` (`source_files()`, or a
    commit's: `files_at`). The
    conditioning part covers the shared library and `method`'s own modules ("a+b": both); method None: every file."""
    import hashlib

    by_method = method_files()
    own = {f for m in (method or "").split("+") for f in by_method.get(m, ())}
    others = {f for fs in by_method.values() for f in fs} - own
    out = {}
    for part, paths in CODE_PARTS.items():
        h = hashlib.sha256()
        for name in sorted(files):
            if not any(name == p or name.startswith(p + "/") for p in paths) or name in NOT_RESULT:
                continue
            if part == "conditioning" and method is not None and name in others:
                continue
            h.update(name.encode() + b"\0" + files[name] + b"\0")
        out[part] = h.hexdigest()[:10]
    return out


def code_fingerprint(method: str | None = None) -> dict[str, str]:
    """The fingerprint of the code on disk now, for a run of `method` (None: the conditioning part covers every
    method)."""
    return fingerprint(source_files(), method)


def files_at(commit: str) -> dict[str, bytes] | None:
    """`source_files()` as they were at `commit` (None: not in this repository's history)."""
    paths = [p for part in CODE_PARTS.values() for p in part]
    try:
        names = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "--", *paths], cwd=REPO,
                               capture_output=True, text=True, timeout=30)
        if names.returncode != 0:
            return None
        out = {}
        for name in names.stdout.split():
            if name.endswith(".py") and name not in NOT_RESULT:
                out[name] = normalised(subprocess.run(["git", "show", f"{commit}:{name}"], cwd=REPO,
                                                      capture_output=True, timeout=30).stdout)
        return out
    except (OSError, subprocess.TimeoutExpired):
        return None


# Fingerprints shown to compute the same: `python -m condattn.table.equivalence --since <commit>` trains one smoke cell
# per method at that commit and at HEAD, and records here where every metric is bit-identical.
EQUIVALENCE = REPO / "results" / "code_equivalence.json"


def equivalent_hashes(entries: list[dict] | None = None) -> dict[str, dict[str, str]]:
    """{part: {fingerprint: its class's representative}} from the recorded reproductions: a method's conditioning part
    from its own cell, the shared parts (engine, task, model) only from a batch (one from → to commit) in which every
    cell was bit-identical."""
    if entries is None:
        try:
            entries = json.loads(EQUIVALENCE.read_text()) if EQUIVALENCE.is_file() else []
        except (OSError, ValueError):
            entries = []
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    batches: dict[tuple[str, str], list[dict]] = {}
    for e in entries:
        batches.setdefault((e["from_commit"], e["to_commit"]), []).append(e)
    for batch in batches.values():
        whole = all(e["equal"] for e in batch)
        for e in batch:
            for part in STALE_PARTS:
                if e["equal"] and (part == "conditioning" or whole) and part in e["from_code"] and part in e["to_code"]:
                    a, b = find((part, e["from_code"][part])), find((part, e["to_code"][part]))
                    if a != b:
                        parent[a] = b
    out: dict[str, dict[str, str]] = {}
    for key in list(parent):
        out.setdefault(key[0], {})[key[1]] = find(key)[1]
    return out


def stale_parts(recorded: dict | None, now: dict[str, str], same: dict | None = None) -> list[str]:
    """The parts of STALE_PARTS whose fingerprint differs between a run's record and `now` (every one for a run that
    recorded none: it predates fingerprints); two fingerprints shown to compute the same (`equivalent_hashes`, read
    from results/code_equivalence.json when `same` is None) do not differ."""
    recorded = recorded or {}
    same = equivalent_hashes() if same is None else same

    def rep(part: str, h: str | None) -> str | None:
        return same.get(part, {}).get(h, h) if h is not None else None

    return [p for p in STALE_PARTS if p in now and rep(p, recorded.get(p)) != rep(p, now[p])]


def run_method(summary: Mapping) -> str | None:
    """The conditioning method a finished run trained (its resolved config's, else the summary's own `method`)."""
    cfg = summary.get("config")
    method = (cfg.get("conditioning") or {}).get("method") if isinstance(cfg, Mapping) else None
    return str(method) if method is not None else (str(summary["method"]) if summary.get("method") else None)


def other_code(recorded: Mapping | None, method: str | None, files: dict[str, bytes] | None = None,
               same: dict | None = None) -> list[str]:
    """THE rule of "same code", for the planner's STALE=1 (table/…: reproduce.todo, through identity.answers) and the
    tables' code line (table/provenance.py) alike: the parts of STALE_PARTS in which the code a finished run recorded
    (`recorded`, its summary's `code`) differs from this code's for its `method` (`fingerprint` of `files`, the code on
    disk when None), two fingerprints recorded as computing the same (`same`: `equivalent_hashes()`, from
    results/code_equivalence.json, when None) agreeing. Empty: the run is current, and STALE=1 leaves it."""
    files = source_files() if files is None else files
    return stale_parts(dict(recorded) if recorded else None, fingerprint(files, method), same)


_AT_START: dict[str, object] = {}


def at_start() -> dict[str, object]:
    """{"commit", "commit_state"} and the source files of the code this process runs: read once, when it first trains
    (the trainer calls this before building anything), so a process that trains many cells records the code it
    loaded, not the files edited on disk since (a long table run beside development)."""
    if not _AT_START:
        _AT_START.update(commit=git_commit(), commit_state=commit_state(), files=source_files())
    return _AT_START


def run_provenance(method: str | None) -> dict[str, object]:
    """What a run's summary records of its code: the commit, whether it is on main, the code fingerprint for its
    method."""
    start = at_start()
    return {"commit": start["commit"], "commit_state": start["commit_state"],
            "code": fingerprint(start["files"], method)}  # type: ignore[arg-type]


def commit_state() -> str:
    """"on main" when HEAD is in main's history (origin/main where there is a remote) with no uncommitted change to the
    code; else says which: "uncommitted changes" or "not on main" (a branch or an unpushed commit)."""
    if git_commit().endswith("+dirty"):
        return "uncommitted changes"
    for ref in ("origin/main", "main"):
        try:
            got = subprocess.run(["git", "merge-base", "--is-ancestor", "HEAD", ref], cwd=REPO, capture_output=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        if got.returncode in (0, 1):
            return "on main" if got.returncode == 0 else "not on main"
    return "unknown"
