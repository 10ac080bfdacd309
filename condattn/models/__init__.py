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


def model_problems(cfg: Any) -> list[str]:
    """What a model config names that its library does not have (a timm architecture), one line each; the preflight
    reports them before any job starts."""
    from .timm_models import unknown_timm_model

    if cfg.get("builder") == "timm":
        return [why] if (why := unknown_timm_model(cfg.get("model_name"))) else []
    if cfg.get("backbone") and str(cfg.get("builder", "")).startswith("maskrcnn"):
        return [why] if (why := unknown_timm_model(cfg.get("backbone"), "model.backbone")) else []
    return []


@model_builder("nystromformer_classifier")
def _nystromformer(**kw) -> nn.Module:
    from .lra import NystromformerClassifier

    return NystromformerClassifier(**kw)


@model_builder("nystromformer_dual")
def _nystromformer_dual(**kw) -> nn.Module:
    from .lra import NystromformerDualEncoder

    return NystromformerDualEncoder(**kw)


@model_builder("timm")
def _timm(model_name: str, pretrained: bool = False, fused_attn: int | None = None, **kw) -> nn.Module:
    """`timm.create_model` with the config's fused-attention mode (models/timm_models.py)."""
    from .timm_models import create_timm

    return create_timm(model_name, pretrained=pretrained, fused_attn=fused_attn, **kw)


@model_builder("gpt2")
def _gpt2(
    *,
    vocab_size: int,
    n_positions: int = 1024,
    n_embd: int = 768,
    n_layer: int = 12,
    n_head: int = 12,
    n_inner: int | None = None,
    dropout: float = 0.1,
    activation_function: str = "gelu_new",
    attn_implementation: str = "sdpa",
    seq_len: int | None = None,
    pretrained: bool | str = False,
) -> nn.Module:
    """transformers `GPT2LMHeadModel` (tied input/output embeddings), random init from a `GPT2Config`.

    `dropout` sets GPT-2's three dropouts (residual, embedding, attention). `seq_len` (the data's block length) is
    only checked against `n_positions`. `pretrained`: false (random init), true (the hub's `gpt2`) or a hub id / local
    directory; weights are read with local_files_only (from the Hugging Face cache or that directory), so an offline
    machine without them stops at once with a message instead of trying to download. The checkpoint's architecture
    wins over n_embd/n_layer/...; its vocabulary must equal `vocab_size` (use its tokenizer: data.tokenizer=DIR)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    if seq_len is not None and int(seq_len) > int(n_positions):
        raise ValueError(f"data.seq_len={seq_len} exceeds the model's n_positions={n_positions} position embeddings")
    if pretrained:
        name = "gpt2" if pretrained is True else str(pretrained)
        try:
            model = GPT2LMHeadModel.from_pretrained(name, local_files_only=True,
                                                    attn_implementation=attn_implementation)
        except OSError as e:
            raise RuntimeError(
                f"could not load pretrained GPT-2 weights {name!r} without downloading (offline): "
                f"{str(e).rstrip('.')}. Put them in the Hugging Face cache (`huggingface-cli download gpt2` on a "
                "machine with access) or give a local directory as model.pretrained=DIR; model.pretrained=false "
                "trains from random init."
            ) from e
        if model.config.vocab_size != int(vocab_size):
            raise ValueError(f"pretrained {name!r} has a vocabulary of {model.config.vocab_size}, the data "
                             f"{vocab_size}: use its tokenizer (data.tokenizer=DIR, data.vocab_size="
                             f"{model.config.vocab_size})")
        model.config.use_cache = False
        return model
    config = GPT2Config(
        vocab_size=int(vocab_size), n_positions=int(n_positions), n_embd=int(n_embd), n_layer=int(n_layer),
        n_head=int(n_head), n_inner=n_inner, activation_function=activation_function, resid_pdrop=float(dropout),
        embd_pdrop=float(dropout), attn_pdrop=float(dropout), use_cache=False,  # training only: no KV cache
        bos_token_id=None, eos_token_id=None,  # the data's tokenizer owns its special tokens (no generation here)
        attn_implementation=attn_implementation,
    )
    return GPT2LMHeadModel(config)


@model_builder("crammed_bert")
def _crammed_bert(**kw) -> nn.Module:
    """Our crammed-BERT module (cramming's `crammed-bert` architecture, condattn/models/crammed_bert.py) with its
    tied, sparse MLM decoder; random init (cramming's normal(0, 0.02))."""
    from .crammed_bert import CrammedBertForMLM

    return CrammedBertForMLM(**kw)


@model_builder("crammed_bert_classifier")
def _crammed_bert_classifier(*, init_from: str | None = None, runs_root: str = "runs", **kw) -> nn.Module:
    """Our crammed BERT with cramming's classification head (GLUE fine-tuning), its encoder loaded from a pretraining
    run: `init_from` = the run dir, a run name under runs_root/*/, or a weights file (.safetensors / .pt). The
    run's final weights are read (its latest checkpoint, as cramming's `checkpoint: latest`). None = random init
    (a from-scratch control)."""
    from .crammed_bert import CrammedBertForSequenceClassification

    model = CrammedBertForSequenceClassification(**kw)
    if init_from:
        from .pretrained import load_state

        try:
            state, source = load_state(str(init_from), runs_root)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"model.init_from={e}") from e
        model.load_encoder(state, source)
    return model


@model_builder("maskrcnn_xcit")
def _maskrcnn_xcit(**kw) -> nn.Module:
    """torchvision Mask R-CNN over a timm XCiT backbone with XCiT's detection adapter and an FPN (table 2;
    condattn/models/detection.py)."""
    from .detection import build_maskrcnn_xcit

    return build_maskrcnn_xcit(**kw)


@model_builder("detr")
def _detr(**kw) -> nn.Module:
    """transformers DetrForObjectDetection with a timm backbone (table 7; condattn/models/detection.py)."""
    from .detection import build_detr

    return build_detr(**kw)
