"""The rival methods against their reference code, numerically: QK-norm against timm's own `qk_norm=True` model (three
norm flavours), σReparam against a re-statement of apple/ml-sigma-reparam's logic (fused qkv and per role)."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from torch import nn

import condattn

pytestmark = pytest.mark.usefixtures("one_thread")

# ---------------------------------------------------------------- QK-norm: timm's qk_norm=True

FLAVOURS = {  # timm ViT norm_layer -> (the class timm's qk_norm=True builds, its eps)
    "layernorm_1e-6": (None, "LayerNorm", 1e-6),  # the plain ViT's default
    "clip_layernorm_1e-5": (partial(nn.LayerNorm, eps=1e-5), "LayerNorm", 1e-5),  # CLIP-style ViTs
    "rmsnorm": ("rmsnorm", "RmsNorm", 1e-6),
}


def _vit_pair(norm_layer):
    import timm

    kw = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2, num_classes=10)
    if norm_layer is not None:
        kw["norm_layer"] = norm_layer
    torch.manual_seed(0)
    ours = timm.create_model("vit_tiny_patch16_224", **kw)
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", qk_norm=True, **kw)
    return ours, theirs


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_qk_norm_is_timms_qk_norm_model(flavour):
    """The patched model is timm's qk_norm=True model of the same norm_layer: the same q/k norm class and eps, the
    same state_dict keys, and with the same weights the same outputs and gradients, to the bit."""
    norm_layer, cls, eps = FLAVOURS[flavour]
    ours, theirs = _vit_pair(norm_layer)
    rep = condattn.apply_conditioning(ours, "qk_norm")
    assert rep.count("qk_norm") == 2 and all("native" in e.detail for e in rep.entries)
    q_norm = ours.blocks[0].attn.q_norm
    assert type(q_norm) is type(theirs.blocks[0].attn.q_norm) and type(q_norm).__name__ == cls
    assert q_norm.eps == theirs.blocks[0].attn.q_norm.eps == eps
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():  # move the norms off their init, so that their weights act
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out_ours, out_theirs = ours(x), theirs(x)
    assert torch.equal(out_ours, out_theirs)
    out_ours.square().sum().backward()
    out_theirs.square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name


def test_qk_norm_override_and_fallback_are_reported():
    ours, _ = _vit_pair("rmsnorm")
    rep = condattn.apply_conditioning(ours, "qk_norm", norm="layernorm")
    assert type(ours.blocks[0].attn.q_norm) is nn.LayerNorm and "norm=layernorm" in rep.entries[0].detail
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                enable_nested_tensor=False)
    with pytest.raises(ValueError, match="reads its projection weight itself"):
        condattn.apply_conditioning(enc, "qk_norm")


def _bert_llama(family: str):
    import transformers as tf

    torch.manual_seed(0)
    if family == "bert":
        cfg = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, layer_norm_eps=1e-12)
        return tf.BertModel(cfg).eval(), "LayerNorm", 1e-12
    cfg = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32, rms_norm_eps=1e-5)
    return tf.LlamaModel(cfg).eval(), "LlamaRMSNorm", 1e-5


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_qk_norm_takes_the_transformers_models_own_norm(family):
    model, cls, eps = _bert_llama(family)
    condattn.apply_conditioning(model, "qk_norm")
    norm = next(m for n, m in model.named_modules() if n.endswith("condattn_q_norm"))
    assert type(norm).__name__ == cls
    assert getattr(norm, "eps", getattr(norm, "variance_epsilon", None)) == eps
    assert norm.weight.shape == (8 if family == "llama" else 16,)


FX_FAMILIES = {  # timm name -> tiny config (image 32)
    "davit_tiny": dict(depths=(1, 1), embed_dims=(32, 64), num_heads=(2, 4), window_size=4),
    "swin_tiny_patch4_window7_224": dict(img_size=32, patch_size=4, window_size=4, embed_dim=32, depths=(2, 2),
                                         num_heads=(2, 4)),
    "xcit_nano_12_p16_224": dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2),
    "vit_tiny_patch16_224": dict(img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2),
}


@pytest.mark.parametrize("name", list(FX_FAMILIES))
def test_qk_norm_parameters_get_gradients_under_fx(name):
    """torch.fx traces the norms (a forward hook on a leaf Linear would be invisible to it): the traced graph
    gives the patched numbers, and every parameter QK-norm adds gets the eager gradient."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **FX_FAMILIES[name]).eval()
    before = set(dict(model.named_parameters()))
    condattn.apply_conditioning(model, "qk_norm")
    added = [n for n in dict(model.named_parameters()) if n not in before]
    assert added
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    graph = torch.fx.symbolic_trace(model)
    eager_out = model(x)
    traced_out = graph(x)
    torch.testing.assert_close(traced_out, eager_out, rtol=0, atol=0)
    eager_out.square().sum().backward()
    traced_out.square().sum().backward()
    traced = dict(graph.named_parameters())
    for n in added:
        g = traced[n].grad
        assert g is not None and g.abs().sum() > 0, n
    copy.deepcopy(model)  # the swapped projection class deep-copies
