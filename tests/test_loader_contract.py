"""condattn's loader keeps transformers' loading contract (conditioning/checkpoint.py, api.from_pretrained): the
weights a method adds load through transformers' own loading, for BERT, GPT-2, Llama, and the zoo's transformers
families whose classes have a conversion mapping (ViT, DETR), and every method that adds weights:

- a conditioned checkpoint saves and reloads exactly (ViT's saved names are the legacy ones, its method keys with them);
- `output_loading_info=True`, `dtype=torch.bfloat16` and a sharded checkpoint (`max_shard_size`) give what
  transformers alone gives for the same checkpoint;
- a new head (`ignore_mismatched_sizes=True`) is drawn anew and the method's weights are kept;
- a checkpoint that lacks the method's weights gives transformers' missing-key report and one condattn warning naming
  the method; `strict=True` raises instead.
Tiny models (hidden 32, 2 layers), written to tmp_path."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

import condattn
from condattn.conditioning import MethodWeightsMissing, from_pretrained, method_spec
from condattn.conditioning.spec import method_of_parts

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]
tf = pytest.importorskip("transformers")
METHODS = [m for m in condattn.conditioning.METHODS if method_spec(m).adds_keys]
FAMILIES = ("bert", "gpt2", "llama", "vit", "detr")
MAPPED = ("vit", "detr")  # the families whose classes have a conversion mapping of their own (checked below)
CAUSAL = ("gpt2", "llama")  # (CET is refused on a causal decoder)
_RENAMES = int(tf.__version__.split(".")[0]) >= 5  # (transformers 4's ViT keeps the legacy names in memory too)
CASES = [(f, m) for f in FAMILIES for m in METHODS if not (f in CAUSAL and "embedded" in m)]
# a composite's added weights are its qk_norm's: the head and missing-weight cases take them on one family of each kind
FEWER = [(f, m) for f, m in CASES if not method_spec(m).parts or f in ("bert", "vit")]


def _config(family: str, labels: int = 3):
    if family == "detr":  # (its backbone is timm's; condattn's DETR layout reads transformers 5's attention classes)
        pytest.importorskip("timm")
        if not _RENAMES:
            pytest.skip("condattn's DETR layout needs transformers 5")
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    if family == "bert":
        return tf.BertConfig(vocab_size=99, max_position_embeddings=64, num_labels=labels, **small)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, num_labels=labels,
                             bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "llama":
        return tf.LlamaConfig(vocab_size=99, num_key_value_heads=2, max_position_embeddings=64, num_labels=labels,
                              pad_token_id=0, **small)
    if family == "vit":
        return tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, num_labels=labels, **small)
    return tf.DetrConfig(use_timm_backbone=True, backbone="test_resnet", use_pretrained_backbone=False,
                         num_labels=labels, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, num_queries=5)


def _head_class(family: str):
    return {"bert": tf.BertForSequenceClassification, "gpt2": tf.GPT2ForSequenceClassification,
            "llama": tf.LlamaForSequenceClassification, "vit": tf.ViTForImageClassification,
            "detr": tf.DetrForObjectDetection}[family]


def _inputs(family: str) -> dict:
    g = torch.Generator().manual_seed(1)
    if family in ("vit", "detr"):
        size = 16 if family == "vit" else 64
        return {"pixel_values": torch.rand(2, 3, size, size, generator=g)}
    return {"input_ids": torch.randint(1, 99, (2, 7), generator=g)}


def _logits(model, family: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**_inputs(family)).logits


def _attaching(method: str) -> str:
    """The method the loader applies: its parts that attach (an init-only part's effect is in the saved weights)."""
    return method_of_parts([p for p in method_spec(method).parts or (method,) if not method_spec(p).once({})])


def _conditioned(family: str, method: str, labels: int = 3):
    """A head model conditioned with `method`, every weight (the method's included) moved off its init, and a
    training forward taken (σReparam's stored vector moves)."""
    torch.manual_seed(0)
    model = _head_class(family)(_config(family, labels))
    plain = set(model.state_dict())
    condattn.apply_conditioning(model, method)
    added = set(model.state_dict()) - plain
    assert added
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.train()
    model(**_inputs(family))
    return model.eval(), added


def _equal_state(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k, v in sa.items():
        assert v.dtype == sb[k].dtype and torch.equal(v, sb[k]), k


def _saved_keys(path) -> set[str]:
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else \
        ["model.safetensors"]
    keys = set()
    for f in files:
        with safe_open(str(path / f), "pt") as sf:
            keys |= set(sf.keys())
    return keys


def test_the_mapped_families_rename_keys_on_save():
    """ViT and DETR have conversion mappings of their own (beyond transformers' legacy renamings), so the contract
    below runs through transformers' key renaming; BERT, GPT-2 and Llama have none. (transformers 4 has no conversion
    mappings: its ViT keeps the legacy names in memory too.)"""
    get_model_conversion_mapping = pytest.importorskip("transformers.conversion_mapping").get_model_conversion_mapping

    legacy = len(get_model_conversion_mapping(tf.BertModel(_config("bert"))))
    for family in FAMILIES:
        with torch.device("meta"):
            model = _head_class(family)(_config(family))
        own = len(get_model_conversion_mapping(model)) > legacy
        assert own == (family in MAPPED), family


@pytest.mark.parametrize(("family", "method"), CASES)
def test_a_conditioned_checkpoint_reloads_exactly(tmp_path, family, method):
    model, added = _conditioned(family, method)
    cls = type(model)
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").exists()
    if family == "vit" and _RENAMES:  # saved under the legacy names: the method's keys renamed with the rest
        saved = _saved_keys(tmp_path / "one")
        assert not any(k.startswith("layers.") for k in saved) and not added & saved
        assert any(".encoder.layer.0.attention.attention.query." in k for k in saved)
    plain_info = cls.from_pretrained(tmp_path / "one", output_loading_info=True)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no PlainLoadWarning, no MethodWeightsMissing)
        loaded, info = from_pretrained(cls, tmp_path / "one", output_loading_info=True)
        sharded = from_pretrained(cls, tmp_path / "shards")
    assert condattn.conditioning_report(loaded).method == _attaching(method)
    _equal_state(loaded, model)
    _equal_state(sharded, model)
    assert info.keys() == plain_info.keys() and not any(info.values()), info  # (transformers': every key taken)
    assert set(plain_info["unexpected_keys"]) >= {k for k in added if "." in k}  # (the plain load drops them)
    torch.testing.assert_close(_logits(loaded, family), _logits(model, family), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["bert", "vit"])
def test_bfloat16_loads_as_transformers_loads(tmp_path, family, method):
    """`dtype=torch.bfloat16`: every weight as transformers alone loads it, the method's cast the same way."""
    model, added = _conditioned(family, method)
    cls = type(model)
    model.save_pretrained(tmp_path)
    plain = cls.from_pretrained(tmp_path, dtype=torch.bfloat16).state_dict()
    loaded = from_pretrained(cls, tmp_path, dtype=torch.bfloat16).state_dict()
    assert loaded.keys() == plain.keys() | added
    for k, v in loaded.items():
        want = plain[k] if k in plain else model.state_dict()[k].to(torch.bfloat16)
        assert v.dtype == want.dtype and torch.equal(v, want), k


@pytest.mark.parametrize(("family", "method"), FEWER)
def test_a_new_head_keeps_the_methods_weights(tmp_path, family, method):
    model, added = _conditioned(family, method, labels=3)
    cls = type(model)
    model.save_pretrained(tmp_path)
    plain_info = cls.from_pretrained(tmp_path, num_labels=2, ignore_mismatched_sizes=True,
                                     output_loading_info=True)[1]
    loaded, info = from_pretrained(cls, tmp_path, num_labels=2, ignore_mismatched_sizes=True,
                                   output_loading_info=True)
    assert info["mismatched_keys"] == plain_info["mismatched_keys"] and info["mismatched_keys"]
    assert not info["missing_keys"] and not info["unexpected_keys"]
    saved, got = model.state_dict(), loaded.state_dict()
    heads = {k if isinstance(k, str) else k[0] for k in info["mismatched_keys"]}  # (4.x: names; 5.x: with shapes)
    assert all(got[k].shape != saved[k].shape for k in heads), heads
    for k, v in saved.items():
        if k not in heads:
            assert torch.equal(got[k], v), k


def _without(path, keys: set[str]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k not in keys}, str(path / "model.safetensors"),
              metadata={"format": "pt"})


@pytest.mark.parametrize(("family", "method"), FEWER)
def test_a_checkpoint_without_the_methods_weights(tmp_path, transformers_log, family, method):
    """The config records the method, the weights lack what it adds (found as the keys a save of the same model
    without the method does not write: no names of ours): transformers' missing-key report, one condattn warning
    naming the method, and the method's weights as the method initialises them on the loaded model."""
    model, added = _conditioned(family, method)
    cls = type(model)
    model.save_pretrained(tmp_path / "cond")
    torch.manual_seed(0)
    cls(_config(family)).save_pretrained(tmp_path / "base")  # (the same model without the method)
    _without(tmp_path / "cond", _saved_keys(tmp_path / "cond") - _saved_keys(tmp_path / "base"))
    transformers_log.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded, info = from_pretrained(cls, tmp_path / "cond", output_loading_info=True)
        reference = cls.from_pretrained(tmp_path / "cond")  # (a plain load: PlainLoadWarning)
    ours = [str(w.message) for w in caught if w.category is MethodWeightsMissing]
    assert len(ours) == 1 and "\n" not in ours[0] and method in ours[0], ours
    assert set(info["missing_keys"]) == added and not info["unexpected_keys"]
    report = "\n".join(r.getMessage() for r in transformers_log.records)
    assert "MISSING" in report or "newly initialized" in report, report  # (transformers 5's report, 4's)
    assert all(".".join(k.split(".")[-2:]) in report for k in added), report
    with pytest.raises(ValueError, match=f"records {re.escape(method)} .*strict=True"):
        from_pretrained(cls, tmp_path / "cond", strict=True)
    # the method's own initialisation on the loaded weights: what applying it to a plain load gives
    condattn.apply_conditioning(reference, _attaching(method))
    ref, got = reference.state_dict(), loaded.state_dict()
    assert ref.keys() == got.keys()
    for k in sorted(ref):
        if k.endswith("condattn_gate.weight"):  # drawn N(0, std(W_Q)²) as the method draws it (transformers' own
            # init would draw N(0, 0.02²); W_Q's std is about 0.054 here)
            assert abs(float(got[k].std() / ref[k].std()) - 1) < 0.25, k
        else:
            assert torch.equal(got[k], ref[k]), k


@pytest.mark.parametrize(("family", "method"), [("vit", "gated_attention"), ("bert", "sigma_reparam"),
                                                ("llama", "attention_sink"), ("bert", "spectral")])
def test_a_plain_load_says_what_it_loses(tmp_path, family, method):
    """The plain load's one line says what this checkpoint loses: the method's weights it left unloaded (counted,
    one named) and the forward without the method; transformers' return is unchanged."""
    torch.manual_seed(0)
    model = _head_class(family)(_config(family))
    plain_keys = set(model.state_dict())
    condattn.apply_conditioning(model, method)
    added = set(model.state_dict()) - plain_keys
    model.save_pretrained(tmp_path)
    cls = type(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = cls.from_pretrained(tmp_path)
        _, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    lines = [str(w.message) for w in caught if type(w.message).__name__ == "PlainLoadWarning"]
    assert len(lines) == 2 and lines[0] == lines[1] and "\n" not in lines[0], lines
    assert isinstance(plain, cls) and set(info["unexpected_keys"]) == added
    assert "the forward runs without it" in lines[0]
    assert f"condattn.conditioning.from_pretrained({cls.__name__}, path)" in lines[0]
    if added:
        assert f"this checkpoint's {len(added)}, e.g. {sorted(added)[0]}, are left unloaded" in lines[0]
    else:
        assert "every weight loads" in lines[0]


def test_an_auto_class_loads_the_class_it_resolves_to(tmp_path):
    """`from_pretrained(AutoModelForImageClassification, path)`: transformers resolves the class, and the model it
    builds is the one conditioned before its weights load."""
    model, _ = _conditioned("vit", "qk_norm")
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = from_pretrained(tf.AutoModelForImageClassification, tmp_path)
    assert type(loaded) is tf.ViTForImageClassification
    assert condattn.conditioning_report(loaded).method == "qk_norm"
    _equal_state(loaded, model)


def test_a_config_given_with_a_state_dict_and_no_path(tmp_path):
    """transformers' `from_pretrained(None, config=..., state_dict=...)` (its test_from_pretrained_no_checkpoint): the
    config given records the method, and the state dict's method weights load."""
    model, _ = _conditioned("bert", "sigma_reparam")
    loaded = from_pretrained(type(model), None, config=model.config, state_dict=model.state_dict())
    assert condattn.conditioning_report(loaded).method == "sigma_reparam"
    _equal_state(loaded, model)


def test_a_class_that_loads_its_own_way_is_refused_in_one_line(tmp_path):
    """A class whose from_pretrained never reaches transformers' own (so the model is built without the loader
    seeing it) is refused, naming the class and the way around, not returned without its method."""
    from safetensors.torch import load_file

    class OwnLoad(tf.BertModel):
        @classmethod
        def from_pretrained(cls, path, output_loading_info=False, **kwargs):
            model = cls(tf.BertConfig.from_pretrained(path))
            model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
            return (model, {"missing_keys": []}) if output_loading_info else model

    model = tf.BertModel(_config("bert"))
    condattn.apply_conditioning(model, "qk_norm")
    model.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="OwnLoad was built without .*apply_conditioning, then load_state_dict"):
        from_pretrained(OwnLoad, tmp_path)
