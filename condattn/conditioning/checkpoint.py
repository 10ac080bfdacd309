"""A conditioned model saves and loads whole: the conditioning is recorded in the model's own config, and
`from_pretrained` (api.py) re-applies it before the saved weights load.

QK-norm and σReparam add parameters and buffers (their norms, γ, the power-iteration vector): transformers'
`save_pretrained` writes them, but `from_pretrained` builds the plain model and drops them as unexpected keys. So
`apply_conditioning` records the method and its options on a transformers model's config (`condattn_conditioning`,
written by `save_pretrained` into config.json), and

    model = condattn.conditioning.from_pretrained(transformers.LlamaForCausalLM, path)

loads the model as transformers does, re-applies the recorded conditioning, then loads the saved weights again,
the added keys included (every one of them must be in the checkpoint). A plain `transformers` load of such a
checkpoint drops the added keys; where condattn is imported, its report of unexpected keys then starts with one line
naming the method and this loader (`PlainLoadWarning`, a filter on transformers' loading loggers).

An init-only method (conditioned_init, mimetic_init, spectral with mode=init) is not re-applied: its effect is in the
saved weights; a composite re-applies its parts that attach (CET beside SCA's mode=init). A model saved without
conditioning loads as transformers loads it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_KEY = "condattn_conditioning"
# transformers' report of checkpoint keys the model did not take: 5.x "<Class> LOAD REPORT from: <path>", 4.x "Some
# weights of the model checkpoint at <path> were not used when initializing <Class>"
_UNTAKEN = re.compile(r"LOAD REPORT\S* from: (?P<a>\S+)|checkpoint at (?P<b>\S+) were not used")
_LOADING_LOGGERS = ("transformers.modeling_utils", "transformers.utils.loading_report")
LOADING_ITSELF = contextvars.ContextVar("condattn_loading", default=False)  # set by condattn's own from_pretrained


class PlainLoadWarning(logging.Filter):
    """Prepends one line to transformers' unexpected-keys report when the checkpoint was saved from a conditioned
    model: which method, and that condattn.conditioning.from_pretrained loads it whole."""

    def filter(self, record: logging.LogRecord) -> bool:
        if LOADING_ITSELF.get() or str(record.msg).startswith("condattn:"):
            return True
        try:
            text = record.getMessage()
            found = _UNTAKEN.search(text)
            node = found and json.loads((Path(found["a"] or found["b"]) / "config.json").read_text()).get(CONFIG_KEY)
        except (OSError, ValueError, TypeError):
            return True
        if node:
            record.msg, record.args = (f"condattn: this checkpoint was saved from a model conditioned with "
                                       f"{node.get('method')!r}, and a plain from_pretrained drops the weights it "
                                       "added; load it with condattn.conditioning.from_pretrained(ModelClass, path)\n"
                                       + text), None
        return True


for _name in _LOADING_LOGGERS:
    if not any(isinstance(f, PlainLoadWarning) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(PlainLoadWarning())


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
