"""Checkpoints in the run directory: `checkpoints/step_NNNNNNN/` written by accelerate's `save_state`
into a temporary directory and renamed into place, so a listed checkpoint is always complete."""

from __future__ import annotations

import shutil
from pathlib import Path

from accelerate import Accelerator

from ..runs import CHECKPOINT_PREFIX as PREFIX
from ..runs import list_checkpoints


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


def checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor shapes of the model saved in a checkpoint (read from the safetensors header, no weights
    loaded); None when it holds no readable model file."""
    from safetensors import safe_open

    f = Path(path) / "model.safetensors"
    if not f.is_file():
        return None
    try:
        with safe_open(str(f), framework="pt") as sf:
            return {k: tuple(sf.get_slice(k).get_shape()) for k in sf.keys()}
    except Exception:
        return None  # corrupt: load_checkpoint reports it


def architecture_mismatch(path: str | Path, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Why the model saved at `path` cannot be this model (`shapes`: name -> shape of its state_dict), or None.
    Names the first differing tensors, so "resumed into the wrong run dir" reads as such and not as a
    corrupt file."""
    saved = checkpoint_shapes(path)
    if saved is None:
        return None
    differ = [k for k in saved if k in shapes and tuple(saved[k]) != tuple(shapes[k])]
    missing = [k for k in shapes if k not in saved]
    extra = [k for k in saved if k not in shapes]
    # safetensors drops tied duplicates (e.g. a decoder tied to the embedding): a name missing there but
    # whose shape equals a saved tensor's is not a mismatch on its own
    if not differ and not extra and all(any(shapes[k] == v for v in saved.values()) for k in missing):
        return None
    parts = [f"{k} is {list(saved[k])} there and {list(shapes[k])} here" for k in differ[:3]]
    parts += [f"{k} is missing there" for k in missing[:2]] + [f"{k} is not in this model" for k in extra[:2]]
    return (
        f"checkpoint {path} was written by a different architecture: {'; '.join(parts)} "
        f"({len(differ)} tensors differ in shape, {len(missing)} missing, {len(extra)} unexpected). "
        "This run directory belongs to another configuration: choose another run.name, or resume=never to "
        "start this one over."
    )


class CheckpointUnreadable(RuntimeError):
    """A checkpoint that accelerate cannot load (truncated, corrupt on disk)."""


def load_checkpoint(accelerator: Accelerator, path: str | Path) -> None:
    try:
        accelerator.load_state(str(path))
    except Exception as e:  # a truncated or foreign checkpoint: say which, and how to start over
        raise CheckpointUnreadable(
            f"cannot resume from checkpoint {path}: {type(e).__name__}: {e}. It is corrupt or from a different "
            "model/config; delete it or start over with resume=never."
        ) from e
