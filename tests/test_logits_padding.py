"""softcap and attention_sink on padded batches, in every attention mode transformers runs on a CPU (eager, SDPA):
finite everywhere (a left-padded query under the causal mask sees no key at all), gradients too, and equal on the
real tokens to the references: Gemma 2's own soft-capping (its eager attention) and GPT-OSS's eager attention with
sinks. And a home-made model's SDPA call with a fully masked row gives the fused kernel's own result there."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import condattn
from condattn.conditioning.methods.logits import explicit_attention

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
tf = pytest.importorskip("transformers")

# float32 outputs of about unit size through two layers: a few ulps (1.2e-7) per op, well inside 1e-5
TOL = dict(rtol=1e-5, atol=1e-5)


def _batch(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 8, dtype=torch.long)
    if side == "left":  # the first three queries of row 0 see no key under the causal mask
        mask[0, :3] = 0
    else:
        mask[0, 5:] = 0
    mask[1, :] = 1
    return ids.masked_fill(mask == 0, 0), mask


def _gemma2(cap):
    torch.manual_seed(0)
    return tf.Gemma2Model(tf.Gemma2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=8, intermediate_size=64,
                                          query_pre_attn_scalar=1, initializer_range=0.2, pad_token_id=0,
                                          attn_logit_softcapping=cap, attn_implementation="eager")).eval()


def _llama(impl: str):
    torch.manual_seed(0)
    return tf.LlamaModel(tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32,
                                        pad_token_id=0, attn_implementation=impl)).eval()


def _assert_real_tokens_equal(ours, ref, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """On a `side`-padded batch: ours is finite with finite gradients, and equals the reference on the real tokens.
    Returns ours's output and the real-token mask."""
    ids, mask = _batch(side)
    out = _finite_with_grads(ours, ids, mask)
    expected = ref(ids, attention_mask=mask).last_hidden_state.detach()
    real = mask.bool()
    torch.testing.assert_close(out[real], expected[real], **TOL)
    return out, real


def _finite_with_grads(model, ids, mask) -> torch.Tensor:
    out = model(ids, attention_mask=mask).last_hidden_state
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return out.detach()


@pytest.mark.parametrize("side", ["left", "right"])
def test_softcap_is_finite_and_gemma2_on_a_padded_batch(side):
    """Gemma 2 itself (eager: transformers runs it under no other implementation on a CPU)."""
    cap = 0.5
    ref = _gemma2(cap)
    ours = copy.deepcopy(ref)
    ours.config.attn_logit_softcapping = None
    for layer in ours.layers:
        layer.self_attn.attn_logit_softcapping = None
    condattn.apply_conditioning(ours, "softcap", softcap_cap=cap)
    _assert_real_tokens_equal(ours, ref, side)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_softcap_is_finite_and_gemma2s_attention_under_each_implementation(impl, side):
    """A Llama under eager or SDPA with softcap, against the same Llama whose attention function is Gemma 2's
    eager_attention_forward with its softcap (registered as an attention function, with the eager mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    cap = 0.05  # (the tiny Llama's logits are small: a small cap bends them)
    AttentionInterface.register("gemma2_reference",
                                lambda m, *a, **kw: eager_attention_forward(m, *a, softcap=cap, **kw))
    AttentionMaskInterface.register("gemma2_reference", eager_mask)
    ours = _llama(impl)
    ref = copy.deepcopy(ours)
    ref.config._attn_implementation = "gemma2_reference"
    plain = ours(*_batch(side)[:1], attention_mask=_batch(side)[1]).last_hidden_state.detach()
    condattn.apply_conditioning(ours, "softcap", softcap_cap=cap)
    out, real = _assert_real_tokens_equal(ours, ref, side)
    assert (out[real] - plain[real]).abs().max() > 1e-4  # (the cap acts)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_sink_is_finite_and_gpt_oss_on_a_padded_batch(impl, side):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    AttentionInterface.register("gpt_oss_reference", eager_attention_forward)
    AttentionMaskInterface.register("gpt_oss_reference", eager_mask)
    ours = _llama(impl)
    ref = copy.deepcopy(ours)
    condattn.apply_conditioning(ours, "attention_sink")
    g = torch.Generator().manual_seed(4)
    for layer, ref_layer in zip(ours.layers, ref.layers):
        with torch.no_grad():
            layer.self_attn.condattn_sinks.copy_(torch.randn(4, generator=g))
        ref_layer.self_attn.sinks = nn.Parameter(layer.self_attn.condattn_sinks.detach().clone())
    ref.config._attn_implementation = "gpt_oss_reference"
    _assert_real_tokens_equal(ours, ref, side)


@pytest.mark.parametrize("masked", ["bool", "-inf"])
def test_a_query_that_sees_no_key_gets_the_fused_kernels_result(masked):
    """A row whose mask hides every key: the fused kernel's safe softmax gives output 0 there; so does the explicit
    computation (softcap and sink alike), never NaN, with finite gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g, requires_grad=True) for _ in range(3))
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    keep[0] = False  # query 0 sees nothing
    mask = keep if masked == "bool" else torch.zeros(5, 5).masked_fill(~keep, -torch.inf)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    plain = explicit_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(plain, fused, rtol=1e-5, atol=1e-6)  # (float32, unit-size values: a few ulps)
    for out in (explicit_attention(q, k, v, attn_mask=mask, cap=2.0),
                explicit_attention(q, k, v, attn_mask=mask, sinks=torch.zeros(4))):
        assert torch.isfinite(out).all() and bool((out[:, :, 0] == 0).all())
        out.square().sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
