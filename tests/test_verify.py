"""Every patch verified or refused: a site matched by structure alone is probed before anything is written
(conditioning/verify.py); CoaT's factorised attention is refused; CET is refused on a causal decoder unless the leak
is accepted."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning.sites import verified

pytestmark = pytest.mark.usefixtures("one_thread")


class Interleaved(nn.Module):
    """A hand-written attention whose fused qkv is interleaved per head: its output is viewed (B, N, H, 3, d)."""

    def __init__(self, dim=32, num_heads=4):
        super().__init__()
        self.num_heads, self.qkv, self.proj = num_heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.seen: dict[str, torch.Tensor] = {}

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, self.num_heads, 3, -1).permute(3, 0, 2, 1, 4)
        self.seen["q"] = q.detach()
        return self.proj(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


class Reversed(Interleaved):
    """A fused qkv stacked as [V; K; Q]: neither the stacked nor the interleaved reading (the names say qkv)."""

    def forward(self, x):
        B, N, D = x.shape
        v, k, q = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        return self.proj(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


class Stacked(Interleaved):
    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        self.seen["q"] = q.detach()
        return self.proj(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


def _model(cls):
    torch.manual_seed(0)
    return nn.Sequential(cls(), cls()).eval()


def _tokens():
    return torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))


def test_an_interleaved_fused_qkv_is_re_read_and_gets_lambda_i_on_its_true_w_q():
    model, x = _model(Interleaved), _tokens()
    rep = condattn.apply_conditioning(model, "spectral", lam=3.0)
    assert rep.count("spectral:structural") == 2
    assert all("interleaved per head" in e.detail for e in rep.entries)
    with torch.no_grad():
        model(x)
        w, b = model[0].qkv.weight, model[0].qkv.bias
        rows = torch.cat([torch.arange(h * 24, h * 24 + 8) for h in range(4)])  # q_h of each head's [q; k; v]
        want = x @ (w[rows] + 3.0 * torch.eye(32)).T + b[rows]  # x (W_Q + λI)ᵀ + b: the paper's shift on W_Q
    got = model[0].seen["q"].transpose(1, 2).reshape(2, 6, 32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_stacked_fused_qkv_is_verified():
    model = _model(Stacked)
    rep = condattn.apply_conditioning(model, "spectral", lam=3.0)
    assert all("verified by a probe" in e.detail for e in rep.entries)


def test_a_split_no_reading_explains_is_refused_with_why():
    model, x = _model(Reversed), _tokens()
    with torch.no_grad():
        ref = model(x)
    with pytest.raises(ValueError, match="refused by a probe: its logits move when the assumed W_V rows do"):
        condattn.apply_conditioning(model, "spectral")
    with torch.no_grad():
        assert torch.equal(model(x), ref)
    kept, refused = verified(find_attention(model))
    assert not kept and len(refused) == 2


def test_probe_leaves_the_module_untouched():
    model = _model(Interleaved)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    verified(find_attention(model))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not model[0]._forward_hooks and not model[0].qkv._forward_hooks


def test_coat_factorised_attention_is_refused_without_partial():
    import timm

    model = timm.create_model("coat_lite_tiny", pretrained=False, num_classes=10)
    with pytest.raises(ValueError, match="CoaT's factorised attention") as err:
        condattn.apply_conditioning(model, "spectral")
    assert "no q·kᵀ logits" in str(err.value)


def _qwen2():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return tf.Qwen2Model(cfg).eval()


def test_cet_on_a_causal_decoder_is_refused_unless_the_leak_is_accepted():
    model = _qwen2()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for method in ("embedded", "spectral+embedded"):
        with pytest.raises(ValueError, match="lets each token see later ones") as err:
            condattn.apply_conditioning(model, method)
        assert "\n" not in str(err.value) and "causal_leak=accept" in str(err.value)
        assert condattn.conditioning_report(model) is None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 50
    rep = condattn.apply_conditioning(model, "embedded", causal_leak="accept", solver="svd")
    assert rep.options["causal_leak"] == "accept" and any("causal_leak=accept" in n for n in rep.notes)
    assert "causal_leak=accept" in rep.entries[0].detail
    with torch.no_grad():  # the leak the option accepts: position 0 sees the last token
        moved = (model(ids).last_hidden_state[0, 0] - model(changed).last_hidden_state[0, 0]).abs().max()
    assert moved > 1e-3


def test_accepting_the_leak_renames_no_run():
    from condattn.conditioning import conditioning_spec

    a = conditioning_spec(method="embedded").identity()
    b = conditioning_spec(method="embedded", causal_leak="accept").identity()
    assert a == b and "causal_leak" not in a


class Outlookish(nn.Module):
    """An attention-named class whose Linear children are not named as W_Q/W_K/W_V (VOLO's outlooker: v, attn,
    proj): the registration hint must not present them as q/k/v."""

    def __init__(self, dim=16):
        super().__init__()
        self.num_heads, self.v, self.attn, self.proj = 2, nn.Linear(dim, dim), nn.Linear(dim, 9), nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(self.v(x)) + self.attn(x).mean(-1, keepdim=True)


class OutlookishAttention(Outlookish):
    pass


def test_hints_name_real_submodules_or_none():
    model = nn.Sequential(OutlookishAttention())
    with pytest.raises(ValueError) as err:
        condattn.apply_conditioning(model, "spectral")
    msg = str(err.value)
    assert "separate((m.v, m.YOUR_W_K, m.YOUR_W_Q))" not in msg
    assert "m.YOUR_W_Q, m.YOUR_W_K, m.v" in msg and "children are ['v', 'attn', 'proj']" in msg
    assert "m.attn" not in msg.split("register it from your code:")[1]


def test_a_model_without_attention_says_so():
    with pytest.raises(ValueError, match="Sequential has no attention layer"):
        condattn.apply_conditioning(nn.Sequential(nn.Linear(4, 4)), "spectral")


def test_a_kind_selector_on_a_model_without_kinds_is_refused():
    model = _model(Stacked)
    with pytest.raises(ValueError, match="detr_attention=\\['encoder'\\] selects attention kinds.*would be ignored"):
        condattn.apply_conditioning(model, "spectral", detr_attention=["encoder"])
    assert condattn.conditioning_report(model) is None
