"""Where a number came from: commit, library versions, hardware. Recorded in every summary.json."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
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
    "conditioning": ("condattn/conditioning", "condattn/diagnostics"),  # diagnostics: table 9's step-0 columns
    "model": ("condattn/models",),
    "task": ("condattn/tasks", "condattn/data"),
    # utils/typed_config.py: the defaults of impl/optim/task keys a recipe leaves unset (weight decay, warm-up, ...)
    "engine": ("condattn/engine", "condattn/train.py", "condattn/config.py", "condattn/utils/typed_config.py"),
}
NOT_RESULT = tuple(f"condattn/engine/{f}" for f in (
    "cost.py", "flops.py", "logging.py", "errors.py", "provenance.py", "summary.py", "twins.py", "identity.py",
    "preflight.py", "signals.py", "parts/progress.py", "parts/throughput.py", "parts/signals.py"))


def _files(paths: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        full = REPO / p
        found = sorted(full.rglob("*.py")) if full.is_dir() else ([full] if full.exists() else [])
        out += [f for f in found if f.relative_to(REPO).as_posix() not in NOT_RESULT]
    return out


def code_fingerprint() -> dict[str, str]:
    """{part: 10-hex hash of its source files (paths and bytes)} for every part of CODE_PARTS."""
    import hashlib

    out = {}
    for part, paths in CODE_PARTS.items():
        h = hashlib.sha256()
        for f in _files(paths):
            h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        out[part] = h.hexdigest()[:10]
    return out


def stale_parts(recorded: dict | None, now: dict[str, str]) -> list[str]:
    """The code parts whose fingerprint differs between a run's record and `now` (every part for a run that
    recorded none: it predates fingerprints)."""
    recorded = recorded or {}
    return [p for p in now if recorded.get(p) != now[p]]


_AT_START: dict[str, object] = {}


def at_start() -> dict[str, object]:
    """{"commit", "code"} of the code this process runs: read once, when it first trains (the trainer calls this
    before building anything), so a process that trains many cells records the code it loaded, not the files edited
    on disk since (a long table run beside development)."""
    if not _AT_START:
        _AT_START.update(commit=git_commit(), code=code_fingerprint())
    return dict(_AT_START)
