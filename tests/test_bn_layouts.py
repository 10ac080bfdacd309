"""SCA on attention whose W_Q/W_K/W_V are followed by BatchNorm (layouts/timm_bn.py): λI added to W before its
BatchNorm. The contract tests of tests/test_layouts.py run on these too (CASES: levit_bn, efficientformer_v2_bn)."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from test_layouts import randomise_batchnorm

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning.layouts.timm_bn import NOTE
from condattn.conditioning.sites import attention_layers

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomise_batchnorm(timm.create_model(name, pretrained=False)).eval()


def _image() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("name", "layout"), [("levit_128s", "timm_levit"), ("levit_conv_128s", "timm_levit"),
                                              ("efficientformerv2_s0", "timm_efficientformer_v2")])
def test_every_attention_layer_is_patched_and_removal_restores(name, layout):
    model, x = _model(name), _image()
    keys = list(model.state_dict())
    with torch.no_grad():
        ref = model(x)
    rep = condattn.apply_conditioning(model, "spectral", lam=2.0)
    assert rep.counts == {f"spectral:{layout}": len(attention_layers(model))}
    assert all(e.detail.endswith(NOTE) for e in rep.entries)  # each site states the reading
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        assert not torch.equal(model(x), ref)
        condattn.remove_conditioning(model)
        assert torch.equal(model(x), ref)
    assert not any("Shifted" in type(m).__name__ for m in model.modules())


def test_levit_w_is_w0_plus_lambda_identity_before_its_batchnorm():
    """The qkv Linear's W becomes W0 + λI on each role's rows (per head [q_h; k_h; v_h], value heads 2× wider), the
    parameter keeps W0, and its BatchNorm follows: eval and training outputs equal W0 + λI written into the Linear."""
    torch.manual_seed(0)
    attn = randomise_batchnorm(timm.models.levit.Attention(32, key_dim=8, num_heads=2, attn_ratio=2, resolution=4))
    attn.eval()  # (LeViT's train() returns None)
    w0, lam = attn.qkv.linear.weight.detach().clone(), 2.0
    explicit = copy.deepcopy(attn)
    condattn.apply_conditioning(attn, "spectral", lam=lam)
    (site,) = find_attention(attn)
    want = w0.clone()
    for role in ("q", "k", "v"):
        rows = site.proj[role].rows
        assert len(rows) == {"q": 16, "k": 16, "v": 32}[role]
        torch.testing.assert_close(site.weight(role), w0[rows] + lam * torch.eye(len(rows), 32))
        want[rows] += lam * torch.eye(len(rows), 32)
    assert torch.equal(attn.qkv.linear.weight, w0)
    with torch.no_grad():
        explicit.qkv.linear.weight.copy_(want)
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        bn = attn.qkv.bn
        by_hand = (x @ want.T - bn.running_mean) / (bn.running_var + bn.eps).sqrt() * bn.weight + bn.bias
        torch.testing.assert_close(attn.qkv(x), by_hand, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(attn(x), explicit(x), rtol=1e-5, atol=1e-5)
    attn.train()  # batch statistics of (W0 + λI) x
    explicit.train()
    torch.testing.assert_close(attn(x), explicit(x), rtol=1e-5, atol=1e-5)


def test_efficientvit_msra_is_conditioned_head_by_head():
    """Each cascaded head is a site of its own (`layer#h<h>`): its ConvNorm's W gets λI on its q, k and v rows
    before its BatchNorm, as the model would compute with that W written in; the layer counts once in the report;
    removal restores the model bit for bit."""
    model, x = _model("efficientvit_m0"), _image()
    layers = len(attention_layers(model))
    explicit = copy.deepcopy(model)
    with torch.no_grad():
        ref = model(x)
    rep = condattn.apply_conditioning(model, "spectral", lam=2.0)
    heads = sum(m.num_heads for m in model.modules() if type(m).__name__ == "CascadedGroupAttention")
    assert rep.counts == {"spectral:timm_efficientvit_msra": heads} and rep.layers("spectral") == layers
    rep.check(attention_layers=layers)
    assert all("#h" in e.module and NOTE in e.detail for e in rep.entries)
    with torch.no_grad():
        for site, twin in zip(find_attention(model), find_attention(explicit)):
            w = twin.proj["q"].linear.weight.flatten(1)  # (a view: writes reach the twin's conv)
            for role in ("q", "k", "v"):
                rows = site.proj[role].rows
                torch.testing.assert_close(site.weight(role), w[rows] + 2.0 * torch.eye(len(rows), w.shape[1]))
                w[rows] += 2.0 * torch.eye(len(rows), w.shape[1])
        torch.testing.assert_close(model(x), explicit(x), rtol=1e-4, atol=1e-5)
        condattn.remove_conditioning(model)
        assert torch.equal(model(x), ref)
