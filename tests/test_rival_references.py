"""The 2025 rivals against their reference code, numerically, on the same weights and inputs: the output gate against
timm's `Attention(gated=True)` and transformers' Qwen3-Next attention, soft-capping against Gemma 2's
`attn_logit_softcapping`, the attention sink against GPT-OSS's attention function, QK-clip against Megatron-LM's
`clip_qk` logic (restated), and the trainer's call of the per-step hook."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import condattn

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(pad: bool = True):
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    if pad:
        mask[1, 5:] = 0  # (padding: the mask path of each attention function)
    return ids, mask


# ---------------------------------------------------------------- gated attention


def test_gate_is_timms_gated_attention():
    """On timm's Attention the gate goes in its own slot: the module timm builds with gated=True, the same
    state_dict keys and, with the same weights, the same outputs and gradients, to the bit."""
    from timm.layers import Attention

    torch.manual_seed(0)
    ours, theirs = Attention(32, num_heads=4, qkv_bias=True), Attention(32, num_heads=4, qkv_bias=True, gated=True)
    rep = condattn.apply_conditioning(ours, "gated_attention")
    assert "native gate" in rep.entries[0].detail
    assert set(ours.state_dict()) == set(theirs.state_dict()) and ours.gate.bias is not None
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    out_o, out_t = ours(x), theirs(x)
    assert torch.equal(out_o, out_t)
    out_o.square().sum().backward()
    out_t.square().sum().backward()
    grads = dict(theirs.named_parameters())
    assert all(torch.equal(p.grad, grads[n].grad) for n, p in ours.named_parameters())


def _qwen_pair():
    import transformers as tf
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention

    dims = dict(vocab_size=50, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                intermediate_size=64, attention_bias=False, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    ref = Qwen3NextAttention(tf.Qwen3NextConfig(num_hidden_layers=1, **dims), layer_idx=0).eval()
    ours = Qwen3Attention(tf.Qwen3Config(num_hidden_layers=1, **dims), layer_idx=0).eval()
    return ref, ours


def test_gate_is_qwen3_next_attention():
    """Qwen3-Next's attention is Qwen3's with a gate in the second half of each head's q_proj rows: Qwen3's attention
    with gated_attention, its q rows and gate set from Qwen3-Next's, gives Qwen3-Next's output (its RMSNorms are
    (1 + w) with w = 0 at init, Qwen3's w with w = 1: the same norm)."""
    ref, ours = _qwen_pair()
    rep = condattn.apply_conditioning(ours, "gated_attention")
    assert rep.count("gated_attention") == 1
    d, h = 8, 4
    w = ref.q_proj.weight.detach().view(h, 2 * d, -1)
    with torch.no_grad():
        ours.q_proj.weight.copy_(w[:, :d].reshape(h * d, -1))
        ours.condattn_gate.weight.copy_(w[:, d:].reshape(h * d, -1))
        for name in ("k_proj", "v_proj", "o_proj"):
            getattr(ours, name).weight.copy_(getattr(ref, name).weight)
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3))
    angles = torch.arange(6.0)[:, None] * torch.linspace(0.1, 1.0, d)[None]
    pos = (angles.cos()[None].expand(2, -1, -1), angles.sin()[None].expand(2, -1, -1))
    out_ref, _ = ref(x, pos, None)
    out_ours, _ = ours(x, pos, None)
    torch.testing.assert_close(out_ours, out_ref, rtol=1e-5, atol=1e-6)


def test_headwise_gate_is_one_sigmoid_per_head():
    from timm.layers import Attention

    torch.manual_seed(0)
    m = Attention(32, num_heads=4)
    base = copy.deepcopy(m)
    rep = condattn.apply_conditioning(m, "gated_attention", gate="headwise")
    assert m.condattn_gate.out_features == 4 and "headwise" in rep.entries[0].detail
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    seen = {}
    base.proj.register_forward_pre_hook(lambda mod, a: seen.update(o=a[0]))
    base(x)
    g = torch.sigmoid(m.condattn_gate(x)).repeat_interleave(8, dim=-1)
    torch.testing.assert_close(m(x), base.proj(seen["o"] * g))


# ---------------------------------------------------------------- soft-capping: Gemma 2


def test_softcap_is_gemma2_attn_logit_softcapping():
    """A Gemma 2 model without soft-capping, given softcap, equals the same model with attn_logit_softcapping (its
    eager attention), with padding, grouped-query attention and its sliding-window layers; gradients too."""
    import transformers as tf

    cap = 0.5  # (small: the tiny model's logits pass it, so the tanh bends)
    torch.manual_seed(0)
    ref = tf.Gemma2Model(tf.Gemma2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, intermediate_size=64,
                                         query_pre_attn_scalar=1, initializer_range=0.2,  # (logits of ±1 or so)
                                         attn_logit_softcapping=cap, attn_implementation="eager")).eval()
    ours = copy.deepcopy(ref)
    ours.config.attn_logit_softcapping = None
    for layer in ours.layers:
        layer.self_attn.attn_logit_softcapping = None
    plain = ours(_ids()[0], attention_mask=_ids()[1]).last_hidden_state
    rep = condattn.apply_conditioning(ours, "softcap", softcap_cap=cap)
    assert rep.count("softcap") == 2 and "explicit softmax" in rep.entries[0].detail
    ids, mask = _ids()
    out_ref = ref(ids, attention_mask=mask).last_hidden_state
    out_ours = ours(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out_ours, out_ref, rtol=1e-5, atol=1e-5)
    assert (out_ours - plain).abs().max() > 1e-3  # (the cap acts)
    out_ref.sum().backward()
    out_ours.sum().backward()
    grads = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads[n].grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="adds its own attn_logit_softcapping"):
        condattn.apply_conditioning(ref, "softcap")


def test_explicit_attention_is_gemma2s_eager_function_and_sdpa():
    """The explicit computation against Gemma 2's eager_attention_forward (cap, GQA, additive mask) and, with no cap
    and no sink, against F.scaled_dot_product_attention (bool mask, is_causal, enable_gqa, scale)."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    from condattn.conditioning.methods.logits import explicit_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 5, 8, generator=g) for h in (4, 2, 2))
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.rand(2, 1, 5, 5, generator=g) < 0.3, torch.finfo(torch.float).min)
    module = SimpleNamespace(num_key_value_groups=2, head_dim=8, training=False)
    ref, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.3, softcap=2.0)
    ours = explicit_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True, cap=2.0)
    torch.testing.assert_close(ours.transpose(1, 2), ref)
    keep = torch.rand(2, 1, 5, 5, generator=g) > 0.3
    keep[..., 0] = True
    F = torch.nn.functional
    for kw in (dict(attn_mask=keep), dict(is_causal=True), dict(scale=0.2, enable_gqa=True)):
        kk, vv = (k, v) if kw.get("enable_gqa") else (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
        torch.testing.assert_close(explicit_attention(q, kk, vv, **kw), F.scaled_dot_product_attention(q, kk, vv, **kw))


def test_softcap_on_timm_replaces_the_fused_kernel():
    """timm's Attention calls F.scaled_dot_product_attention (fused_attn=False is switched on): its output is
    softmax(cap·tanh(q kᵀ·scale / cap))·V of its own q, k, v."""
    from timm.layers import Attention

    torch.manual_seed(0)
    m = Attention(32, num_heads=4)
    m.fused_attn = False
    base = copy.deepcopy(m)
    rep = condattn.apply_conditioning(m, "softcap", softcap_cap=0.3)
    assert m.fused_attn and "fused_attn=False → True" in rep.entries[0].detail
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    q, k, v = base.qkv(x).view(2, 5, 3, 4, 8).permute(2, 0, 3, 1, 4)
    logits = 0.3 * torch.tanh(q @ k.transpose(-2, -1) * 8**-0.5 / 0.3)
    expected = base.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 32))
    torch.testing.assert_close(m(x), expected)
    condattn.remove_conditioning(m)
    assert m.fused_attn is False and "forward" not in m.__dict__


# ---------------------------------------------------------------- attention sink: GPT-OSS


def _llama():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32)
    return tf.LlamaModel(cfg).eval()


def test_attention_sink_is_gpt_oss_attention():
    """A Llama with attention_sink equals the same Llama whose attention is GPT-OSS's own eager_attention_forward
    (registered as an attention function) reading the same sinks: outputs and gradients, padding and GQA included."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    AttentionInterface.register("gpt_oss_reference", eager_attention_forward)
    AttentionMaskInterface.register("gpt_oss_reference", eager_mask)
    ours = _llama()
    ref = copy.deepcopy(ours)
    rep = condattn.apply_conditioning(ours, "attention_sink")
    assert rep.count("attention_sink") == 2
    g = torch.Generator().manual_seed(4)
    for layer, ref_layer in zip(ours.layers, ref.layers):
        with torch.no_grad():
            layer.self_attn.condattn_sinks.copy_(torch.randn(4, generator=g))
        ref_layer.self_attn.sinks = nn.Parameter(layer.self_attn.condattn_sinks.detach().clone())
    ref.config._attn_implementation = "gpt_oss_reference"
    ids, mask = _ids()
    out_ours = ours(ids, attention_mask=mask).last_hidden_state
    out_ref = ref(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out_ours, out_ref, rtol=1e-5, atol=1e-5)
    out_ours.sum().backward()
    out_ref.sum().backward()
    for layer, ref_layer in zip(ours.layers, ref.layers):
        torch.testing.assert_close(layer.self_attn.condattn_sinks.grad, ref_layer.self_attn.sinks.grad)
        torch.testing.assert_close(layer.self_attn.q_proj.weight.grad, ref_layer.self_attn.q_proj.weight.grad)


# ---------------------------------------------------------------- QK-clip: Megatron-LM's clip_qk


# A clipped weight is w·η^α, ours and Megatron's restated each computing η^α with its own pow (a Python float's, a
# float32 tensor's): the factors may differ by an ulp or two, so each weight by a few float32 ulps of itself.
CLIP_RTOL = 4 * torch.finfo(torch.float32).eps


def megatron_clip(w_q: torch.Tensor, w_k: torch.Tensor, max_logits: torch.Tensor, groups: int, tau: float,
                  alpha: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-LM SelfAttention.clip_qk / _clip_linear_qkv, restated: the largest logit of each query group
    (max over its heads); η = min(1, τ / that) per group; each group's W_Q rows × η^α, its W_K rows × η^(1−α);
    weights only; nothing when no group passed τ."""
    grouped = max_logits.view(groups, -1).amax(1)
    if not bool((grouped > tau).any()):
        return w_q, w_k
    eta = torch.clamp(tau / grouped, max=1.0).view(groups, 1, 1)
    q = w_q.view(groups, -1, w_q.shape[-1]) * eta.pow(alpha)
    k = w_k.view(groups, -1, w_k.shape[-1]) * eta.pow(1 - alpha)
    return q.reshape(w_q.shape), k.reshape(w_k.shape)


def _vit_logits(model, x):
    """Each block's per-head q kᵀ·scale, from its own qkv (independently of the method)."""
    out = []
    for blk in model.blocks:
        a = blk.attn
        hooks = [a.qkv.register_forward_hook(lambda m, i, o: out.append(o))]
        model(x)
        hooks[0].remove()
    maxima = []
    for blk, qkv in zip(model.blocks, out[: len(model.blocks)]):
        h, d = blk.attn.num_heads, blk.attn.head_dim
        q, k, _ = qkv.view(*qkv.shape[:2], 3, h, d).permute(2, 0, 3, 1, 4)
        maxima.append((q @ k.transpose(-2, -1) * d**-0.5).amax(dim=(0, 2, 3)).detach())
    return maxima


def _vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                             num_heads=4, depth=2, num_classes=10)


def test_qk_clip_is_megatrons_clip_and_caps_the_logits():
    """A training forward records each head's largest logit (as computed from the block's own q and k); after the
    step, the weights are Megatron's clip of them, and the same inputs' largest logits are τ at the clipped heads and
    unchanged at the others."""
    model, x = _vit(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    before = _vit_logits(model, x)
    tau = float(torch.cat(before).median())  # (half the heads pass it)
    rep = condattn.apply_conditioning(model, "qk_clip", qk_clip_tau=tau)
    assert rep.count("qk_clip") == 2 and "fused kernel kept" in rep.entries[0].detail
    ref = copy.deepcopy(model)
    model.train()
    model(x)
    rules = [b.attn.__dict__["_condattn_logits"] for b in model.blocks]
    for rule, expected in zip(rules, before):  # (two computations of one logit: equal to float32 rounding)
        torch.testing.assert_close(rule.max_logits, expected)
    recorded = [rule.max_logits.clone() for rule in rules]
    condattn.after_optimizer_step(model)
    assert all(r.max_logits is None for r in rules)  # (each step is judged by its own forwards)
    # Megatron's clip restated from the logits the method recorded (from the test's own logits η could differ in
    # the last bit); η^α is a pow on each side, which kernels round differently: CLIP_RTOL
    for blk, ref_blk, seen in zip(model.blocks, ref.blocks, recorded):
        w = ref_blk.attn.qkv.weight.detach()
        q, k = megatron_clip(w[:64], w[64:128], seen, groups=4, tau=tau)
        torch.testing.assert_close(blk.attn.qkv.weight[:64], q, rtol=CLIP_RTOL, atol=0)
        torch.testing.assert_close(blk.attn.qkv.weight[64:128], k, rtol=CLIP_RTOL, atol=0)
        assert torch.equal(blk.attn.qkv.weight[128:], w[128:])  # (W_V untouched: the same bits)
    after = _vit_logits(model, x)
    clipped = before[0] > tau
    assert clipped.any() and not clipped.all()
    torch.testing.assert_close(after[0][clipped], torch.full_like(after[0][clipped], tau))
    torch.testing.assert_close(after[0][~clipped], before[0][~clipped])


def test_qk_clip_groups_query_heads_as_megatron_under_gqa():
    """Under grouped-query attention (Llama, 4 query heads on 2 key heads) the clip of each key head and of its
    query heads comes from the group's largest logit, as in Megatron's grouped clip."""
    model = _llama()
    rep = condattn.apply_conditioning(model, "qk_clip", qk_clip_tau=0.05)
    ref = copy.deepcopy(model)
    model.train()
    model(*_ids())
    seen = [layer.self_attn.__dict__["_condattn_logits"].max_logits.clone() for layer in model.layers]
    condattn.after_optimizer_step(model)
    for layer, ref_layer, m in zip(model.layers, ref.layers, seen):
        q, k = megatron_clip(ref_layer.self_attn.q_proj.weight.detach(), ref_layer.self_attn.k_proj.weight.detach(),
                             m, groups=2, tau=0.05)
        torch.testing.assert_close(layer.self_attn.q_proj.weight, q, rtol=CLIP_RTOL, atol=0)
        torch.testing.assert_close(layer.self_attn.k_proj.weight, k, rtol=CLIP_RTOL, atol=0)
    assert rep.count("qk_clip") == 2


def test_trainer_calls_the_methods_after_step_hook(monkeypatch):
    """The step loop calls condattn.after_optimizer_step on the unwrapped model after each optimizer step that was
    taken (not after one fp16 skipped)."""
    from condattn.engine import loop

    calls = []
    monkeypatch.setattr(loop, "after_optimizer_step", lambda model: calls.append(model))
    raw = nn.Linear(2, 2)
    opt = torch.optim.SGD(raw.parameters(), lr=0.1)
    acc = SimpleNamespace(clip_grad_norm_=None, optimizer_step_was_skipped=False)
    run = SimpleNamespace(accelerator=acc, optimizer=opt, scheduler=SimpleNamespace(step=lambda: None), raw=raw)
    step = loop.StepLoop.__new__(loop.StepLoop)
    step.run, step.clip = run, None
    step._optimizer_step()
    acc.optimizer_step_was_skipped = True
    step._optimizer_step()
    assert calls == [raw]
