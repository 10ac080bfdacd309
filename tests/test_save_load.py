"""A conditioned model saves and loads whole (conditioning/checkpoint.py): QK-norm and σReparam on BERT and Llama
through save_pretrained and condattn.conditioning.from_pretrained, also between a base model and a model with a head;
a plain transformers load of any conditioned checkpoint says in one line which method it drops (or keeps, init-only)
and the loader; condattn's loader reports none of the keys it restores; SCA keeps torch.export on GPT-2."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from helpers import assert_close_to_scale

import condattn
from condattn.conditioning import from_pretrained

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]  # compat: scripts/compat.py


def _model(family: str):
    import transformers as tf

    torch.manual_seed(0)
    if family in ("bert", "bert-head"):
        cfg = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32)
        cls = tf.BertModel if family == "bert" else tf.BertForSequenceClassification
        return cls, cls(cfg).eval()
    cfg = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32)
    return tf.LlamaForCausalLM, tf.LlamaForCausalLM(cfg).eval()


def _out(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("method", ["qk_norm", "sigma_reparam"])
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_conditioned_model_reloads_whole(tmp_path, family, method):
    cls, model = _model(family)
    condattn.apply_conditioning(model, method)
    with torch.no_grad():  # "trained": every weight, the added norms and γ included, moved off its init
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.train()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    model(ids)  # (σReparam: a training step moves its stored power-iteration vector)
    model.eval()
    ref = _out(model, ids)
    model.save_pretrained(tmp_path)
    plain = cls.from_pretrained(tmp_path)  # what transformers alone gives back: the added keys dropped
    assert not torch.allclose(_out(plain, ids), ref, atol=1e-4)
    loaded = from_pretrained(cls, tmp_path)
    assert condattn.conditioning_report(loaded).method == method
    assert set(loaded.state_dict()) == set(model.state_dict())
    torch.testing.assert_close(_out(loaded, ids), ref, rtol=0, atol=1e-6)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_an_init_only_method_is_not_reapplied(tmp_path):
    cls, model = _model("bert")
    condattn.apply_conditioning(model, "mimetic_init")
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    ref = _out(model, ids)
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(cls, tmp_path)
    assert condattn.conditioning_report(loaded) is None
    torch.testing.assert_close(_out(loaded, ids), ref, rtol=0, atol=0)


@pytest.mark.slow  # export: about 3 s
def test_sca_on_gpt2_exports():
    """SCA's output hook on GPT-2's Conv1D reads no tensor values (its runs are Python ints), so torch.export
    traces it and gives the patched numbers."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0)).eval()
    condattn.apply_conditioning(model, "spectral")
    ids = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(0))
    ep = torch.export.export(model, (ids,), {"use_cache": False}, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(ids, use_cache=False).last_hidden_state,
                                   model(ids, use_cache=False).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_transformers_init_reaches_what_sigma_reparam_adds():
    """transformers' own initialisation (init_weights: `_init_weights` on every module) re-initialises W; γ follows
    from the new W as at application (σ_max(W)), v goes back to its constant start, the same on every build, and
    takes the new W's top right singular vector at the first forward."""
    from condattn.conditioning.methods.sigma_reparam import start_vector

    cls, model = _model("llama")
    condattn.apply_conditioning(model, "sigma_reparam")
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "sigma_" in name:
                t.fill_(0.5)
    for m in model.modules():
        m._is_hf_initialized = False
    model.init_weights()
    attn = model.model.layers[0].self_attn
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    for proj in projs:
        assert torch.equal(proj.sigma_v, start_vector(proj.sigma_v.numel(), proj.sigma_v))
    model(torch.randint(0, 50, (1, 5)))
    for proj in projs:
        _, s, vh = torch.linalg.svd(proj.weight.detach())
        torch.testing.assert_close(proj.sigma_gamma.detach(), s[0])
        torch.testing.assert_close((proj.sigma_v @ vh[0]).abs(), torch.tensor(1.0))
    condattn.remove_conditioning(model)
    assert "_init_weights" not in model.__dict__ and not any("sigma" in k for k in model.state_dict())


def test_sigma_reparam_buffers_are_the_same_on_every_build():
    """transformers' test_init_weights_can_init_buffers: a model built with its own init skipped and one built on
    the meta device then initialised (to_empty, init_weights) hold equal buffers; v's start does not depend on W."""
    cls, model = _model("bert")
    condattn.apply_conditioning(model, "sigma_reparam")
    with torch.device("meta"):
        meta = cls(model.config)
    condattn.apply_conditioning(meta, "sigma_reparam")
    meta.to_empty(device="cpu")
    for m in meta.modules():  # (transformers 4.x skips a module its post_init marked initialised, on meta)
        m._is_hf_initialized = False
    meta.init_weights()
    built, inited = dict(model.named_buffers()), dict(meta.named_buffers())
    assert built.keys() == inited.keys() and any("sigma_v" in k for k in built)
    assert all(torch.equal(v, inited[k]) for k, v in built.items() if "sigma_v" in k)


def test_a_set_sigma_v_is_kept_at_the_first_forward():
    """A v other than the constant start (loaded, or set by hand) is not replaced by the SVD at the first forward."""
    cls, model = _model("bert")
    condattn.apply_conditioning(model, "sigma_reparam")
    v = model.encoder.layer[0].attention.self.query.sigma_v
    with torch.no_grad():
        v.copy_(torch.nn.functional.normalize(torch.randn(v.shape, generator=torch.Generator().manual_seed(3)), dim=0))
    kept = v.clone()
    model.eval()
    model(torch.randint(0, 50, (1, 5)))
    assert torch.equal(v, kept)

def _plain_load(cls, path) -> list[str]:
    """The PlainLoadWarning lines of a plain transformers from_pretrained."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls.from_pretrained(path)
    return [str(w.message) for w in caught if type(w.message).__name__ == "PlainLoadWarning"]


@pytest.mark.parametrize(("method", "label"), [("spectral", "spectral (SCA)"), ("embedded", "embedded (CET)"),
                                               ("ns_attention", "NS-attention"), ("qk_norm", "QK-norm"),
                                               ("sigma_reparam", "σReparam")])
def test_a_plain_load_names_the_method_it_drops(tmp_path, method, label):
    cls, model = _model("bert")
    condattn.apply_conditioning(model, method)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    model.save_pretrained(tmp_path)
    lines = _plain_load(cls, tmp_path)
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert label in lines[0] and "without it" in lines[0]
    assert "condattn.conditioning.from_pretrained(BertModel, path)" in lines[0]
    assert ("added weights are dropped" in lines[0]) == condattn.conditioning.method_spec(method).adds_keys
    if method != "sigma_reparam":  # (σReparam leaves Ŵ = W until trained)
        assert not torch.allclose(_out(cls.from_pretrained(tmp_path), ids), _out(model, ids), atol=1e-4)


@pytest.mark.parametrize(("method", "options"), [("mimetic_init", {}), ("conditioned_init", {}),
                                                 ("spectral", {"mode": "init"})])
def test_a_plain_load_of_an_init_only_method_says_it_is_kept(tmp_path, method, options):
    cls, model = _model("bert")
    condattn.apply_conditioning(model, method, **options)
    model.save_pretrained(tmp_path)
    lines = _plain_load(cls, tmp_path)
    assert len(lines) == 1 and "kept in the loaded weights and nothing is lost" in lines[0], lines


def test_a_plain_load_of_a_composite_says_what_it_drops_and_keeps(tmp_path):
    cls, model = _model("bert")
    condattn.apply_conditioning(model, "spectral+embedded", mode="init")
    model.save_pretrained(tmp_path)
    (line,) = _plain_load(cls, tmp_path)
    assert "conditioned with embedded (CET);" in line and "(spectral with mode=init is kept in the weights)" in line


def test_a_plain_load_of_an_unconditioned_checkpoint_says_nothing(tmp_path):
    cls, model = _model("bert")
    model.save_pretrained(tmp_path)
    assert _plain_load(cls, tmp_path) == []


@pytest.mark.parametrize("method", ["qk_norm", "sigma_reparam"])
@pytest.mark.parametrize(("saved", "loaded"), [("bert", "bert-head"), ("bert-head", "bert")])
def test_condattn_loads_between_base_and_head(tmp_path, transformers_log, method, saved, loaded):
    """A checkpoint of BertModel loads into BertForSequenceClassification and back (keys matched through
    base_model_prefix): the encoder's outputs are equal, and transformers' report names the head's keys only."""
    _, model = _model(saved)
    condattn.apply_conditioning(model, method)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    model.train()
    model(ids)  # (σReparam: a training step moves v)
    model.eval()
    model.save_pretrained(tmp_path)
    cls, _ = _model(loaded)
    transformers_log.set_level(logging.INFO, logger="transformers.modeling_utils")  # (4.x: a head's keys left
    # over go to INFO)
    transformers_log.clear()
    out = from_pretrained(cls, tmp_path)
    base = lambda m: getattr(m, m.base_model_prefix, m)  # noqa: E731
    # (one encoder, two classes: its forward may round differently; measured up to 4 ulps of the hidden states' scale)
    assert_close_to_scale(base(out)(ids).last_hidden_state, base(model)(ids).last_hidden_state, ulps=32)
    text = "\n".join(r.getMessage().replace(str(tmp_path), "<path>") for r in transformers_log.records)
    assert "classifier.weight" in text and "sigma_" not in text and "condattn_" not in text, text  # (the path
    # names the test, condattn_ included; 4.x logs the keys on the path's line, 5.x below it)


@pytest.mark.parametrize("method", ["qk_norm", "sigma_reparam"])
def test_condattn_loader_reports_none_of_the_keys_it_restores(tmp_path, transformers_log, method):
    cls, model = _model("bert")
    condattn.apply_conditioning(model, method)
    model.save_pretrained(tmp_path)
    transformers_log.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no PlainLoadWarning from the loader that keeps the method)
        loaded = from_pretrained(cls, tmp_path)
    assert not [r for r in transformers_log.records if "LOAD REPORT" in r.getMessage()
                or "were not used" in r.getMessage()]
    assert condattn.conditioning_report(loaded).method == method
    cls.from_pretrained(tmp_path)  # a plain load still reports the keys it dropped
    assert any("UNEXPECTED" in r.getMessage() or "were not used" in r.getMessage() for r in transformers_log.records)
