"""Weights of an earlier run for a new model: GLUE fine-tuning from a pretraining run, a detection backbone from an
ImageNet run. A run is named by its directory, by a file inside it, or by its run name under `runs_root/<scale>/`."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def resolve_run_dir(init_from: str, runs_root: str | os.PathLike[str]) -> Path:
    """The run dir of `init_from`: a run dir, a file inside one (or inside its checkpoints/step_N/), or a run name
    found exactly once under runs_root/*/."""
    p = Path(init_from)
    if p.is_file():
        return p.parent.parent.parent if p.parent.name.startswith("step_") else p.parent
    if p.is_dir():
        return p
    found = sorted(Path(runs_root).glob(f"*/{init_from}"))
    if len(found) == 1:
        return found[0]
    why = f"several runs match: {', '.join(map(str, found))}" if found else \
        f"it is no file or run dir, and {runs_root}/*/{init_from} does not exist"
    raise FileNotFoundError(f"{init_from!r}: {why}. Give the earlier run's directory (runs/<scale>/<run name>), a "
                            "unique run name (finish that run first), or a weights file.")


def _read(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt / truncated / not a weights file
        raise ValueError(f"cannot read weights from {path}: {type(e).__name__}: {e}. The file is corrupt or not a "
                         "state_dict; point init_from at another run or checkpoint.") from e
    for key in ("model", "state_dict", "model_state"):  # official XCiT / DeiT files wrap the state_dict
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state_dict (parameter names to tensors)")
    return state


def load_state(init_from: str, runs_root: str | os.PathLike[str] = "runs") -> tuple[dict[str, torch.Tensor], str]:
    """(state_dict, where it came from). A weights file is read as is; a run gives its final weights: the model file
    of its latest checkpoint (checkpoints/step_N/model.safetensors), else its best_model.pt."""
    from ..engine.checkpoint import latest_checkpoint

    p = Path(init_from)
    if p.is_file():
        return _read(p), str(p)
    run = resolve_run_dir(init_from, runs_root)
    ckpt = latest_checkpoint(run)
    for f in ([ckpt / "model.safetensors"] if ckpt else []) + [run / "best_model.pt"]:
        if f.is_file():
            return _read(f), str(f)
    raise FileNotFoundError(f"the run {run} has no weights yet (no checkpoints/step_*/model.safetensors and no "
                            "best_model.pt): did it start? Finish it first, or point init_from at another run.")
