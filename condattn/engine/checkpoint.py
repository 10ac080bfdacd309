"""Checkpoints in the run directory: `checkpoints/step_NNNNNNN/` written by accelerate's `save_state`
into a temporary directory and renamed into place, so a listed checkpoint is always complete."""

from __future__ import annotations

import shutil
from pathlib import Path

from accelerate import Accelerator

PREFIX = "step_"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "COMPLETE").exists()]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(accelerator: Accelerator, run_dir: str | Path, step: int, keep: int) -> Path:
    """All ranks call this (accelerate gathers state); rank 0 renames into place and prunes old ones."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".tmp_{PREFIX}{step:07d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "COMPLETE").write_text(str(step))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, path: str | Path) -> None:
    try:
        accelerator.load_state(str(path))
    except Exception as e:  # a truncated or foreign checkpoint: say which, and how to start over
        raise RuntimeError(
            f"cannot resume from checkpoint {path}: {type(e).__name__}: {e}. It is corrupt or from a different "
            "model/config; delete it or start over with resume=never."
        ) from e
