"""Diagnostics on attention the earlier probes misread: Twins' locally grouped attention hands 5-D probabilities
(batch, groups, heads, N, N); T5's eager attention returns (output, position_bias, probabilities)."""

from __future__ import annotations

import math

import pytest
import torch

from condattn.diagnostics import cheap_diagnostics

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # twins_svt_small at 224: about 15 s on 2 cores
def test_twins_locally_grouped_attention_gets_its_entropy():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("twins_svt_small", pretrained=False, num_classes=10).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    d = cheap_diagnostics(model, lambda m, b: m(b), x)
    att = d["attention"]
    assert att and all(a["absent"] is None for a in att), [a["absent"] for a in att if a["absent"]][:2]
    assert all(0 < a["entropy"] <= a["entropy_uniform"] + 1e-6 for a in att)
    assert sum(abs(a["entropy_uniform"] - math.log(49)) < 1e-9 for a in att) >= 4  # 7 × 7 windows: 49 keys


def test_t5_entropy_is_read_from_its_probabilities():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)
    model = tf.T5Model(cfg).eval()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    d = cheap_diagnostics(model, lambda m, b: m(input_ids=b, decoder_input_ids=b), ids)
    enc = d["attention"][0]
    assert enc["absent"] is None
    model.set_attn_implementation("eager")  # (output_attentions needs the eager path)
    with torch.no_grad():
        p = model(input_ids=ids, decoder_input_ids=ids, output_attentions=True).encoder_attentions[0]
    want = float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())
    assert enc["entropy"] == pytest.approx(want, rel=1e-4)
