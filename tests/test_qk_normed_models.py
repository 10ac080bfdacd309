"""Models that already carry q/k norms (a transformers Qwen3, a timm ViT built with qk_norm=True): every registered
method either patches them and trains a step, or refuses in one line and leaves the model as it was. And the rules
of combining methods: a method named twice, or two that conflict, are refused in one line."""

from __future__ import annotations

import pytest
import torch

import condattn
from condattn.conditioning import METHODS, composite, method_spec

pytestmark = pytest.mark.usefixtures("one_thread")


class Qwen3(torch.nn.Module):
    """A tiny transformers Qwen3 (q_norm / k_norm per head, GQA, causal), built offline, returning its logits."""

    def __init__(self):
        super().__init__()
        import transformers as tf

        torch.manual_seed(0)
        cfg = tf.Qwen3Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=32)
        self.lm = tf.Qwen3ForCausalLM(cfg)

    def forward(self, ids):
        return self.lm(ids, use_cache=False).logits


def qk_vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                             num_heads=2, depth=2, num_classes=10, qk_norm=True)


FAMILIES = {
    "qwen3": (Qwen3, lambda: torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3))),
    "vit_qk_norm": (qk_vit, lambda: torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))),
}
OPTIONS = {"embedded": {"causal_leak": "accept"}, "spectral+embedded": {"causal_leak": "accept"},
           "qk_norm+embedded": {"causal_leak": "accept"}, "softcap": {"softcap_cap": 1.0}}
# the refusals these models must give, by their reason (a method not listed must patch)
REFUSES = {
    ("qk_norm", "qwen3"): "already has q/k norms", ("qk_norm", "vit_qk_norm"): "already has q/k norms",
    ("qk_clip", "qwen3"): "q_norm normalises q/k", ("qk_clip", "vit_qk_norm"): "q_norm normalises q/k",
    ("ns_attention", "qwen3"): "causal",
    ("embedded", "qwen3"): "cannot locate the first transformer block",
    ("spectral+embedded", "qwen3"): "cannot locate the first transformer block",
}
for fam in FAMILIES:
    for m in ("qk_norm+spectral", "qk_norm+embedded", "qk_norm+conditioned_init"):
        REFUSES.setdefault((m, fam), "already has q/k norms")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"])
def test_every_method_patches_a_qk_normed_model_or_refuses_in_one_line(method, family):
    build, inputs = FAMILIES[family]
    model, x = build(), inputs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    why = REFUSES.get((method, family))
    if why is not None:
        with pytest.raises(ValueError, match=why) as err:
            condattn.apply_conditioning(model, method, **OPTIONS.get(method, {}))
        assert "\n" not in str(err.value) and condattn.conditioning_report(model) is None
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        return
    rep = condattn.apply_conditioning(model, method, **OPTIONS.get(method, {}))
    if method_spec(method).per_layer:
        rep.check(attention_layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    loss = model(x).float().square().mean()
    loss.backward()
    opt.step()
    condattn.after_optimizer_step(model)
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters())


def test_a_method_named_twice_or_two_that_conflict_are_refused():
    with pytest.raises(ValueError, match="'qk_norm' is named twice") as err:
        composite("qk_norm+qk_norm", "qk_norm", "qk_norm")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="qk_clip conflicts with qk_norm: QK-norm normalises q and k") as err:
        composite("qk_norm+qk_clip", "qk_norm", "qk_clip")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["gated_attention", "softcap", "attention_sink", "qk_clip", "qk_norm+spectral"])
def test_applying_twice_is_refused_in_one_line(method):
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                              num_heads=2, depth=2, num_classes=10)
    condattn.apply_conditioning(model, method)
    with pytest.raises(RuntimeError, match="already conditioned") as err:
        condattn.apply_conditioning(model, method)
    assert "\n" not in str(err.value)
