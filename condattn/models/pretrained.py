"""Weights of an earlier run for a new model: GLUE fine-tuning from a pretraining run, a detection backbone from an
ImageNet run. A run is named by its directory, by a file inside it, or by its run name under `runs_root/<scale>/`."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..runs import RunRecord, resolve_run_dir


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
    return {_unwrapped(k): v for k, v in state.items()}


def _unwrapped(key: str) -> str:
    """A parameter name without the wrappers' prefixes (DDP's `module.`, torch.compile's `_orig_mod.`)."""
    for prefix in ("module.", "_orig_mod."):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


def weights_file(init_from: str, runs_root: str | os.PathLike[str] = "runs") -> Path:
    """The file `init_from` names: a weights file as is; for a run (dir or name), the model file of its latest
    checkpoint (checkpoints/step_N/model.safetensors: its final weights), else its best_model.pt. A run must have
    finished: to start from an unfinished run's weights, name one of its checkpoint files."""
    p = Path(init_from)
    if p.is_file():
        return p
    run = resolve_run_dir(init_from, runs_root)
    record = RunRecord(run)
    status = record.status
    if status != "finished":
        raise FileNotFoundError(f"the run {run} has not finished (summary: {status}); finish it first (rerun its "
                                "command: it resumes), or name one of its checkpoint files "
                                "(checkpoints/step_N/model.safetensors) to start from intermediate weights")
    if (f := record.final_weights()) is not None:
        return f
    raise FileNotFoundError(f"the run {run} has no weights (no checkpoints/step_*/model.safetensors and no "
                            "best_model.pt); point init_from at another run or a weights file.")


def load_state(init_from: str, runs_root: str | os.PathLike[str] = "runs") -> tuple[dict[str, torch.Tensor], str]:
    """(state_dict, the file it came from) for `init_from` (see weights_file)."""
    f = weights_file(init_from, runs_root)
    return _read(f), str(f)
