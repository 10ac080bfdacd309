"""The rival methods against their reference code, numerically: QK-norm against timm's own `qk_norm=True` model (three
norm flavours), σReparam against a re-statement of apple/ml-sigma-reparam's logic (fused qkv and per role)."""

from __future__ import annotations

import copy
import re
from functools import partial

import pytest
import torch
from helpers import assert_close_to_scale
from torch import nn

import condattn

pytestmark = pytest.mark.usefixtures("one_thread")

# ---------------------------------------------------------------- QK-norm: timm's qk_norm=True

FLAVOURS = {  # timm ViT norm_layer -> (the class timm's qk_norm=True builds, its eps)
    "layernorm_1e-6": (None, "LayerNorm", 1e-6),  # the plain ViT's default
    "clip_layernorm_1e-5": (partial(nn.LayerNorm, eps=1e-5), "LayerNorm", 1e-5),  # CLIP-style ViTs
    "rmsnorm": ("rmsnorm", "RmsNorm", 1e-6),
}


def _vit_pair(norm_layer):
    import timm

    kw = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2, num_classes=10)
    if norm_layer is not None:
        kw["norm_layer"] = norm_layer
    torch.manual_seed(0)
    ours = timm.create_model("vit_tiny_patch16_224", **kw)
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", qk_norm=True, **kw)
    return ours, theirs


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_qk_norm_is_timms_qk_norm_model(flavour):
    """The patched model is timm's qk_norm=True model of the same norm_layer: the same q/k norm class and eps, the
    same state_dict keys, and with the same weights the same outputs and gradients, to the bit."""
    norm_layer, cls, eps = FLAVOURS[flavour]
    ours, theirs = _vit_pair(norm_layer)
    rep = condattn.apply_conditioning(ours, "qk_norm")
    assert rep.count("qk_norm") == 2 and all("native" in e.detail for e in rep.entries)
    q_norm = ours.blocks[0].attn.q_norm
    assert type(q_norm) is type(theirs.blocks[0].attn.q_norm) and type(q_norm).__name__ == cls
    assert q_norm.eps == theirs.blocks[0].attn.q_norm.eps == eps
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():  # move the norms off their init, so that their weights act
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out_ours, out_theirs = ours(x), theirs(x)
    assert torch.equal(out_ours, out_theirs)
    out_ours.square().sum().backward()
    out_theirs.square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name


def test_qk_norm_override_and_fallback_are_reported():
    ours, _ = _vit_pair("rmsnorm")
    rep = condattn.apply_conditioning(ours, "qk_norm", norm="layernorm")
    assert type(ours.blocks[0].attn.q_norm) is nn.LayerNorm and "norm=layernorm" in rep.entries[0].detail
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                enable_nested_tensor=False)
    with pytest.raises(ValueError, match="reads its projection weight itself"):
        condattn.apply_conditioning(enc, "qk_norm")


def _bert_llama(family: str):
    import transformers as tf

    torch.manual_seed(0)
    if family == "bert":
        cfg = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, layer_norm_eps=1e-12)
        return tf.BertModel(cfg).eval(), "LayerNorm", 1e-12
    cfg = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32, rms_norm_eps=1e-5)
    return tf.LlamaModel(cfg).eval(), "LlamaRMSNorm", 1e-5


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_qk_norm_takes_the_transformers_models_own_norm(family):
    model, cls, eps = _bert_llama(family)
    condattn.apply_conditioning(model, "qk_norm")
    norm = next(m for n, m in model.named_modules() if n.endswith("condattn_q_norm"))
    assert type(norm).__name__ == cls
    assert getattr(norm, "eps", getattr(norm, "variance_epsilon", None)) == eps
    assert norm.weight.shape == (8 if family == "llama" else 16,)


FX_FAMILIES = {  # timm name -> tiny config (image 32)
    "davit_tiny": dict(depths=(1, 1), embed_dims=(32, 64), num_heads=(2, 4), window_size=4),
    "swin_tiny_patch4_window7_224": dict(img_size=32, patch_size=4, window_size=4, embed_dim=32, depths=(2, 2),
                                         num_heads=(2, 4)),
    "xcit_nano_12_p16_224": dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2),
    "vit_tiny_patch16_224": dict(img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2),
}


@pytest.mark.parametrize("name", list(FX_FAMILIES))
def test_qk_norm_parameters_get_gradients_under_fx(name):
    """torch.fx traces the norms (a forward hook on a leaf Linear would be invisible to it): the traced graph
    gives the patched numbers, and every parameter QK-norm adds gets the eager gradient."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **FX_FAMILIES[name]).eval()
    before = set(dict(model.named_parameters()))
    condattn.apply_conditioning(model, "qk_norm")
    added = [n for n in dict(model.named_parameters()) if n not in before]
    assert added
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    graph = torch.fx.symbolic_trace(model)
    eager_out = model(x)
    traced_out = graph(x)
    torch.testing.assert_close(traced_out, eager_out, rtol=0, atol=0)
    eager_out.square().sum().backward()
    traced_out.square().sum().backward()
    traced = dict(graph.named_parameters())
    for n in added:
        g = traced[n].grad
        assert g is not None and g.abs().sum() > 0, n
    copy.deepcopy(model)  # the swapped projection class deep-copies


# ---------------------------------------------------------------- σReparam: apple/ml-sigma-reparam's logic


class RefSigma(nn.Module):
    """The logic of apple/ml-sigma-reparam `vision/layers.py` (SpectralNormedWeight inside SNLinear / SNConv2d),
    restated: one stored right singular vector per matrix, initialised with γ by an SVD; every forward steps left
    first from it, u = normalize(W r), r' = normalize(Wᵀ u), stores r' only in training mode (no_grad or not), and
    returns W / (uᵀ W r') · γ. `row_blocks` splits the weight into matrices of their own (None: one matrix)."""

    def __init__(self, layer: nn.Module, row_blocks: list[slice] | None = None):
        super().__init__()
        self.layer = layer
        self.blocks = row_blocks or [slice(0, layer.weight.shape[0])]
        w = layer.weight.detach().flatten(1)
        self.gammas = nn.ParameterList()
        for i, b in enumerate(self.blocks):
            _, s, vh = torch.linalg.svd(w[b], full_matrices=False)
            self.register_buffer(f"right{i}", vh[0].clone())
            self.gammas.append(nn.Parameter(s[0].clone()))

    def effective(self) -> torch.Tensor:
        w = self.layer.weight.flatten(1)
        parts = []
        for i, b in enumerate(self.blocks):
            wb = w[b]
            with torch.no_grad():
                left = nn.functional.normalize(wb.mv(getattr(self, f"right{i}")), dim=0)
                right = nn.functional.normalize(wb.T.mv(left), dim=0)
                if self.training:
                    getattr(self, f"right{i}").copy_(right)
            sigma = torch.einsum("c,cd,d->", left, wb, right)
            parts.append(wb / sigma * self.gammas[i])
        return torch.cat(parts).view_as(self.layer.weight)

    def forward(self, x):
        if isinstance(self.layer, nn.Conv2d):
            return self.layer._conv_forward(x, self.effective(), self.layer.bias)
        return nn.functional.linear(x, self.effective(), self.layer.bias)


def _vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                             num_heads=2, depth=2, num_classes=10)


def _bert():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return tf.BertModel(cfg)


def _reference(model: nn.Module, family: str, partition: str, all_linear: bool) -> nn.Module:
    """A copy of `model` with the reference's layers in place of the projections σReparam converts."""
    ref = copy.deepcopy(model)
    targets = []
    for name, m in list(ref.named_modules()):
        for child, sub in list(m.named_children()):
            full = f"{name}.{child}" if name else child
            attn = child in ("qkv", "query", "key", "value")
            plain = type(sub) is nn.Linear or (type(sub) is nn.Conv2d and sub.groups == 1)
            if attn or (all_linear and plain):
                blocks = None
                if child == "qkv" and partition == "per_role":
                    d = sub.out_features // 3
                    blocks = [slice(0, d), slice(d, 2 * d), slice(2 * d, 3 * d)]
                targets.append((m, child, RefSigma(sub, blocks), full))
    for m, child, r, _ in targets:
        setattr(m, child, r)
    return ref


def _inputs(family: str):
    g = torch.Generator().manual_seed(2)
    if family == "vit":
        return (torch.randn(4, 3, 32, 32, generator=g),)
    return (torch.randint(0, 50, (4, 12), generator=g),)


def _out(model, family, x):
    out = model(*x)
    return out if family == "vit" else out.last_hidden_state


def _ours_gammas(model):
    return sorted(float(p.detach()) for n, p in model.named_parameters() if "sigma_gamma" in n)


def _ref_gammas(model):
    return sorted(float(p.detach()) for n, p in model.named_parameters() if "gammas" in n)


CASES = [("vit", "fused", False), ("vit", "per_role", False), ("vit", "fused", True), ("bert", "fused", False),
         ("bert", "per_role", False)]


@pytest.mark.parametrize(("family", "partition", "all_linear"), CASES)
def test_sigma_reparam_is_the_references_logic(family, partition, all_linear):
    """Same weights, same inputs, five SGD steps in training mode: outputs, every gradient, γ and σ agree with the
    reference's logic; an eval forward agrees too and leaves the stored vectors as they were."""
    base = _vit() if family == "vit" else _bert()
    ours = copy.deepcopy(base)
    rep = condattn.apply_conditioning(ours, "sigma_reparam", partition=partition,
                                      scope="all_linear" if all_linear else "attention")
    ref = _reference(base, family, partition, all_linear)
    n_ref = sum(1 for m in ref.modules() if isinstance(m, RefSigma))
    assert n_ref == rep.count("sigma_reparam:linear") + (2 if family == "vit" else 6)
    if all_linear:  # the patch embedding's Conv2d is converted, as the reference's convert_to_sn does
        assert any(e.module == "patch_embed.proj" for e in rep.entries)
    assert len(_ours_gammas(ours)) == len(_ref_gammas(ref))
    x = _inputs(family)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.01)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.01)
    ours.train(), ref.train()
    for _ in range(5):
        out_o, out_r = _out(ours, family, x), _out(ref, family, x)
        # (5 SGD steps through 2 reparametrised layers compound rounding: measured up to 29 ulps of the scale)
        assert_close_to_scale(out_o, out_r, ulps=256)
        opt_o.zero_grad(), opt_r.zero_grad()
        probe = torch.randn(out_o.shape, generator=torch.Generator().manual_seed(7))  # (BERT's last LayerNorm makes
        (out_o * probe).sum().backward()  # the sum of squares constant: a random readout has gradients)
        (out_r * probe).sum().backward()
        ref_grads = {re.sub(r"\.layer\.(weight|bias)$", r".\1", n): p.grad for n, p in ref.named_parameters()
                     if "gammas" not in n}
        for n, p in ours.named_parameters():
            if "sigma_gamma" not in n:
                g = ref_grads[n]
                if g is None:  # (BERT's pooler: not in the output)
                    assert p.grad is None, n
                    continue
                # relative to its own scale; 1e-6: rounding of gradients that are 0 exactly (the key bias)
                assert float((p.grad - g).abs().max()) <= 1e-4 * float(g.abs().max()) + 1e-6, n
        torch.testing.assert_close(torch.tensor(_ours_gammas(ours)), torch.tensor(_ref_gammas(ref)))
        opt_o.step(), opt_r.step()
    stored = {n: b.clone() for n, b in ours.named_buffers() if "sigma_v" in n}
    ours.eval(), ref.eval()
    with torch.no_grad():
        assert_close_to_scale(_out(ours, family, x), _out(ref, family, x), ulps=256)
    assert all(torch.equal(b, stored[n]) for n, b in ours.named_buffers() if "sigma_v" in n)
    ours.train()
    with torch.no_grad():  # a training-mode forward under no_grad steps, as the reference does
        _out(ours, family, x)
    assert any(not torch.equal(b, stored[n]) for n, b in ours.named_buffers() if "sigma_v" in n)


def test_sigma_reparam_eval_forward_takes_an_unstored_power_step():
    """In eval, σ comes from a fresh step from the stored vector (the reference's get_sigma), not from the stored
    vector itself: with the stored vector moved off the singular vector, eval output equals the reference's."""
    base = _vit()
    ours = copy.deepcopy(base)
    condattn.apply_conditioning(ours, "sigma_reparam")
    ref = _reference(base, "vit", "fused", False)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for (_, b), (_, rb) in zip(sorted((n, b) for n, b in ours.named_buffers() if "sigma_v" in n),
                                   sorted((n, b) for n, b in ref.named_buffers() if "right" in n)):
            b.copy_(nn.functional.normalize(torch.randn(b.shape, generator=g), dim=0))
            rb.copy_(b)
    ours.eval(), ref.eval()
    x = _inputs("vit")
    with torch.no_grad():
        torch.testing.assert_close(ours(*x), ref(*x), rtol=1e-5, atol=1e-5)
