"""SCA on attention whose W_Q/W_K/W_V are 1×1 convolutions (layouts/timm_conv.py, structural), and the one-line
refusals of attention without q·kᵀ logits, without a W_Q, or with a cascade of per-head projections
(layouts/refused.py). BatchNorm after the projection: tests/test_bn_layouts.py.
The contract tests of tests/test_layouts.py run on the conv cases too (CASES: *_conv, csatv2_spatial)."""

from __future__ import annotations

import copy
import importlib
import pickle

import pytest
import torch
from helpers import assert_compiles_like_eager, assert_identical, snapshot
from test_layouts import CASES, ConvStack

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning.sites import as_matrix, stored_weight

pytestmark = pytest.mark.usefixtures("one_thread")


def _timm(module: str):
    return importlib.import_module(f"timm.models.{module}")


def _x(c: int = 32, hw: int = 8) -> torch.Tensor:
    return torch.randn(2, c, hw, hw, generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------- which output channel is which role, per head


def _uniform_v_module(kind: str) -> torch.nn.Module:
    from timm.layers.attention2d import Attention2d
    from timm.layers.bottleneck_attn import BottleneckAttn

    torch.manual_seed(0)
    m = {"maxxvit_head_first": lambda: _timm("maxxvit").Attention2d(32, dim_head=8),
         "maxxvit_stacked": lambda: _timm("maxxvit").Attention2d(32, dim_head=8, head_first=False),
         "layers_head_first": lambda: Attention2d(32, num_heads=4, head_first=True),  # timm.layers' twin
         "visformer": lambda: _timm("visformer").Attention(32, num_heads=4),
         "bottleneck": lambda: BottleneckAttn(32, feat_size=(8, 8), num_heads=4)}[kind]().eval()
    with torch.no_grad():
        for p in m.qkv.parameters():
            p.zero_()
        if hasattr(m, "proj"):  # (BoTNet's attention has no output projection)
            m.proj.weight.copy_(torch.eye(32).view(32, 32, 1, 1))
            if m.proj.bias is not None:
                m.proj.bias.zero_()
    return m


@pytest.mark.parametrize("kind", ["maxxvit_head_first", "maxxvit_stacked", "layers_head_first", "visformer",
                                  "bottleneck"])
def test_the_identity_lands_on_each_heads_own_values(kind):
    """With W_Q = W_K = W_V = 0, W_O = I and SCA on V only (λ = 1, identity=full), q = k = 0 and v = x: attention is
    uniform, so the output is every channel's mean over the positions. A layout that put λI on the wrong output
    channels (stacked for MaxxViT's per-head [q; k; v], or the reverse) gives non-zero queries or other values."""
    m, x = _uniform_v_module(kind), _x()
    condattn.apply_conditioning(m, "spectral", lam=1.0, targets=["v"])
    with torch.no_grad():
        out = m(x)
    torch.testing.assert_close(out, x.mean((2, 3), keepdim=True).expand_as(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the fold: training, init, svd, contracts


def _maxxvit_stack():
    return CASES["maxxvit_conv"].build()


def test_training_gradient_equals_the_explicit_weights():
    """In training, loss and the gradient on each stored conv weight equal those of the model with W + λI written in."""
    model = _maxxvit_stack().train()
    explicit = copy.deepcopy(model)
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    names = {id(m): n for n, m in model.named_modules()}
    mods = dict(explicit.named_modules())
    with torch.no_grad():
        for s in find_attention(model):
            for role, p in s.proj.items():
                as_matrix(mods[names[id(p.linear)]].weight)[p.cols] = s.weight(role)
    x = _x()
    loss, ref = model(x).square().mean(), explicit(x).square().mean()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    ref.backward()
    for s in find_attention(model):
        p = s.proj["q"]
        grad, want = stored_weight(p).grad, mods[names[id(p.linear)]].weight.grad
        assert grad is not None and grad.shape == p.linear.weight.shape
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-6)


def test_mode_init_and_svd_on_conv_weights():
    base, x = _maxxvit_stack(), _x()
    fixed, init = copy.deepcopy(base), copy.deepcopy(base)
    condattn.apply_conditioning(fixed, "spectral", lam=2.0)
    condattn.apply_conditioning(init, "spectral", lam=2.0, mode="init")
    assert not any("Shifted" in type(m).__name__ for m in init.modules())  # init: plain modules, C in the weight
    with torch.no_grad():
        torch.testing.assert_close(init(x), fixed(x), rtol=1e-5, atol=1e-5)
    svd = copy.deepcopy(base)
    condattn.apply_conditioning(svd, "spectral", correction="svd")
    for s in find_attention(svd):  # identity=full: one block per role (all its heads), κ(W + C) ≤ 2
        for role in ("q", "k", "v"):
            sv = torch.linalg.svdvals(s.weight(role))
            assert s.weight(role).shape == (s.num_heads * s.head_dim, 32)
            assert float(sv[0] / sv[-1]) <= 2.05, (s.name, role)
    with torch.no_grad():
        assert not torch.equal(svd(x), base(x))


class Residual(torch.nn.Module):
    def __init__(self, *blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def test_fx_export_deepcopy_pickle_keep_the_patch():
    torch.manual_seed(0)
    maxxvit = _timm("maxxvit")
    model = Residual(maxxvit.Attention2d(32, dim_head=8), _timm("visformer").Attention(32, num_heads=2)).eval()
    x = _x()
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    with torch.no_grad():
        out = model(x)
        assert torch.equal(torch.fx.symbolic_trace(model)(x), out)
        assert torch.equal(copy.deepcopy(model)(x), out)
        assert torch.equal(pickle.loads(pickle.dumps(model))(x), out)
        torch.testing.assert_close(torch.export.export(model, (x,)).module()(x), out, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="torch.jit.script: this model is conditioned"):
        torch.jit.script(model)


def test_conditioned_init_writes_the_conv_weights_view():
    model = _maxxvit_stack()
    condattn.apply_conditioning(model, "conditioned_init")
    for s in find_attention(model):
        torch.testing.assert_close(s.weight("v"), torch.eye(32))  # W_V: the rectangular identity (32 × 32 here)
        for h in range(s.num_heads):
            wq = s.head_weight("q", h)
            torch.testing.assert_close(wq @ wq.T, torch.eye(s.head_dim), rtol=1e-5, atol=1e-5)


def test_gemma4_clippable_linear_is_unwrapped():
    """Gemma4-ViT's q/k/v_proj wrap a Linear (input/output clamps): the site's projections are the inner Linears."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("gemma4_vit_167m", pretrained=False, img_size=32, patch_size=8, embed_dim=64, depth=2,
                              num_heads=2, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(x)
    rep = condattn.apply_conditioning(model, "spectral", lam=2.0)
    assert rep.counts == {"spectral:structural": 2}
    assert all(type(p.linear).__name__ == "ShiftedLinear" for s in find_attention(model) for p in s.proj.values())
    with torch.no_grad():
        assert not torch.equal(model(x), ref)
        condattn.remove_conditioning(model)
        assert torch.equal(model(x), ref)


# ---------------------------------------------------------------- refusals: one line, the model untouched


class LinearBNAttention(torch.nn.Module):
    """q / k / v are LeViT LinearNorms (Linear + BatchNorm) in a class no named layout knows: structural refuses."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.num_heads = 2
        self.q, self.k, self.v = (_timm("levit").LinearNorm(dim, dim) for _ in range(3))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def _refused_cases():
    from timm.layers.bottleneck_attn import BottleneckAttn

    maps = _x()
    return {  # name -> (module, input, words of the reason)
        "structural_linear_bn": (LinearBNAttention, maps.flatten(2).transpose(1, 2), "followed by BatchNorm"),
        "swiftformer": (lambda: _timm("swiftformer").EfficientAdditiveAttention(32, 32), maps, "additive attention"),
        "nextvit_mhca": (lambda: _timm("nextvit").ConvAttention(32, head_dim=16), maps, "no q·kᵀ logits"),
        "bottleneck_qk_ratio": (lambda: BottleneckAttn(32, feat_size=(8, 8), num_heads=4, qk_ratio=0.5), maps,
                                "different widths"),
    }


@pytest.mark.parametrize("name", list(_refused_cases()))
def test_refusals_name_the_reason_and_change_nothing(name):
    build, x, words = _refused_cases()[name]
    torch.manual_seed(0)
    model = ConvStack(build()).eval()
    before = snapshot(model, x)
    with pytest.raises(ValueError) as err:
        condattn.apply_conditioning(model, "spectral")
    reason = str(err.value).split("\n")[1]
    assert words in reason and "nothing was changed" in str(err.value), reason
    assert_identical(before, snapshot(model, x))


def test_volo_patches_its_token_attention_under_partial_and_names_outlook():
    torch.manual_seed(0)
    model = _timm("volo").VOLO(layers=[1, 1, 1, 1], img_size=64, num_classes=10, stem_hidden_dim=16,
                               embed_dims=[32, 64, 64, 64], num_heads=[2, 2, 2, 2]).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    before = snapshot(model, x)
    with pytest.raises(ValueError, match="OutlookAttention .*outlook attention.*no q·kᵀ logits"):
        condattn.apply_conditioning(model, "spectral")
    assert_identical(before, snapshot(model, x))
    rep = condattn.apply_conditioning(model, "spectral", partial=True, lam=2.0)
    assert rep.count("spectral") == 3 + 2 and "OutlookAttention" in rep.warnings[0]  # 3 blocks + 2 class attention


@pytest.mark.slow
def test_compile_fullgraph_train_and_eval_on_conv_sites():
    """torch.compile(fullgraph=True, aot_eager) captures the conv fold in train mode (gradients as eager) and eval."""
    torch.manual_seed(0)
    model = Residual(_timm("maxxvit").Attention2d(32, dim_head=8), _timm("visformer").Attention(32, num_heads=2))
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    x = _x()
    with torch.no_grad():
        ref = model.eval()(x)
    assert_compiles_like_eager(model, x, ref)
