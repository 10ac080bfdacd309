"""A conditioned model saves and loads whole: the conditioning is recorded in the model's own config, and
`from_pretrained` (api.py) re-applies it before the saved weights load.

QK-norm and σReparam add parameters and buffers (their norms, γ, the power-iteration vector): transformers'
`save_pretrained` writes them, but `from_pretrained` builds the plain model and drops them as unexpected keys. So
`apply_conditioning` records the method and its options on a transformers model's config (`condattn_conditioning`,
written by `save_pretrained` into config.json), and

    model = condattn.conditioning.from_pretrained(transformers.LlamaForCausalLM, path)

loads the model as transformers does, re-applies the recorded conditioning, then loads the saved weights again,
the added keys included (every one of them must be in the checkpoint). An init-only method (conditioned_init,
mimetic_init, spectral with mode=init) is not re-applied: its effect is in the saved weights; a composite re-applies
its parts that attach (CET beside SCA's mode=init). A model saved without conditioning loads as transformers loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_KEY = "condattn_conditioning"


def _config(model: nn.Module):
    cfg = getattr(model, "config", None)
    return cfg if cfg is not None and callable(getattr(cfg, "to_json_string", None)) else None


def record(model: nn.Module, method: str, values: dict[str, Any]) -> None:
    """Write the conditioning into a transformers model's config (nothing for other models)."""
    cfg = _config(model)
    if cfg is not None and method != "none":
        setattr(cfg, CONFIG_KEY, json.loads(json.dumps({"method": method, **values}, default=list)))


def forget(model: nn.Module) -> None:
    cfg = _config(model)
    if cfg is not None and hasattr(cfg, CONFIG_KEY):
        delattr(cfg, CONFIG_KEY)


def saved_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor saved under `path` (safetensors, sharded or not, else pytorch_model.bin)."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for f in files for k, v in load_file(str(path / f)).items()}
    if (path / "model.safetensors").exists():
        return load_file(str(path / "model.safetensors"))
    return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
