"""The 2025 rivals on transformers models as transformers' own common tests use them: built on the meta device (as
`from_pretrained` builds), switched between eager and sdpa attention (`set_attn_implementation`), and asked for
their attention probabilities (`output_attentions`, which needs eager attention)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import condattn

pytestmark = pytest.mark.usefixtures("one_thread")


def _llama(impl: str = "sdpa"):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32,
                         attn_implementation=impl)
    return tf.LlamaModel(cfg).eval()


def _ids():
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return ids, mask


def _sinks(model, seed: int = 4) -> None:
    g = torch.Generator().manual_seed(seed)
    for layer in model.layers:
        with torch.no_grad():
            layer.self_attn.condattn_sinks.copy_(torch.randn(4, generator=g))


def _condition(model, method: str):
    kw = {"softcap_cap": 0.05} if method == "softcap" else {}  # (a cap the tiny model's logits pass: the tanh bends)
    condattn.apply_conditioning(model, method, **kw)
    if method == "attention_sink":
        _sinks(model)
    return model


def test_gated_attention_builds_on_the_meta_device_and_takes_the_saved_gate():
    """transformers builds a model on the meta device before loading its weights (from_pretrained): the gate is
    built there too, without values, and the saved weights, gate included, make it the saved model."""
    import transformers as tf

    saved = _llama()
    condattn.apply_conditioning(saved, "gated_attention")
    with torch.device("meta"):
        built = tf.LlamaModel(saved.config)
    condattn.apply_conditioning(built, "gated_attention")
    assert built.layers[0].self_attn.condattn_gate.weight.is_meta
    built = built.to_empty(device="cpu")
    missing, unexpected = built.load_state_dict(saved.state_dict(), strict=False)
    assert not unexpected and all("rotary_emb" in k for k in missing)  # (a buffer transformers recomputes)
    built.rotary_emb.inv_freq.copy_(saved.rotary_emb.inv_freq)
    ids, mask = _ids()
    torch.testing.assert_close(built.eval()(ids, attention_mask=mask).last_hidden_state,
                               saved(ids, attention_mask=mask).last_hidden_state)


@pytest.mark.parametrize("method", ["softcap", "attention_sink", "qk_clip"])
def test_logits_rules_keep_the_attn_implementation_and_survive_switching_it(method):
    """The model keeps the implementation it was given (sdpa), and switching to eager and back keeps the rule:
    the outputs stay the conditioned model's (softcap and the sink change them; qk_clip does not)."""
    plain = _llama()
    model = _condition(copy.deepcopy(plain), method)
    assert model.config._attn_implementation == "sdpa"
    ids, mask = _ids()
    with torch.no_grad():
        sdpa = model(ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
        eager = model(ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation("sdpa")
        again = model(ids, attention_mask=mask).last_hidden_state
        base = plain(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(eager, sdpa, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, sdpa)
    assert (not torch.allclose(sdpa, base, atol=1e-4)) == (method != "qk_clip")


def _gemma2_eager(cap: float):
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    return lambda module, *args, **kwargs: eager_attention_forward(module, *args, softcap=cap, **kwargs)


@pytest.mark.parametrize("method", ["softcap", "attention_sink", "qk_clip"])
def test_eager_output_attentions_are_the_rules_probabilities(method):
    """Under eager attention, output_attentions returns the probabilities the rule formed: Gemma 2's soft-capped
    ones, GPT-OSS's with the sink's column dropped (rows sum below 1), the model's own under qk_clip (which reads
    the logits only); each in the autograd graph, as eager's are."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss

    plain = _llama("eager")
    ref = copy.deepcopy(plain)
    model = _condition(copy.deepcopy(plain), method)
    if method != "qk_clip":
        AttentionInterface.register("condattn_test_reference", _gemma2_eager(0.05) if method == "softcap" else gpt_oss)
        AttentionMaskInterface.register("condattn_test_reference", eager_mask)
        ref.config._attn_implementation = "condattn_test_reference"
    if method == "attention_sink":
        for layer, ref_layer in zip(model.layers, ref.layers):
            ref_layer.self_attn.sinks = nn.Parameter(layer.self_attn.condattn_sinks.detach().clone())
    ids, mask = _ids()
    ours = model.train()(ids, attention_mask=mask, output_attentions=True).attentions
    theirs = ref(ids, attention_mask=mask, output_attentions=True).attentions
    assert len(ours) == 2 and all(a.requires_grad for a in ours)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sums = ours[0].sum(-1)
    assert bool((sums < 1 - 1e-3).all()) if method == "attention_sink" else torch.allclose(sums, torch.ones_like(sums))


def test_remove_gives_the_attention_modules_their_config_back():
    model = _llama()
    config = model.layers[0].self_attn.config
    condattn.apply_conditioning(model, "softcap")
    assert model.layers[0].self_attn.config is not config and model.layers[0].self_attn.config.real is model.config
    condattn.remove_conditioning(model)
    assert model.layers[0].self_attn.config is config


@pytest.mark.parametrize("kind", ["distilbert", "modernbert", "t5"])
def test_the_gate_reaches_w_o_by_each_encoder_s_own_name_and_halves_its_input_at_a_zero_gate(kind):
    """DistilBERT's `out_lin`, ModernBERT's `Wo` and T5's `o` are W_O: the gate multiplies their input. With the gate's
    weights at 0 every gate is σ(0) = ½, so the patched model is the unpatched one with each W_O's weight halved."""
    from condattn.conditioning.coverage import transformers_cases

    build, inputs = transformers_cases()[kind]
    torch.manual_seed(0)
    model, x = build().eval(), inputs()
    halved = copy.deepcopy(model)
    with torch.no_grad():
        plain = model(**x).last_hidden_state
    report = condattn.apply_conditioning(model, "gated_attention")
    assert len(report.entries) == 2 and not report.skipped, report
    names = [e.detail.split(" on the input of ")[1].split(":")[0] for e in report.entries]
    assert all(n.rsplit(".", 1)[1] == {"distilbert": "out_lin", "modernbert": "Wo", "t5": "o"}[kind] for n in names)
    for n in names:
        with torch.no_grad():
            halved.get_submodule(n).weight.mul_(0.5)
    gates = [m for m in model.modules() if hasattr(m, "condattn_gate")]
    assert len(gates) == 2
    with torch.no_grad():
        for m in gates:
            m.condattn_gate.weight.zero_()
            if m.condattn_gate.bias is not None:
                m.condattn_gate.bias.zero_()
        got, want = model(**x), halved(**x)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
    assert not torch.allclose(got.last_hidden_state, plain)  # (the gate does act)
