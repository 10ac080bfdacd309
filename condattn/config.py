"""Compose the Hydra config from Python (what `reproduce`, `diagnose` and the tests use)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(os.environ.get("CONDATTN_CONFIG_DIR", Path(__file__).resolve().parent.parent / "configs"))


def _epoch_steps(samples: int, batch: int, epochs: int = 1) -> int:
    """Optimizer steps of `epochs` passes over `samples` at global batch `batch` (the last partial batch dropped, as
    the trainer's sampler does)."""
    steps = int(epochs) * (int(samples) // int(batch))
    if steps < 1:
        raise ValueError(f"{samples} samples make no full global batch of {batch}")
    return steps


def _glue_num_labels(task: str) -> int:
    from .data.glue_tasks import glue_task

    return glue_task(str(task)).num_labels


# `${epoch_steps:SAMPLES,BATCH[,EPOCHS]}` in a config: epochs expressed as optimizer steps (the GLUE task configs);
# `${glue_num_labels:TASK}`: the classifier's outputs for a GLUE task (1 = regression)
OmegaConf.register_new_resolver("epoch_steps", _epoch_steps, replace=True)
OmegaConf.register_new_resolver("glue_num_labels", _glue_num_labels, replace=True)


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> DictConfig:
    """The config `python -m condattn.train OVERRIDES...` would run with. A bad override (unknown group
    option, missing key) raises with Hydra's message naming it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if not CONFIG_DIR.is_dir():
        raise FileNotFoundError(f"config directory {CONFIG_DIR} not found; set CONDATTN_CONFIG_DIR")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))
