"""scripts/transformers_common.py, the runner of transformers' common model tests under each method: its model
classes are conditioned when built (from_pretrained included) under the original name, a refused method is listed
with its reason, and the report names each failure beyond the unconditioned model's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import condattn

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("transformers")
_PATH = Path(__file__).resolve().parent.parent / "scripts" / "transformers_common.py"
_spec = importlib.util.spec_from_file_location("transformers_common", _PATH)
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


@pytest.mark.slow  # builds, saves and reloads a BERT: seconds (the first conditioning in a process)
def test_a_conditioned_class_keeps_its_name_and_conditions_every_model_it_builds(tmp_path):
    import transformers as tf

    cls = runner.conditioned(tf.BertModel, "qk_norm")
    assert cls.__name__ == "BertModel" and issubclass(cls, tf.BertModel)
    torch.manual_seed(0)
    model = cls(runner.Tester(None, "bert").get_config())
    assert condattn.conditioning_report(model).method == "qk_norm"
    model.save_pretrained(tmp_path)
    assert condattn.conditioning_report(cls.from_pretrained(tmp_path)).method == "qk_norm"


def test_a_conditioned_class_loads_through_condattns_loader(tmp_path, monkeypatch):
    """Its from_pretrained is condattn's loader (once: the loader's own call of the class's from_pretrained is
    transformers'), and ViT's renamed keys, the gate's included, reload exactly."""
    import transformers as tf

    calls = []
    loader = condattn.conditioning.from_pretrained
    monkeypatch.setattr(condattn.conditioning, "from_pretrained", lambda *a, **k: calls.append(a) or loader(*a, **k))
    cls = runner.conditioned(tf.ViTModel, "gated_attention")
    torch.manual_seed(0)
    model = cls(runner.Tester(None, "vit").get_config())
    model.save_pretrained(tmp_path)
    loaded = cls.from_pretrained(tmp_path)
    assert len(calls) == 1 and type(loaded) is cls
    assert condattn.conditioning_report(loaded).method == "gated_attention"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())


def test_a_refused_method_is_listed_with_its_reason():
    assert "causal" in runner.refusal("gpt2", "embedded")
    assert runner.refusal("bert", "embedded") == ""


def test_the_report_names_failures_beyond_the_unconditioned_models(tmp_path):
    results = {("bert", "none"): {"test_a": "failed", "test_b": "passed", "test_c": "skipped"},
               ("bert", "sigma_reparam"): {"test_a": "failed", "test_b": "failed", "test_c": "skipped"}}
    text = runner.report(results, {("bert", "embedded"): "refused: why"}, ["none", "sigma_reparam", "embedded"],
                         ["bert"], "made")
    assert "| `sigma_reparam` | 0 / 2 / 1 |" in text and "| `embedded` | refused |" in text
    assert "`sigma_reparam` fails beyond `none`: `test_b`" in text and "`test_a`" in text.split("none` (")[-1]
