"""timm models as the zoo builds them: `create_timm(name, pretrained, fused_attn, **kw)` (the `timm` builder and the
detection backbones)."""

from __future__ import annotations

from torch import nn

# timm's fused-attention switch, as its TIMM_FUSED_ATTN env var: 0 = eager softmax everywhere, 1 = fused SDPA
# where timm considers it stable (ViT/DeiT `Attention`, DaViT windows, class attention), 2 = also the
# "experimental" ones (Swin `WindowAttention`, XCiT `XCA`).
FUSED_ATTN_MODES = {0: (False, False), 1: (True, False), 2: (True, True)}


def unknown_timm_model(model_name: str, key: str = "model.model_name") -> str | None:
    """One line naming an architecture timm does not know, with the closest names it does; None when it knows it."""
    import difflib

    import timm

    known = timm.list_models()
    if model_name in known:
        return None
    close = difflib.get_close_matches(str(model_name), known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models() for the names it has"
    return f"{key}={model_name!r} is not a timm model (timm {timm.__version__}); {hint}"


def create_timm(model_name: str, pretrained: bool = False, fused_attn: int | None = None, **kw) -> nn.Module:
    """`timm.create_model(model_name, **kw)`. `fused_attn` (0/1/2, see FUSED_ATTN_MODES) is set with
    timm.layers.set_fused_attn before the build (timm reads it once per attention module in __init__) and
    restored afterwards, so it is fixed by the model config, identical for baseline and conditioned runs, and
    recorded with that config; None leaves timm's process-wide setting (env TIMM_FUSED_ATTN) as it is."""
    import timm
    from timm.layers import config as timm_layer_config

    if why := unknown_timm_model(model_name):
        raise ValueError(why)
    if fused_attn is not None and fused_attn not in FUSED_ATTN_MODES:
        raise ValueError(f"model.fused_attn={fused_attn!r}: choose 0 (off), 1 (timm's stable layers) or 2 (all)")
    previous = timm_layer_config._USE_FUSED_ATTN
    if fused_attn is not None:
        timm.layers.set_fused_attn(*FUSED_ATTN_MODES[int(fused_attn)])
    try:
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
    finally:
        timm_layer_config._USE_FUSED_ATTN = previous
