"""No shared state (issue 65, item 1): `apply_conditioning` writes the method into a config of the conditioned model's
own. A baseline built from the same transformers config object saves and reloads as a baseline, bit for bit, through
transformers alone and through condattn's loader; the conditioned model's modules all read its own copy."""

from __future__ import annotations

import warnings

import pytest
import torch

import condattn
from condattn.conditioning import from_pretrained
from condattn.conditioning.checkpoint import CONFIG_KEY

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]
tf = pytest.importorskip("transformers")


def _bert_config():
    return tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=32)


def _configs(model) -> set[int]:
    """The ids of the transformers config objects that `model`'s modules hold."""
    return {id(v) for m in model.modules() for v in vars(m).values() if callable(getattr(v, "to_json_string", None))}


@pytest.mark.parametrize("method", ["spectral", "qk_norm", "attention_sink"])
def test_a_baseline_sharing_the_config_saves_and_reloads_as_a_baseline(tmp_path, method):
    cfg = _bert_config()
    torch.manual_seed(0)
    base, cond = tf.BertModel(cfg).eval(), tf.BertModel(cfg).eval()
    condattn.apply_conditioning(cond, method)
    assert not hasattr(cfg, CONFIG_KEY) and base.config is cfg
    assert cond.config is not cfg and getattr(cond.config, CONFIG_KEY)["method"] == method
    assert id(cfg) not in _configs(cond)  # (every layer that kept `self.config` reads the copy)
    base.save_pretrained(tmp_path)
    assert CONFIG_KEY not in (tmp_path / "config.json").read_text()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no PlainLoadWarning, no MethodWeightsMissing)
        loaded = from_pretrained(tf.BertModel, tmp_path)
        plain = tf.BertModel.from_pretrained(tmp_path)
    for model in (loaded, plain):
        assert condattn.conditioning_report(model) is None and not hasattr(model.config, CONFIG_KEY)
        assert model.state_dict().keys() == base.state_dict().keys()
        assert all(torch.equal(v, base.state_dict()[k]) for k, v in model.state_dict().items())
        with torch.no_grad():
            assert torch.equal(model(ids).last_hidden_state, base(ids).last_hidden_state)


def test_remove_gives_the_model_the_config_it_was_built_with():
    cfg = _bert_config()
    model = tf.BertModel(cfg)
    condattn.apply_conditioning(model, "qk_norm")
    assert _configs(model) == {id(model.config)} != {id(cfg)}
    condattn.remove_conditioning(model)
    assert model.config is cfg and _configs(model) == {id(cfg)} and not hasattr(cfg, CONFIG_KEY)


def test_a_method_failing_while_applied_leaves_the_shared_config_in_place(monkeypatch):
    """An error while a method applies (after planning, after the config was copied) leaves every module holding the
    config object it held before."""
    from condattn.conditioning.methods import qk_norm

    def fail(*args, **kwargs):
        raise RuntimeError("applying failed")

    monkeypatch.setattr(qk_norm, "apply_qk_norm", fail)
    cfg = _bert_config()
    model = tf.BertModel(cfg)
    with pytest.raises(RuntimeError, match="applying failed"):
        condattn.apply_conditioning(model, "qk_norm")
    assert model.config is cfg and _configs(model) == {id(cfg)} and not hasattr(cfg, CONFIG_KEY)
