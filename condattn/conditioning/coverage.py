"""Which models SCA covers: one timm model per model module and the transformers types of issue 27, each patched and
checked (patched == attention layers, output changed, remove_conditioning restores it, state_dict keys unchanged).

Used by tests/test_coverage.py and scripts/coverage_table.py (which writes docs/coverage.md). Models are built with
random weights, offline: timm's smallest model of each module (by parameter count, counted on the meta device) and
transformers models from tiny configs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from .sites import _covers, attention_layers, find_attention, find_tokens, why_unmatched

MAX_PARAMS = 40e6  # timm models above this are checked on the meta device only (counts, keys; no output)


@dataclass
class Row:
    library: str
    family: str  # timm model module, or transformers model type
    model: str
    attention: int  # attention layers (sites.attention_layers)
    patched: int  # spectral entries
    tokens: bool  # a token site exists (CET)
    output: str  # "changed+restored" | "meta only" | what failed
    why: str = ""  # the first unmatched class and why, or the error

    @property
    def full(self) -> bool:
        return self.attention > 0 and self.patched == self.attention and self.output in ("changed+restored",
                                                                                         "meta only")


def check(model: nn.Module, inputs: dict | None, run=None) -> tuple[int, int, bool, str, str]:
    """(attention layers, patched, token site, output verdict, why) of SCA on `model` (inputs None: counts only)."""
    import condattn

    sites = find_attention(model)
    named = attention_layers(model)  # + matched sites whose class name does not say attention (XCiT's XCA, CoaT)
    layers = named + [(s.name, s.module) for s in sites if not any(_covers(s.name, n) for n, _ in named)]
    tokens = find_tokens(model) is not None
    if not layers and not sites:
        return 0, 0, tokens, "-", "no attention layer"
    keys = list(model.state_dict())
    run = run or (lambda m, x: m(**x))
    ref = None
    if inputs is not None:
        with torch.no_grad():
            ref = _first(run(model, inputs))
    try:
        rep = condattn.apply_conditioning(model, "spectral", lam=2.0, partial=True)
    except ValueError as e:  # the note: the first unmatched class and why (the line after the summary)
        lines = str(e).split("\n")
        return len(layers), 0, tokens, "refused", lines[1].strip() if len(lines) > 1 else lines[0]
    why = ""
    missing = [m for _, m in _unmatched(model)]
    if missing:
        why = f"{type(missing[0]).__name__}: {why_unmatched(missing[0])}"
    verdict = "meta only"
    if list(model.state_dict()) != keys:
        verdict = "state_dict keys changed"
    elif inputs is not None:
        with torch.no_grad():
            out = _first(run(model, inputs))
        condattn.remove_conditioning(model)
        with torch.no_grad():
            back = _first(run(model, inputs))
        verdict = "output unchanged" if torch.equal(out, ref) else \
            "changed+restored" if torch.equal(back, ref) else "not restored"
    else:
        condattn.remove_conditioning(model)
    return len(layers), rep.layers("spectral"), tokens, verdict, why


def _unmatched(model):
    from .sites import unmatched_attention

    return unmatched_attention(model, find_attention(model))


def _first(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "values"):
        out = [v for v in out.values() if isinstance(v, torch.Tensor)]
    if isinstance(out, (list, tuple)):
        return torch.cat([_first(o).flatten() for o in out if o is not None])
    raise TypeError(f"cannot read a tensor from {type(out).__name__}")


def smallest_timm_model(mod: str) -> tuple[str, nn.Module] | None:
    """timm's smallest model of model module `mod`, of its first 12 names, by parameter count on the meta device:
    (name, the meta model); None when none of them builds on meta."""
    import timm

    best = None
    for name in timm.list_models(module=mod)[:12]:
        meta = _meta_model(name)
        if meta is None:
            continue
        n = sum(p.numel() for p in meta.parameters())
        if best is None or n < best[0]:
            best = (n, name, meta)
    return None if best is None else best[1:]


def _meta_model(name: str) -> nn.Module | None:
    import timm

    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            return timm.create_model(name, pretrained=False)
    except Exception:  # noqa: BLE001 (a model that cannot be built on meta is not a candidate)
        return None


def timm_rows(modules: list[str] | None = None, forward: bool = False,
              chosen: dict[str, str | None] | None = None) -> list[Row]:
    """One row per timm model module that has attention: its smallest model (smallest_timm_model), counted on the
    meta device; with `forward`, models up to MAX_PARAMS are also built on CPU and run (output changed, restored).
    `chosen` maps a module to the model that smallest_timm_model picked before (None: no model built), so that the
    candidates are not built again (tests/fixtures/timm_smallest.json, written by scripts/coverage_table.py)."""
    import timm

    rows = []
    for mod in modules or sorted(timm.list_modules()):
        if chosen is not None and mod in chosen:
            name = chosen[mod]
            pick = None if name is None else (name, _meta_model(name))
        else:
            pick = smallest_timm_model(mod)
        if pick is None or pick[1] is None:
            continue
        name, meta = pick
        if not attention_layers(meta) and not find_attention(meta):
            continue
        n = sum(p.numel() for p in meta.parameters())
        if forward and n <= MAX_PARAMS:
            torch.manual_seed(0)
            model = timm.create_model(name, pretrained=False).eval()
            size = model.pretrained_cfg.get("input_size", (3, 224, 224))
            x = {"x": torch.randn(1, *size, generator=torch.Generator().manual_seed(0))}
            res = check(model, x, lambda m, i: m(i["x"]))
        else:
            res = check(meta, None)
        rows.append(Row("timm", mod, name, *res))
    return rows


def _hf(cfg_cls: str, model_cls: str, **cfg):
    import transformers

    def build():
        torch.manual_seed(0)
        config = getattr(transformers, cfg_cls)(**cfg)
        return getattr(transformers, model_cls)(config).eval()

    return build


def _ids(vocab: int = 64, n: int = 12) -> dict:
    return {"input_ids": torch.randint(1, vocab, (2, n), generator=torch.Generator().manual_seed(0))}


def _pixels(size: int = 32, key: str = "pixel_values") -> dict:
    return {key: torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))}


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
TEXT = dict(vocab_size=64, max_position_embeddings=64, **SMALL)
DEC = dict(TEXT, num_key_value_heads=2)


def _whisper_inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"input_features": torch.randn(2, 8, 32, generator=g),
            "decoder_input_ids": torch.ones(2, 3, dtype=torch.long)}


def transformers_cases() -> dict:
    """model type -> (build, inputs): the types issue 27 lists, at tiny random configs."""
    vis = dict(image_size=32, patch_size=8, **SMALL)
    return {
        "bert": (_hf("BertConfig", "BertModel", **TEXT), _ids),
        "roberta": (_hf("RobertaConfig", "RobertaModel", **TEXT), _ids),
        "xlm-roberta": (_hf("XLMRobertaConfig", "XLMRobertaModel", **TEXT), _ids),
        "distilbert": (_hf("DistilBertConfig", "DistilBertModel", vocab_size=64, dim=32, n_layers=2, n_heads=4,
                           hidden_dim=64, max_position_embeddings=64), _ids),
        "albert": (_hf("AlbertConfig", "AlbertModel", embedding_size=16, **TEXT), _ids),
        "electra": (_hf("ElectraConfig", "ElectraModel", embedding_size=16, **TEXT), _ids),
        "deberta-v2": (_hf("DebertaV2Config", "DebertaV2Model", **TEXT), _ids),
        "modernbert": (_hf("ModernBertConfig", "ModernBertModel", global_attn_every_n_layers=1, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, **TEXT), _ids),
        "gpt2": (_hf("GPT2Config", "GPT2Model", vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4), _ids),
        "gpt_neox": (_hf("GPTNeoXConfig", "GPTNeoXModel", **TEXT), _ids),
        "llama": (_hf("LlamaConfig", "LlamaModel", **DEC), _ids),
        "mistral": (_hf("MistralConfig", "MistralModel", **DEC), _ids),
        "mixtral": (_hf("MixtralConfig", "MixtralModel", num_local_experts=2, **DEC), _ids),
        "qwen2": (_hf("Qwen2Config", "Qwen2Model", **DEC), _ids),
        "qwen3": (_hf("Qwen3Config", "Qwen3Model", head_dim=8, **DEC), _ids),
        "gemma": (_hf("GemmaConfig", "GemmaModel", head_dim=8, **DEC), _ids),
        "gemma2": (_hf("Gemma2Config", "Gemma2Model", head_dim=8, **DEC), _ids),
        "phi": (_hf("PhiConfig", "PhiModel", **DEC), _ids),
        "phi3": (_hf("Phi3Config", "Phi3Model", pad_token_id=0, **DEC), _ids),
        "opt": (_hf("OPTConfig", "OPTModel", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64), _ids),
        "bloom": (_hf("BloomConfig", "BloomModel", vocab_size=64, hidden_size=32, n_layer=2, n_head=4), _ids),
        "falcon": (_hf("FalconConfig", "FalconModel", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4), _ids),
        "t5": (_hf("T5Config", "T5EncoderModel", vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                   num_heads=4), _ids),
        "bart": (_hf("BartConfig", "BartModel", vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=64), _ids),
        "vit": (_hf("ViTConfig", "ViTModel", **vis), _pixels),
        "deit": (_hf("DeiTConfig", "DeiTModel", **vis), _pixels),
        "swin": (_hf("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                     num_heads=[2, 4], window_size=4), _pixels),
        "dinov2": (_hf("Dinov2Config", "Dinov2Model", **vis), _pixels),
        "clip_vision": (_hf("CLIPVisionConfig", "CLIPVisionModel", **vis), _pixels),
        "clip_text": (_hf("CLIPTextConfig", "CLIPTextModel", **TEXT), _ids),
        "siglip_vision": (_hf("SiglipVisionConfig", "SiglipVisionModel", **vis), _pixels),
        "whisper_encoder": (_hf("WhisperConfig", "WhisperModel", vocab_size=64, d_model=32, encoder_layers=2,
                                decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                            _whisper_inputs),
        "nystromformer": (_hf("NystromformerConfig", "NystromformerModel", num_landmarks=4, segment_means_seq_len=16,
                              **TEXT), lambda: _ids(n=16)),
        "detr": (_hf("DetrConfig", "DetrModel", use_timm_backbone=False, use_pretrained_backbone=False,
                     backbone_config={"model_type": "resnet", "depths": [1, 1, 1, 1], "hidden_sizes": [8, 8, 8, 8],
                                      "embedding_size": 8, "out_features": ["stage4"]},
                     d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5),
                 lambda: _pixels(64)),
    }


def transformers_rows(types: list[str] | None = None) -> list[Row]:
    rows = []
    for name, (build, inputs) in transformers_cases().items():
        if types and name not in types:
            continue
        model = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = build()
                res = check(model, inputs())
        except Exception as e:  # noqa: BLE001 (recorded in the table)
            res = (0, 0, False, "error", f"{type(e).__name__}: {str(e)[:120]}")
        rows.append(Row("transformers", name, type(model).__name__ if model is not None else "?", *res))
    return rows


def markdown(rows: list[Row]) -> str:
    out = ["| library | family | model | attention layers | SCA patched | CET token site | output | note |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.library} | {r.family} | `{r.model}` | {r.attention} | {r.patched} | "
                   f"{'yes' if r.tokens else 'no'} | {r.output} | {r.why.replace('|', '/')} |")
    return "\n".join(out)


RIVALS = ("gated_attention", "softcap", "attention_sink", "qk_clip")


def _reach(model: nn.Module, inputs: dict, method: str) -> str:
    """'k/n' attention layers a method patched (the forward run, finite), or its one-line refusal."""
    from .api import apply_conditioning, remove_conditioning

    try:
        rep = apply_conditioning(model, method)
    except ValueError as e:
        return "refused: " + str(e).splitlines()[0].partition(": ")[2].replace("|", "/")
    with torch.no_grad():
        ok = bool(torch.isfinite(_first(model(**inputs))).all())
    remove_conditioning(model)
    n = rep.layers(method)
    return f"{n}/{n + len({e.module for e in rep.skipped})}" + ("" if ok else " (non-finite output)")


def rival_rows(types: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """(transformers type, each RIVALS method's reach) over the tiny configs of transformers_cases."""
    rows = []
    for name, (build, inputs) in transformers_cases().items():
        if types and name not in types:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model, x = build().eval(), inputs()
                rows.append((name, [_reach(model, x, m) for m in RIVALS]))
            except Exception as e:  # noqa: BLE001 (recorded in the table)
                rows.append((name, [f"error: {type(e).__name__}"] * len(RIVALS)))
    return rows
