"""Every registered conditioning method keeps one contract, as every layout does (tests/test_layouts.py): forward and
backward, `remove_conditioning` restoring the model to the bit (or refusing, for an init-only method), a state_dict
round trip, deepcopy and pickle, torch.fx and torch.export, and report counts that match the model, each checked
against the facts the method declares in its MethodSpec. A registered method without a case here fails."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import condattn
from condattn.conditioning import METHODS, method_spec
from condattn.conditioning.spec import _METHODS

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]  # compat: scripts/compat.py

DEPTH = 2


def vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                             num_heads=2, depth=DEPTH, num_classes=10).eval()


def images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


class Bert(torch.nn.Module):
    """A tiny transformers BERT returning its last hidden state (so every family's output is one tensor)."""

    def __init__(self):
        super().__init__()
        import transformers as tf

        torch.manual_seed(0)
        self.bert = tf.BertModel(tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=DEPTH,
                                               num_attention_heads=2, intermediate_size=64,
                                               max_position_embeddings=32)).eval()

    def forward(self, ids):
        return self.bert(ids).last_hidden_state


def ids():
    return torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3))


class Llama(torch.nn.Module):
    """A tiny transformers Llama (causal, grouped-query attention) returning its logits."""

    def __init__(self):
        super().__init__()
        import transformers as tf

        torch.manual_seed(0)
        self.lm = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=DEPTH,
                                                      num_attention_heads=4, num_key_value_heads=2,
                                                      intermediate_size=64, max_position_embeddings=32)).eval()

    def forward(self, ids):
        return self.lm(ids, use_cache=False).logits


FAMILIES = {"vit": (vit, images), "bert": (lambda: Bert().eval(), ids), "llama": (lambda: Llama().eval(), ids)}
# (method, family) -> the words of its one-line refusal (tests/test_methods.py holds every refusal of the zoo)
REFUSES = {("ns_attention", "llama"): "causal"}

# method -> its options here: every registered method needs one (test_every_registered_method_has_a_case)
CASES = {
    "none": {},
    "spectral": {"lam": 2.0},
    "embedded": {"causal_leak": "accept"},  # (a permission: nothing on the encoders; Llama is a causal decoder)
    "spectral+embedded": {"lam": 2.0, "causal_leak": "accept"},
    "conditioned_init": {},
    "mimetic_init": {},
    "qk_norm": {},
    "sigma_reparam": {},
    "ns_attention": {},
    "gated_attention": {},
    "softcap": {"softcap_cap": 1.0},  # (a cap the tiny models' logits reach, so that it acts)
    "attention_sink": {},
    "qk_clip": {},
    "qk_norm+spectral": {"lam": 2.0},
    "qk_norm+embedded": {"causal_leak": "accept"},
    "qk_norm+conditioned_init": {},
}
PAIRS = [(m, f) for m in CASES for f in FAMILIES if (m, f) not in REFUSES]  # (the refusals: test_refusals)


@pytest.mark.parametrize(("method", "family"), list(REFUSES))
def test_refusals(method, family):
    model = FAMILIES[family][0]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=REFUSES[method, family]) as err:
        condattn.apply_conditioning(model, method, **CASES[method])
    assert "\n" not in str(err.value) and condattn.conditioning_report(model) is None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def missing_cases(methods, cases) -> list[str]:
    return [m for m in methods if m not in cases]


def test_every_registered_method_has_a_case():
    assert not missing_cases(METHODS, CASES), "registered methods without a contract case: add them to CASES"


def test_a_method_registered_without_a_case_fails(monkeypatch):
    monkeypatch.setitem(_METHODS, "my_new_method", method_spec("none"))
    assert "my_new_method" in METHODS
    assert missing_cases(METHODS, CASES) == ["my_new_method"]
    with pytest.raises(AssertionError, match="without a contract case"):
        test_every_registered_method_has_a_case()


def _patched(method: str, family: str = "vit"):
    build, inputs = FAMILIES[family]
    model = build()
    rep = condattn.apply_conditioning(model, method, **CASES[method])
    return model, inputs(), rep


def _out(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize(("method", "family"), PAIRS)
def test_forward_backward_and_the_declared_facts(method, family):
    base = FAMILIES[family][0]()
    keys = set(base.state_dict())
    model, x, rep = _patched(method, family)
    ms = method_spec(method)
    spec = condattn.conditioning.conditioning_spec(method=method, **CASES[method])
    added = set(model.state_dict()) - keys
    assert bool(added) == ms.adds_keys, sorted(added)[:4]
    assert set(model.state_dict()) >= keys
    # init-only: attaches nothing (a composite of init-only and attaching parts attaches, and is not removable)
    all_once = all(method_spec(p).once(spec.values) for p in spec.parts)
    assert (model._condattn.handles == []) == all_once or method == "none"
    if ms.per_layer:  # one entry or skip per attention layer
        rep.check(attention_layers=DEPTH)
    else:
        rep.check()
    assert ms.table_label and ms.label
    assert bool(ms.cost) != all_once or method == "none"
    model.train()
    out = model(x)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in model.named_parameters():
        if name in added and p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize(("method", "family"), PAIRS)
def test_remove_restores_the_model_to_the_bit(method, family):
    build, inputs = FAMILIES[family]
    base, x = build(), inputs()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    ref = _out(base, x)
    model, x, rep = _patched(method, family)
    spec = condattn.conditioning.conditioning_spec(method=method, **CASES[method])
    if method_spec(method).once(spec.values):
        with pytest.raises(RuntimeError, match="set the weights. values once at application and attached nothing"):
            condattn.remove_conditioning(model)
        return
    condattn.remove_conditioning(model)
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
    assert not any(type(m).__module__.startswith("condattn") for m in model.modules())  # classes swapped back
    assert torch.equal(_out(model, x), ref)
    assert condattn.conditioning_report(model) is None


@pytest.mark.parametrize(("method", "family"), PAIRS)
def test_state_dict_round_trip(method, family):
    """The patched model's state_dict loads (strict) into a fresh model patched the same way: equal outputs."""
    model, x, _ = _patched(method, family)
    with torch.no_grad():  # move every weight, the added ones included, off its init
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    other, _, _ = _patched(method, family)
    other.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(_out(other, x), _out(model, x))


@pytest.mark.parametrize(("method", "family"), PAIRS)
def test_deepcopy_and_pickle(method, family):
    model, x, rep = _patched(method, family)
    ref = _out(model, x)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(_out(clone, x), ref)
        assert condattn.conditioning_report(clone).counts == rep.counts


@pytest.mark.parametrize("method", list(CASES))
def test_torch_fx_traces_the_patch(method):
    model, x, _ = _patched(method)
    graph = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(_out(graph, x), _out(model, x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # about 2 s per method
@pytest.mark.parametrize("method", list(CASES))
def test_torch_export_keeps_the_numbers(method):
    model, x, _ = _patched(method)
    ep = torch.export.export(model, (x,), strict=False)
    torch.testing.assert_close(_out(ep.module(), x), _out(model, x), rtol=1e-5, atol=1e-5)
