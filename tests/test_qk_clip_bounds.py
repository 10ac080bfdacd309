"""qk_clip as its source means it, on models written here and a timm ViT with q/k biases: the clipped head's largest
logit on the measured inputs is τ with biases too (each scaled row's bias entry scaled with it), the clip is counted
per key/value group under grouped-query attention, a training loop that never calls after_optimizer_step is warned
once, and the plain-load line says what a plain load loses (the clip, not the outputs)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import condattn
from condattn.conditioning.checkpoint import plain_load_line
from condattn.conditioning.methods import qk_clip

pytestmark = pytest.mark.usefixtures("one_thread")


def _clips(model) -> list:
    return [h for h in model._condattn.handles if isinstance(h, qk_clip.QKClip)]


def _max_logits(model, x) -> torch.Tensor:
    """Each layer's per-head largest logit on `x`, as the clip reads it (a training forward, records then cleared)."""
    model.train()
    with torch.no_grad():
        model(x)
    out = torch.stack([c.rule.max_logits for c in _clips(model)])
    for c in _clips(model):
        c.rule.max_logits = None
    return out


def _vit(bias: bool):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                              num_heads=2, depth=1, num_classes=10, qkv_bias=bias)
    with torch.no_grad():  # large q/k weights and biases: logits far above the τ below
        model.blocks[0].attn.qkv.weight.mul_(6.0)
        if bias:
            model.blocks[0].attn.qkv.bias.normal_(0.0, 3.0)
    return model


@pytest.mark.parametrize("bias", [True, False])
def test_the_clipped_heads_largest_logit_on_the_measured_inputs_is_tau(bias):
    model = _vit(bias)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    rep = condattn.apply_conditioning(model, "qk_clip", qk_clip_tau=1.0)
    assert ("b_Q/b_K" in rep.entries[0].detail) == bias
    before = _max_logits(model, x)
    tau = float(before.min()) / 2  # every head passes it
    for c in _clips(model):
        c.tau = tau
    _max_logits(model, x)  # (the step's forward, read by the clip below)
    model.train()
    with torch.no_grad():
        model(x)
    condattn.after_optimizer_step(model)
    after = _max_logits(model, x)
    # float32 logits of size ~10: the same q·kᵀ recomputed, a few ulps of relative error
    torch.testing.assert_close(after, torch.full_like(after, tau), rtol=1e-4, atol=0.0)


class GQA(nn.Module):
    """4 query heads sharing 2 key/value heads (d = 8)."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.num_key_value_heads = 4, 2
        self.q_proj, self.o_proj = nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False)
        self.k_proj, self.v_proj = nn.Linear(32, 16, bias=False), nn.Linear(32, 16, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, 4, 8).transpose(1, 2)
        k, v = (p(x).view(b, n, 2, 8).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        return self.o_proj(F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(b, n, 32))


def test_under_grouped_query_attention_the_clip_is_per_group_and_counted_per_group():
    torch.manual_seed(0)
    model = nn.Sequential(GQA())
    with torch.no_grad():
        model[0].k_proj.weight[:8].mul_(20.0)  # group 0 (query heads 0, 1) far above group 1
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(2))
    rep = condattn.apply_conditioning(model, "qk_clip")
    assert "per key/value group (2 groups)" in rep.entries[0].detail
    seen = _max_logits(model, x)[0]
    group = seen.view(2, 2).amax(1)
    tau = float(group[1] + group[0]) / 2  # group 0 passes τ, group 1 does not
    clip = _clips(model)[0]
    clip.tau = tau
    k1 = model[0].k_proj.weight[8:].clone()
    _max_logits(model, x)
    model.train()
    with torch.no_grad():
        model(x)
    condattn.after_optimizer_step(model)
    assert clip.clipped == 1  # one group clipped (its two query heads and its key head), counted once
    assert torch.equal(model[0].k_proj.weight[8:], k1)  # group 1 untouched
    after = _max_logits(model, x)[0].view(2, 2).amax(1)
    torch.testing.assert_close(after[0], torch.tensor(tau), rtol=1e-4, atol=0.0)


def test_a_loop_that_never_applies_the_clip_is_warned_once(monkeypatch):
    monkeypatch.setattr(qk_clip, "WARN_AFTER", 5)
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32)
    model = nn.Sequential(GQA(), GQA())
    condattn.apply_conditioning(model, "qk_clip")
    model.train()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(12):
            model(x)
    hits = [w for w in got if issubclass(w.category, qk_clip.QKClipNotCalled)]
    assert len(hits) == 1 and "condattn.after_optimizer_step(model)" in str(hits[0].message)
    applied = nn.Sequential(GQA())
    condattn.apply_conditioning(applied, "qk_clip")
    applied.train()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(12):
            applied(x)
            condattn.after_optimizer_step(applied)
    assert not [w for w in got if issubclass(w.category, qk_clip.QKClipNotCalled)]


def test_the_plain_load_line_says_the_clip_is_lost_not_the_outputs():
    line = plain_load_line({"method": "qk_clip", "qk_clip_tau": 100.0, "qk_clip_alpha": 0.5})
    assert "the outputs are the conditioned model's" in line and "further training runs without it" in line
    assert "the outputs differ" not in line
