"""W_O and the head count found by structure (conditioning/traced.py) on attention modules written here as users write
them: lucidrains' `to_q/to_k/to_v/to_out` (a Sequential(Linear, Dropout)), Meta's `wq/wk/wv/wo` with a causal mask
and the head count in `self.h`, an unlisted W_O name (`mix`) with a softmax formed in Python, a fused `qkv` with an
unlisted W_O name, and modules that hide their head count or have no W_O. Every refusal says why, and no report
claims a part it did not set."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning.methods.common import output_projection

pytestmark = pytest.mark.usefixtures("one_thread")
DIM = 32


class Lucid(nn.Module):
    def __init__(self, heads=4):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.to_out = nn.Sequential(nn.Linear(DIM, DIM), nn.Dropout(0.0))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t(x).view(b, n, self.heads, -1).transpose(1, 2) for t in (self.to_q, self.to_k, self.to_v))
        return self.to_out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, DIM))


class Meta(nn.Module):  # head count in `h`, which no finder knows; causal
    def __init__(self, h=4):
        super().__init__()
        self.h = h
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t(x).view(b, n, self.h, -1).transpose(1, 2) for t in (self.wq, self.wk, self.wv))
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, DIM))


class Mixer(nn.Module):  # unlisted W_O name, head count in `nh`, softmax in Python
    def __init__(self, nh=2):
        super().__init__()
        self.nh = nh
        self.q, self.k, self.v = (nn.Linear(DIM, DIM) for _ in range(3))
        self.mix = nn.Linear(DIM, DIM)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t(x).view(b, n, self.nh, -1).transpose(1, 2) for t in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (DIM // self.nh) ** 0.5, -1)
        return self.mix((a @ v).transpose(1, 2).reshape(b, n, DIM))


class Fused(nn.Module):  # fused qkv, unlisted W_O name
    def __init__(self):
        super().__init__()
        self.num_heads = 4
        self.qkv, self.merge = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 4, -1).permute(2, 0, 3, 1, 4)
        return self.merge(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, DIM))


class NoOut(nn.Module):  # no output projection at all
    def __init__(self):
        super().__init__()
        self.num_heads = 4
        self.q, self.k, self.v = (nn.Linear(DIM, DIM) for _ in range(3))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t(x).view(b, n, 4, -1).transpose(1, 2) for t in (self.q, self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, DIM)


class Hidden(nn.Module):  # no head count on the module, and none reproduces its attention (q goes through a ReLU)
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t(x).view(b, n, 4, -1).transpose(1, 2) for t in (self.q, self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q.relu(), k, v).transpose(1, 2).reshape(b, n, DIM))


class Block(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(DIM), attn

    def forward(self, x):
        return x + self.attn(self.norm(x))


def build(cls, **kw) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(cls(**kw)) for _ in range(2))).eval()


X = torch.randn(2, 6, DIM, generator=torch.Generator().manual_seed(1))
W_O = {Lucid: "to_out.0", Meta: "wo", Mixer: "mix", Fused: "merge"}
HEADS = {Lucid: 4, Meta: 4, Mixer: 2, Fused: 4}


@pytest.mark.parametrize("cls", list(W_O))
def test_w_o_is_the_linear_applied_to_the_attention_output_whatever_its_name(cls):
    model = build(cls)
    sites = find_attention(model)
    assert [s.num_heads for s in sites] == [HEADS[cls]] * 2
    for i, site in enumerate(sites):
        out = output_projection(model, site)
        assert out.name == f"{i}.attn.{W_O[cls]}" and out.called and "traced call" in out.how
        assert out.module is model[i].attn.get_submodule(W_O[cls])


def test_a_registered_layout_names_w_o_and_the_methods_use_it():
    """A layout of one's own names W_O in the site (AttentionSite.out), as docs/getting-started.md says: the gate
    multiplies that module's input even where the trace would find another."""
    from condattn.conditioning import AttentionSite, OutputProjection, attention_layout, separate
    from condattn.conditioning.sites import ATTENTION_LAYOUTS, PRIORITY

    @attention_layout("test_named_w_o", priority=5)
    def named(name, m):
        if type(m) is not Mixer:
            return None
        return AttentionSite(name, m, "test_named_w_o", m.nh, DIM // m.nh, separate((m.q, m.k, m.v)),
                             out=OutputProjection(m.mix))

    try:
        model = build(Mixer)
        rep = condattn.apply_conditioning(model, "gated_attention")
        assert all(e.detail.split(" on the input of ")[1].startswith(f"{i}.attn.mix:") and "named by its layout"
                   in e.detail for i, e in enumerate(rep.entries))
    finally:
        ATTENTION_LAYOUTS.pop("test_named_w_o")
        PRIORITY.pop(("attention", "test_named_w_o"))


def test_a_layout_names_its_w_o_in_the_site():
    mha = nn.TransformerEncoder(nn.TransformerEncoderLayer(DIM, 4, batch_first=True), 1, enable_nested_tensor=False)
    site = find_attention(mha)[0]
    assert site.out is not None and site.out.module is mha.layers[0].self_attn.out_proj and not site.out.called
    with pytest.raises(ValueError, match="never as a module call"):
        condattn.apply_conditioning(mha, "ns_attention")


@pytest.mark.parametrize("cls", list(W_O))
@pytest.mark.parametrize("method", ["mimetic_init", "gated_attention", "ns_attention"])
def test_the_methods_that_need_w_o_patch_every_naming(cls, method):
    model = build(cls)
    if method == "ns_attention" and cls is Meta:  # (causal: refused for its own, true reason)
        with pytest.raises(ValueError, match="causal self-attention"):
            condattn.apply_conditioning(model, method)
        return
    before = model(X)
    w_o = [m.attn.get_submodule(W_O[cls]).weight.clone() for m in model]
    rep = condattn.apply_conditioning(model, method)
    assert rep.layers(method) == 2 and not rep.skipped
    after = model(X)
    assert torch.isfinite(after).all() and not torch.allclose(after, before)
    if method == "mimetic_init":
        assert all(e.detail == "qk+vo" for e in rep.entries)
        assert not any(torch.equal(m.attn.get_submodule(W_O[cls]).weight, w) for m, w in zip(model, w_o))
        assert "W_V, W_O" in str(rep) and "in 2 layers" in str(rep)
    else:
        assert all(W_O[cls] in e.detail for e in rep.entries)
        condattn.remove_conditioning(model)
        assert torch.equal(model(X), before)


def test_mimetic_refuses_a_layer_without_w_o_unless_the_qk_half_is_accepted():
    model = build(NoOut)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"cannot take the VO half .*no output projection W_O found.*"
                                         r"mimetic_missing_vo=accept") as err:
        condattn.apply_conditioning(model, "mimetic_init")
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # nothing was changed
    rep = condattn.apply_conditioning(model, "mimetic_init", mimetic_missing_vo="accept")
    assert all(e.detail.startswith("qk (no output projection W_O found") for e in rep.entries)
    text = str(rep)
    assert "in 2 layers only W_Q, W_K (VO left as built" in text and "W_V, W_O so that" not in text
    assert all(torch.equal(model[i].attn.v.weight, state[f"{i}.attn.v.weight"]) for i in range(2))


@pytest.mark.parametrize("method, words", [("gated_attention", "no output projection W_O found"),
                                           ("ns_attention", "no output projection W_O found")])
def test_the_refusal_without_w_o_says_what_the_trace_found(method, words):
    with pytest.raises(ValueError, match=f"{words}: no Linear is applied to the attention's output in NoOut"):
        condattn.apply_conditioning(build(NoOut), method)


@pytest.mark.parametrize("heads", [1, 2, 8])
def test_the_head_count_in_an_unlisted_attribute_is_found_by_recomputation(heads):
    model = build(Meta, h=heads)
    site = find_attention(model)[0]
    assert site.num_heads == heads and site.head_dim == DIM // heads and not site.heads_unknown
    assert f"{heads} heads found by recomputation" in site.heads_found
    rep = condattn.apply_conditioning(model, "spectral")
    assert rep.layers("spectral") == 2 and "found by recomputation" in rep.entries[0].detail


def test_a_head_count_no_divisor_reproduces_keeps_sca_and_refuses_the_methods_that_need_one():
    model = build(Hidden)
    site = find_attention(model)[0]
    assert site.heads_unknown.startswith("no head count on the module, and no head count reproduces its attention")
    before = model(X)
    for method in ("spectral", "softcap"):  # λI on the whole D × D weights, a cap on whatever the kernel receives
        rep = condattn.apply_conditioning(model, method, **({"softcap_cap": 0.1} if method == "softcap" else {}))
        assert rep.layers(method) == 2 and not torch.allclose(model(X), before)
        condattn.remove_conditioning(model)
        assert torch.equal(model(X), before)
    for method in ("mimetic_init", "qk_clip", "attention_sink", "ns_attention"):
        with pytest.raises(ValueError, match=f"{method}: 2 of 2 attention layers of Sequential have no head count"):
            condattn.apply_conditioning(model, method)
