"""The model zoo: `build_model(cfg.model)` over timm / transformers models, by `cfg.builder`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

MODEL_BUILDERS: dict[str, Callable[..., nn.Module]] = {}


def model_builder(name: str):
    def deco(fn):
        MODEL_BUILDERS[name] = fn
        return fn

    return deco


# Keys of a model config that describe the entry rather than being constructor arguments.
META_KEYS = {"name", "builder", "attention_layers"}


def build_model(cfg: Any) -> nn.Module:
    """Build the model a `configs/model/*.yaml` describes (random init unless it asks for weights)."""
    from omegaconf import OmegaConf

    opts = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    builder = opts.get("builder")
    if builder not in MODEL_BUILDERS:
        raise ValueError(
            f"unknown model builder {builder!r} (model={opts.get('name')!r}); known: {', '.join(MODEL_BUILDERS)}"
        )
    return MODEL_BUILDERS[builder](**{k: v for k, v in opts.items() if k not in META_KEYS})


@model_builder("nystromformer_classifier")
def _nystromformer(**kw) -> nn.Module:
    from .lra import NystromformerClassifier

    return NystromformerClassifier(**kw)


@model_builder("timm")
def _timm(model_name: str, pretrained: bool = False, **kw) -> nn.Module:
    import timm

    if model_name not in timm.list_models():
        raise ValueError(f"unknown timm model {model_name!r}; see timm.list_models() for valid names")
    if pretrained:
        from huggingface_hub.utils import HfHubHTTPError

        try:
            return timm.create_model(model_name, pretrained=True, **kw)
        except (OSError, HfHubHTTPError) as e:
            raise RuntimeError(
                f"could not load pretrained weights for {model_name!r} (offline?): {e}. Put them in the "
                "Hugging Face cache, or set model.pretrained=false for random init."
            ) from e
    return timm.create_model(model_name, pretrained=False, **kw)
