"""Compose the Hydra config from Python (what `reproduce`, `diagnose` and the tests use)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

CONFIG_DIR = Path(os.environ.get("CONDATTN_CONFIG_DIR", Path(__file__).resolve().parent.parent / "configs"))


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
