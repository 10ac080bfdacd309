"""A conditioned model saves and loads whole: the conditioning is recorded in the model's own config, and
`from_pretrained` (api.py) applies it while transformers builds the model, before any weight loads.

`apply_conditioning` records the method and its options on a transformers model's config (`condattn_conditioning`,
written by `save_pretrained` into config.json; the config is first made the model's own, `own_config`), and

    model = condattn.conditioning.from_pretrained(transformers.LlamaForCausalLM, path)

runs transformers' own `from_pretrained`: the model it builds (on the meta device) is conditioned as its config
records at the end of its `post_init` (`watch`), so the weights the method adds (QK-norm's norms, σReparam's γ and v,
the gates, the sinks) are keys of the model transformers then loads. Its key renaming (ViT's `encoder.layer.N.attention.
attention.query` ↔ `layers.N.attention.q_proj`, and the method's keys with them), `dtype`, `ignore_mismatched_sizes`,
shards, a checkpoint with or without the model's head and its missing-key report apply to them as to every weight; no
key is matched here.

A plain transformers `from_pretrained` builds the model without the method: SCA, CET, NS-attention and the other
methods that attach are dropped (the weights load, the outputs change), and the weights a method added with them.
Where condattn is imported, such a load ends with one `PlainLoadWarning` naming the method, what is lost, and this
loader (`PreTrainedModel.from_pretrained` is wrapped when transformers' modeling_utils is imported; `watch`). An
init-only method (conditioned_init, mimetic_init, spectral with mode=init) is kept: its effect is in the saved weights,
and the line says so. A composite is read part by part (CET dropped beside SCA's mode=init kept).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import json
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .spec import method_spec

CONFIG_KEY = "condattn_conditioning"
LOADING_ITSELF = contextvars.ContextVar("condattn_loading", default=False)  # set by condattn's own from_pretrained
BUILDING = contextvars.ContextVar("condattn_building", default=None)  # its Build, while transformers loads


@dataclass
class Build:
    """What condattn's loader asked transformers' `from_pretrained` for: `cls` is the class that from_pretrained
    builds (an Auto class resolves to it), `model` the instance conditioned at the end of its `post_init` (on the
    meta device, before any weight loads), `added` the state_dict keys the method added there."""

    cls: type | None = None
    model: nn.Module | None = None
    added: set[str] = field(default_factory=set)
    node: dict[str, Any] = field(default_factory=dict)  # the conditioning recorded in the checkpoint's config


class PlainLoadWarning(UserWarning):
    """A plain transformers `from_pretrained` of a checkpoint saved from a conditioned model."""


def plain_load_line(node: Mapping[str, Any], model_class: str = "ModelClass", lost: Sequence[str] = ()) -> str:
    """The one line for a plain load of a checkpoint whose config records `node` (the method and its options):
    which method is dropped (MethodSpec: what attaches, what adds keys) or kept in the weights (init-only), and what
    the load lost: `lost`, the checkpoint's weights the method added that the load left unloaded (model names)."""
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
    if lost:
        what = (f"its added weights are dropped (this checkpoint's {len(lost)}, e.g. {sorted(lost)[0]}, are left "
                "unloaded: transformers' unexpected keys), the forward runs without it, and ")
    elif any(p.adds_keys for p in dropped):
        what = "its added weights are dropped, the forward runs without it, and "
    else:
        what = "every weight loads, but the forward runs without it, and "
    also = f" ({'; '.join(kept)} is kept in the weights)" if kept else ""
    return (f"{head} {names}; a plain from_pretrained builds the model without it: {what}the outputs differ from "
            f"the conditioned model's{also}; load it with {loader}")


def _no_conditioner(model: nn.Module, node: dict[str, Any]) -> set[str]:
    raise RuntimeError("condattn.conditioning.api was not imported: import condattn.conditioning")


# How a model is conditioned as its config records (api.condition_as_recorded), handed down by api.py when it is
# imported: this module sits below the API and never imports it (tests/test_architecture.py: no import cycle).
_conditioner: Callable[[nn.Module, dict[str, Any]], set[str]] = _no_conditioner


def set_conditioner(fn: Callable[[nn.Module, dict[str, Any]], set[str]]) -> None:
    global _conditioner
    _conditioner = fn


def _added_keys(model: nn.Module, node: Mapping[str, Any]) -> set[str]:
    """The state_dict keys the conditioning `node` adds to a model of `model`'s class (a copy built on the meta
    device, conditioned as condattn's loader conditions it); empty where that cannot be built."""
    import copy

    import torch

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = type(model)(copy.deepcopy(model.config))
            return _conditioner(probe, dict(node))
    except Exception:  # noqa: BLE001  (the line then says what it can without the count)
        return set()


def warn_if_dropped(model: nn.Module, info: Mapping[str, Any] | None = None) -> None:
    """After a plain load: one PlainLoadWarning when `model`'s config records a conditioning it does not carry;
    `info`, transformers' loading info, gives the weights of the method the load left unloaded."""
    node = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    if not isinstance(node, Mapping) or getattr(model, "_condattn", None) is not None:
        return
    unloaded = set((info or {}).get("unexpected_keys", ()))
    lost = sorted(unloaded & _added_keys(model, node)) if unloaded else []
    warnings.warn(plain_load_line(node, type(model).__name__, lost), PlainLoadWarning, stacklevel=3)


def watch(modeling_utils) -> None:
    """Wrap transformers' `PreTrainedModel.from_pretrained` and `post_init` (once). A plain load of a conditioned
    checkpoint warns. Under condattn's loader (a Build in BUILDING), the model that from_pretrained builds is
    conditioned as its config records at the end of its `post_init`: transformers has built it (on the meta device)
    and not yet loaded a weight, so the method's added weights load with the rest, through transformers' own key
    renaming, dtype, mismatched-size handling, shards and missing-key report."""
    base = modeling_utils.PreTrainedModel
    if getattr(base.from_pretrained, "_condattn_watch", False):
        return
    original = base.from_pretrained.__func__
    original_post_init = base.post_init

    @functools.wraps(original)
    def from_pretrained(cls, *args, **kwargs):
        build = BUILDING.get()
        if build is not None and build.cls is None:
            build.cls = cls
        if LOADING_ITSELF.get():
            return original(cls, *args, **kwargs)
        out = original(cls, *args, **{**kwargs, "output_loading_info": True})
        if not (isinstance(out, tuple) and len(out) == 2):  # (a class whose from_pretrained returns the model only)
            warn_if_dropped(out)
            return out
        warn_if_dropped(*out)
        return out if kwargs.get("output_loading_info") else out[0]

    @functools.wraps(original_post_init)
    def post_init(self, *args, **kwargs):
        out = original_post_init(self, *args, **kwargs)
        build = BUILDING.get()
        if build is not None and build.model is None and type(self) is build.cls:
            build.model = self
            build.node = dict(getattr(getattr(self, "config", None), CONFIG_KEY, None) or {})
            build.added = _conditioner(self, build.node)
        return out

    from_pretrained._condattn_watch = True
    base.from_pretrained = classmethod(from_pretrained)
    base.post_init = post_init


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


def _config(model: nn.Module):
    cfg = getattr(model, "config", None)
    return cfg if cfg is not None and callable(getattr(cfg, "to_json_string", None)) else None


def _is_config(value: Any) -> bool:
    return callable(getattr(value, "to_json_string", None)) and callable(getattr(value, "to_dict", None))


class _SharedConfig:
    """Undo of `own_config` (remove_conditioning, or a failed apply): every module holds the config object it held
    before."""

    def __init__(self, swapped: list[tuple[nn.Module, str, Any]]):
        self.swapped = swapped

    def remove(self) -> None:
        for module, name, old in reversed(self.swapped):
            module.__dict__[name] = old


def own_config(model: nn.Module) -> _SharedConfig | None:
    """Give `model` a config of its own before the method is written into it: a transformers config object may be
    shared with other models (one `BertConfig` building a baseline and a conditioned model), so it is copied, with
    the configs inside it, and every module of `model` that held one of those objects holds the copy (a model's
    layers keep `self.config`). Nothing outside `model` changes. Returns the handle that gives the modules their
    config objects back (None for a model without a transformers config)."""
    import copy

    cfg = _config(model)
    if cfg is None:
        return None
    memo: dict[int, Any] = {}
    copy.deepcopy(cfg, memo)
    swapped = []
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if _is_config(value) and id(value) in memo and memo[id(value)] is not value:
                swapped.append((module, name, value))
                module.__dict__[name] = memo[id(value)]
    return _SharedConfig(swapped)


def record(model: nn.Module, method: str, values: dict[str, Any]) -> None:
    """Write the conditioning into a transformers model's config (nothing for other models)."""
    cfg = _config(model)
    if cfg is not None and method != "none":
        setattr(cfg, CONFIG_KEY, json.loads(json.dumps({"method": method, **values}, default=list)))


def forget(model: nn.Module) -> None:
    cfg = _config(model)
    if cfg is not None and hasattr(cfg, CONFIG_KEY):
        delattr(cfg, CONFIG_KEY)
