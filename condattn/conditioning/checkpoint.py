"""A conditioned model saves and loads whole: the conditioning is recorded in the model's own config, and
`from_pretrained` (api.py) re-applies it before the saved weights load.

`apply_conditioning` records the method and its options on a transformers model's config (`condattn_conditioning`,
written by `save_pretrained` into config.json), and

    model = condattn.conditioning.from_pretrained(transformers.LlamaForCausalLM, path)

loads the model as transformers does, re-applies the recorded conditioning, then loads the saved weights again, the
keys the method added (QK-norm's norms, σReparam's γ and v) included: every one of them must be in the checkpoint.
The checkpoint may hold the model with or without its head (BertModel ↔ BertForSequenceClassification): keys are
matched through the model's `base_model_prefix`, as transformers matches them.

A plain transformers `from_pretrained` builds the model without the method: SCA, CET, NS-attention and the other
methods that attach are dropped (the weights load, the outputs change), and QK-norm's and σReparam's added weights
with them. Where condattn is imported, such a load ends with one `PlainLoadWarning` naming the method and this
loader (`PreTrainedModel.from_pretrained` is wrapped when transformers' modeling_utils is imported; `watch`). An
init-only method (conditioned_init, mimetic_init, spectral with mode=init) is kept: its effect is in the saved weights,
and the line says so. A composite is read part by part (CET dropped beside SCA's mode=init kept).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import json
import logging
import re
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .spec import method_spec

CONFIG_KEY = "condattn_conditioning"
# transformers' report of checkpoint keys the model did not take: 5.x "<Class> LOAD REPORT from: <path>", 4.x "Some
# weights of the model checkpoint at <path> were not used when initializing <Class>"
_UNTAKEN = re.compile(r"LOAD REPORT\S* from: (?P<a>\S+)|checkpoint at (?P<b>\S+) were not used")
_LOADING_LOGGERS = ("transformers.modeling_utils", "transformers.utils.loading_report")
LOADING_ITSELF = contextvars.ContextVar("condattn_loading", default=False)  # set by condattn's own from_pretrained
HELD = contextvars.ContextVar("condattn_held_reports", default=None)  # transformers' reports held back meanwhile


class PlainLoadWarning(UserWarning):
    """A plain transformers `from_pretrained` of a checkpoint saved from a conditioned model."""


def plain_load_line(node: Mapping[str, Any], model_class: str = "ModelClass") -> str:
    """The one line for a plain load of a checkpoint whose config records `node` (the method and its options):
    which method is dropped (MethodSpec: what attaches, what adds keys) or kept in the weights (init-only)."""
    method, values = node.get("method"), {k: v for k, v in node.items() if k != "method"}
    loader = f"condattn.conditioning.from_pretrained({model_class}, path)"
    head = "condattn: this checkpoint was saved from a model conditioned with"
    try:
        spec = method_spec(str(method))
    except ValueError:
        return f"{head} {method!r}, a method this condattn does not register: upgrade condattn, then use {loader}"
    parts = [method_spec(p) for p in spec.parts or (spec.name,)]
    kept = [once for p in parts if (once := p.once(values))]
    dropped = [p for p in parts if not p.once(values)]
    if not dropped:
        return (f"{head} {spec.label or spec.name}, which set the weights once: its effect is kept in the loaded "
                f"weights and nothing is lost ({loader} loads it the same way)")
    names = " and ".join(p.label or p.name for p in dropped)
    if all(p.plain_load for p in dropped):  # (qk_clip: nothing in the outputs, only what training would have done)
        return (f"{head} {names}; a plain from_pretrained builds the model without it: "
                f"{'; '.join(p.plain_load for p in dropped)}; load it with {loader}")
    what = "its added weights are dropped and " if any(p.adds_keys for p in dropped) else "the weights load, but "
    also = f" ({'; '.join(kept)} is kept in the weights)" if kept else ""
    return (f"{head} {names}; a plain from_pretrained builds the model without it: {what}the outputs differ from "
            f"the conditioned model's{also}; load it with {loader}")


def warn_if_dropped(model: nn.Module) -> None:
    """After a plain load: one PlainLoadWarning when `model`'s config records a conditioning it does not carry."""
    node = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    if isinstance(node, Mapping) and getattr(model, "_condattn", None) is None:
        warnings.warn(plain_load_line(node, type(model).__name__), PlainLoadWarning, stacklevel=3)


def watch(modeling_utils) -> None:
    """Wrap transformers' `PreTrainedModel.from_pretrained` (once): a plain load of a conditioned checkpoint warns."""
    base = modeling_utils.PreTrainedModel
    if getattr(base.from_pretrained, "_condattn_watch", False):
        return
    original = base.from_pretrained.__func__

    @functools.wraps(original)
    def from_pretrained(cls, *args, **kwargs):
        out = original(cls, *args, **kwargs)
        if not LOADING_ITSELF.get():
            warn_if_dropped(out[0] if isinstance(out, tuple) else out)
        return out

    from_pretrained._condattn_watch = True
    base.from_pretrained = classmethod(from_pretrained)


class _WatchOnImport(importlib.abc.MetaPathFinder):
    """Calls `watch` once transformers.modeling_utils is imported (condattn imported first, transformers later)."""

    name = "transformers.modeling_utils"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = next((s for f in sys.meta_path if hasattr(f, "find_spec")
                     and (s := f.find_spec(fullname, path, target)) is not None), None)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                watch(module)

            spec.loader.exec_module = exec_module
        return spec


if _WatchOnImport.name in sys.modules:
    watch(sys.modules[_WatchOnImport.name])
elif not any(isinstance(f, _WatchOnImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _WatchOnImport())


class _HoldOwnReport(logging.Filter):
    """While condattn's own loader runs, transformers' report of untaken checkpoint keys is held back (HELD): the
    loader then loads the keys its method added and reports the rest (api.from_pretrained, `report_untaken`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        held = HELD.get()
        if held is None or not LOADING_ITSELF.get() or not _UNTAKEN.search(str(record.msg)):
            return True
        held.append(record)
        return False


for _name in _LOADING_LOGGERS:
    for _old in [f for f in logging.getLogger(_name).filters if type(f).__name__ in ("PlainLoadWarning",
                                                                                        "_HoldOwnReport")]:
        logging.getLogger(_name).removeFilter(_old)  # (a module reloaded: one filter)
    logging.getLogger(_name).addFilter(_HoldOwnReport())


def report_untaken(held: list[logging.LogRecord], model: nn.Module, info: Mapping[str, Any]) -> None:
    """Log transformers' held reports again from `info` (from_pretrained's output_loading_info, less the keys the
    loader restored): transformers 5 rebuilds its report (missing, unexpected, mismatched keys); a 4.x record of
    unused keys is logged again naming the keys left only, and dropped when none is."""
    left = set(info.get("unexpected_keys", ()))
    for record in held:
        found = _UNTAKEN.search(str(record.msg))
        if found and found["a"]:  # transformers 5: one report of missing, unexpected and mismatched keys
            _report_again(record, model, found["a"], info, left)
        elif left:
            record.msg = _keys_left(str(record.msg), left)
            logging.getLogger(record.name).handle(record)


def _keys_left(msg: str, left: set[str]) -> str:
    """A 4.x report "... were not used when initializing <Class>: ['k', ...]" naming only the keys in `left`."""
    import ast

    found = re.search(r"were not used when initializing \S+: (\[[^\]]*\])", msg)
    if found is None:
        return msg
    try:
        keys = ast.literal_eval(found[1])
    except (ValueError, SyntaxError):
        return msg
    return msg[:found.start(1)] + repr([k for k in keys if k in left]) + msg[found.end(1):]


def _report_again(record: logging.LogRecord, model: nn.Module, path: str, info: Mapping[str, Any],
                  left: set[str]) -> None:
    from dataclasses import fields

    from transformers.utils.loading_report import LoadStateDictInfo, log_state_dict_report

    given = {"missing_keys": set(info.get("missing_keys", ())), "unexpected_keys": left,
             "mismatched_keys": set(info.get("mismatched_keys", ())), "error_msgs": [], "conversion_errors": {}}
    names = {f.name for f in fields(LoadStateDictInfo)}
    report = LoadStateDictInfo(**{k: v for k, v in given.items() if k in names},
                               **{k: set() for k in names - set(given)})
    log_state_dict_report(model, path, False, report, logger=logging.getLogger(record.name))


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


def base_prefix_map(model: nn.Module, keys) -> dict[str, str]:
    """Checkpoint key -> the model's key, as transformers matches a checkpoint with or without the model's head: a
    model with a head (it holds its base model as `base_model_prefix`, e.g. `bert`) loading a base checkpoint gains
    the prefix; a base model loading a checkpoint of a model with a head drops it (and the head's keys)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    keys = list(keys)
    dot = prefix + "."
    if not prefix or not keys:
        return {k: k for k in keys}
    has_prefix = any(k.startswith(dot) for k in keys)
    with_head = hasattr(model, prefix) and isinstance(getattr(model, prefix), nn.Module)
    if with_head and not has_prefix:
        return {k: dot + k for k in keys}
    if not with_head and has_prefix:
        return {k: k[len(dot):] for k in keys if k.startswith(dot)}
    return {k: k for k in keys}
