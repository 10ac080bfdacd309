"""Patching is atomic and strict, and a patched model keeps the contracts of torch and timm.

Every refusal of `apply_conditioning` leaves the model bit-identical (state_dict, module types, hooks, output); a
model with attention layers no layout matches is refused by default with the class named and the registration to
write, and patched with a warning under partial=True.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning import sites as sites_mod
from condattn.conditioning.embedded import EmbeddedTokens

pytestmark = pytest.mark.usefixtures("one_thread")


class OddAttention(nn.Module):
    """Attention whose projections are 1×1 convolutions, which no layout matches."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.qkv = heads, nn.Conv1d(dim, 3 * dim, 1)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x.transpose(1, 2)).transpose(1, 2).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return x + nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)


class Mixed(nn.Module):
    """One nn.MultiheadAttention (matched) and one OddAttention (not)."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.odd = OddAttention()

    def forward(self, x):
        return self.odd(x + self.mha(x, x, x, need_weights=False)[0])


def _encoder():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _tokens():
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))


def _pit():
    import timm

    return timm.create_model("pit_ti_224", pretrained=False, img_size=32, num_classes=10)


def _images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def snapshot(model: nn.Module, x: torch.Tensor) -> dict:
    with torch.no_grad():
        out = model(x)
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "types": [(n, type(m)) for n, m in model.named_modules()],
        "hooks": [(n, len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in model.named_modules()],
        "attrs": [(n, sorted(k for k in vars(m) if k.startswith("_condattn"))) for n, m in model.named_modules()],
        "out": out,
    }


def assert_identical(before: dict, after: dict) -> None:
    assert before["types"] == after["types"]
    assert before["hooks"] == after["hooks"]
    assert before["attrs"] == after["attrs"]
    assert before["state"].keys() == after["state"].keys()
    assert all(torch.equal(before["state"][k], after["state"][k]) for k in before["state"])
    assert torch.equal(before["out"], after["out"])


REFUSALS = {  # (build, input, method, options, message)
    "cet_half_on_torch_encoder": (_encoder, _tokens, "spectral+embedded", {}, "cannot locate the first"),
    "cet_half_on_pit": (_pit, _images, "spectral+embedded", {}, "cannot locate the first"),
    "cet_half_mode_init": (_pit, _images, "spectral+embedded", {"mode": "init"}, "cannot locate the first"),
    "unmatched_attention": (Mixed, _tokens, "spectral", {}, "OddAttention"),
    "unmatched_conditioned_init": (Mixed, _tokens, "conditioned_init", {}, "OddAttention"),
    "no_attention": (lambda: nn.Sequential(nn.Linear(16, 16)), _tokens, "spectral", {}, "no attention module"),
    "no_tokens": (lambda: nn.Sequential(nn.Linear(16, 16)), _tokens, "embedded", {}, "cannot locate the first"),
    "bad_option": (_pit, _images, "spectral", {"identity": "diag"}, "identity='diag'"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_every_refusal_leaves_the_model_bit_identical(name):
    build, inputs, method, opts, match = REFUSALS[name]
    torch.manual_seed(0)
    model, x = build().eval(), inputs()
    before = snapshot(model, x)
    with pytest.raises(ValueError, match=match):
        condattn.apply_conditioning(model, method, **opts)
    assert_identical(before, snapshot(model, x))
    assert condattn.conditioning_report(model) is None
    condattn.remove_conditioning(model)  # nothing to remove
    assert_identical(before, snapshot(model, x))


def test_spectral_after_a_refused_cet_half_is_one_lambda_i():
    """The bug of issue 27: a refused spectral+embedded used to leave W + λI applied, and `spectral` then stacked a
    second λI. Now the second call is the first patch: equal to spectral on a fresh copy."""
    torch.manual_seed(0)
    model, x = _pit().eval(), _images()
    torch.manual_seed(0)
    fresh = _pit().eval()
    with pytest.raises(ValueError):
        condattn.apply_conditioning(model, "spectral+embedded", lam=20.0)
    condattn.apply_conditioning(model, "spectral", lam=20.0)
    condattn.apply_conditioning(fresh, "spectral", lam=20.0)
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))


def test_an_error_while_patching_undoes_what_was_attached(monkeypatch):
    """A failure after planning (here: CET's attach raising) removes the SCA patch already attached."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2).eval()
    x = _images()
    before = snapshot(model, x)

    def boom(self):
        raise RuntimeError("attach failed")

    monkeypatch.setattr(EmbeddedTokens, "attach", boom)
    with pytest.raises(RuntimeError, match="attach failed"):
        condattn.apply_conditioning(model, "spectral+embedded")
    assert_identical(before, snapshot(model, x))


def test_unmatched_attention_names_the_class_and_the_registration():
    model = Mixed()
    with pytest.raises(ValueError) as err:
        condattn.apply_conditioning(model, "spectral")
    msg = str(err.value)
    assert "1 of 2 attention layers of Mixed" in msg and f"{__name__}.OddAttention (1×, e.g. odd)" in msg
    assert "partial=True" in msg and "@attention_layout('my_oddattention')" in msg
    assert "if type(m) is not OddAttention" in msg


def test_partial_patches_the_matched_layers_with_a_warning():
    torch.manual_seed(0)
    model, x = Mixed().eval(), _tokens()
    with torch.no_grad():
        ref = model(x)
    rep = condattn.apply_conditioning(model, "spectral", partial=True, lam=2.0)
    assert rep.counts == {"spectral:torch_mha": 1}
    assert len(rep.warnings) == 1 and "OddAttention" in rep.warnings[0] and "WARNING" in str(rep)
    assert rep.to_dict()["warnings"] == rep.warnings
    with torch.no_grad():
        assert not torch.equal(model(x), ref)
    condattn.remove_conditioning(model)
    with torch.no_grad():
        assert torch.equal(model(x), ref)


def test_reregistering_a_layout_takes_replace(monkeypatch):
    monkeypatch.setattr(sites_mod, "ATTENTION_LAYOUTS", dict(sites_mod.ATTENTION_LAYOUTS))
    monkeypatch.setattr(sites_mod, "PRIORITY", dict(sites_mod.PRIORITY))

    def odd(name, m):
        if type(m) is not OddAttention:
            return None
        return None

    sites_mod.attention_layout("odd_user")(odd)
    with pytest.raises(ValueError, match=r"registered twice; pass replace=True"):
        sites_mod.attention_layout("odd_user")(odd)

    def odd2(name, m):
        return None

    sites_mod.attention_layout("odd_user", replace=True)(odd2)
    assert sites_mod.ATTENTION_LAYOUTS["odd_user"] is odd2


# ---------------------------------------------------------------- conditioned_init on a layout interleaved per head


@pytest.mark.parametrize("identity", ["full", "per_head"])
def test_conditioned_init_on_an_interleaved_fused_qkv(identity):
    """GPT-NeoX's `query_key_value` rows are [q_h; k_h; v_h] per head: conditioned_init writes each role's own rows
    (read back both through the site and straight from the raw weight)."""
    from transformers import GPTNeoXConfig, GPTNeoXModel

    torch.manual_seed(0)
    model = GPTNeoXModel(GPTNeoXConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64)).eval()
    rep = condattn.apply_conditioning(model, "conditioned_init", identity=identity)
    assert rep.counts == {"conditioned_init:structural": 2}
    for site in find_attention(model):
        d, heads = site.head_dim, site.num_heads
        w = site.module.query_key_value.weight.detach()
        for h in range(heads):
            for i, role in enumerate("qkv"):
                raw = w[h * 3 * d + i * d: h * 3 * d + (i + 1) * d]
                assert torch.equal(raw, site.head_weight(role, h))
            for role in "qk":  # semi-orthogonal rows per head
                q = site.head_weight(role, h)
                torch.testing.assert_close(q @ q.T, torch.eye(d), atol=1e-5, rtol=0)
        v = site.weight("v")
        if identity == "full":
            torch.testing.assert_close(v, torch.eye(heads * d, v.shape[1]))
        else:
            for h in range(heads):
                torch.testing.assert_close(site.head_weight("v", h), torch.eye(d, v.shape[1]))
