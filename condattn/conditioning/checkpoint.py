"""A conditioned model saves and loads whole: the conditioning is recorded in the model's own config, and
`from_pretrained` re-applies it before the saved weights load.

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


def _weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor saved under `path` (safetensors, sharded or not, else pytorch_model.bin)."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for f in files for k, v in load_file(str(path / f)).items()}
    if (path / "model.safetensors").exists():
        return load_file(str(path / "model.safetensors"))
    return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)


def from_pretrained(model_class, path: str | Path, **kwargs: Any) -> nn.Module:
    """`model_class.from_pretrained(path, **kwargs)` with its recorded conditioning re-applied and every saved
    weight (the parameters and buffers the method added included) loaded."""
    from .api import apply_conditioning
    from .spec import method_spec

    model = model_class.from_pretrained(str(path), **kwargs)
    node = dict(getattr(model.config, CONFIG_KEY, None) or {})
    if not node:
        return model
    method = node.pop("method")
    parts = [p for p in (method_spec(method).parts or (method,)) if not method_spec(p).once(node)]
    if not parts or parts == ["none"]:
        return model  # init-only: its effect is in the saved weights
    plain = set(model.state_dict())
    apply_conditioning(model, "+".join(parts) if len(parts) > 1 else parts[0],
                       **{k: v for k, v in node.items() if k in _options(parts)})
    record(model, method, node)  # (the config keeps what was saved)
    saved = _weights(Path(path))
    added = set(model.state_dict()) - plain
    lost = sorted(added - set(saved))
    if lost:
        raise ValueError(f"condattn from_pretrained: the checkpoint at {path} lacks {len(lost)} of the keys "
                         f"{method} adds (e.g. {lost[0]}); it was not saved from a model conditioned this way")
    with torch.no_grad():
        state = model.state_dict()
        for k in sorted(set(saved) & set(state)):
            state[k].copy_(saved[k].to(state[k]))
    return model


def _options(parts: list[str]) -> set[str]:
    from .spec import method_spec

    return {k for p in parts for k in method_spec(p).options}
