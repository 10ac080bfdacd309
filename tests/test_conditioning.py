"""The conditioning library's required properties, on a small timm ViT and the HF Nyströmformer. The contract
every architecture family keeps (counts, none bit-identical, W + λI, κ(X + C) ≤ 2, padding, removal) is
tests/test_layouts.py."""

import pytest
import torch
from helpers import tiny_vit, vit_inputs

import condattn
from condattn.conditioning import find_attention, find_tokens, polar_correction, remove_conditioning

METHODS = ["none", "spectral", "embedded", "spectral+embedded"]


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)


def kappa(x: torch.Tensor) -> torch.Tensor:
    s = torch.linalg.svdvals(x.double())
    return s[..., 0] / s[..., -1]


def _first_block_input(model, inputs):
    site = find_tokens(model)
    seen = {}
    h = site.first_block.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
    run(model, inputs)
    h.remove()
    return seen["x"]


def test_embedded_patches_only_leaves_cls_token():
    base, cond = tiny_vit(), tiny_vit()
    condattn.apply_conditioning(cond, "embedded", tokens="patches_only")
    x0, x1 = _first_block_input(base, vit_inputs()), _first_block_input(cond, vit_inputs())
    assert torch.equal(x0[:, 0], x1[:, 0])
    assert (kappa(x1[:, 1:]) <= 2.0 + 1e-4).all()


def test_embedded_before_pos_embed_hooks_patch_embed():
    model = tiny_vit()
    rep = condattn.apply_conditioning(model, "embedded", position="before_pos_embed")
    assert rep.entries[0].module == "patch_embed"
    seen = {}
    model.patch_embed.register_forward_hook(lambda m, a, o: seen.update(x=o))
    run(model, vit_inputs())
    assert (kappa(seen["x"]) <= 2.0 + 1e-4).all()


def test_embedded_gradient_modes():
    x = torch.randn(2, 20, 8, requires_grad=True)
    polar_correction(x, gradient="detach").sum().backward()
    g_detach = x.grad.clone()
    assert torch.allclose(g_detach, torch.ones_like(x))  # C is a constant
    x.grad = None
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 15:] = False
    polar_correction(x, mask, gradient="through").square().sum().backward()
    assert torch.isfinite(x.grad).all() and not torch.allclose(x.grad, 2 * x.detach())


def test_polar_correction_exact_formula():
    x = torch.randn(3, 12, 5, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    expected = x + s[:, :1, None] * (u @ vh)
    torch.testing.assert_close(polar_correction(x), expected)
    sv = torch.linalg.svdvals(polar_correction(x))
    torch.testing.assert_close(sv, s + s[:, :1])


def test_applying_twice_is_refused():
    model = tiny_vit()
    condattn.apply_conditioning(model, "spectral")
    with pytest.raises(RuntimeError, match="already conditioned"):
        condattn.apply_conditioning(model, "embedded")


@pytest.mark.parametrize(
    "method,opts,match",
    [
        ("sca", {}, "valid methods: none, spectral, embedded, spectral\\+embedded"),
        ("spectral", {"lambda": 3}, "valid options: lam, targets, identity"),
        ("spectral", {"identity": "diag"}, r"identity='diag' is invalid; choose one of \['full', 'per_head'\]"),
        ("embedded", {"solver": "qr"}, "solver='qr' is invalid"),
        ("spectral", {"targets": ["q", "o"]}, "non-empty subset of"),
    ],
)
def test_bad_method_or_option_is_refused_with_valid_ones(method, opts, match):
    with pytest.raises(ValueError, match=match):
        condattn.apply_conditioning(tiny_vit(), method, **opts)


def test_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="has no attention layer"):
        condattn.apply_conditioning(torch.nn.Sequential(torch.nn.Linear(4, 4)), "spectral")
    with pytest.raises(ValueError, match="cannot locate the first transformer block"):
        condattn.apply_conditioning(torch.nn.Sequential(torch.nn.Linear(4, 4)), "embedded")


def test_spectral_gradients_reach_weights_and_lambda_is_not_trained():
    model = tiny_vit().train()
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    model(**vit_inputs()).sum().backward()
    for site in find_attention(model):
        for role in "qkv":
            assert site.grad(role) is not None and site.grad(role).abs().sum() > 0
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in tiny_vit().parameters())


def test_spectral_survives_deepcopy_and_pickle_and_removal_restores_linear():
    import copy
    import io

    model = tiny_vit()
    expected = run(model, vit_inputs())
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    shifted = run(model, vit_inputs())
    assert not torch.allclose(shifted, expected)
    for clone in (copy.deepcopy(model), torch.load(_pickled(model, io), weights_only=False)):
        torch.testing.assert_close(run(clone, vit_inputs()), shifted, rtol=0, atol=0)
    remove_conditioning(model)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    torch.testing.assert_close(run(model, vit_inputs()), expected, rtol=0, atol=0)


def _pickled(model, io):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return buf


def test_spectral_eval_cache_follows_weight_updates_and_subclass_gets_hook():
    model = tiny_vit().eval()
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    lin = find_attention(model)[0].proj["q"].linear
    x = torch.randn(3, lin.in_features)
    shift = lin._condattn_shift
    explicit = lambda: x @ (lin.weight.detach() + shift.delta_weight()).T + lin.bias.detach()  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(lin(x), explicit())
        lin.weight.add_(0.5)  # an optimizer step: the cached W + λI must be rebuilt
        torch.testing.assert_close(lin(x), explicit())

    class MyLinear(torch.nn.Linear):  # e.g. a LoRA or quantised Linear with its own forward
        def forward(self, x):
            return super().forward(x) * 1.0

    plain = tiny_vit().eval()
    custom = tiny_vit().eval()
    for blk in custom.blocks:
        q = blk.attn.qkv
        blk.attn.qkv = MyLinear(q.in_features, q.out_features)
        blk.attn.qkv.load_state_dict(q.state_dict())
    for m in (plain, custom):
        condattn.apply_conditioning(m, "spectral", lam=2.0)
    assert type(custom.blocks[0].attn.qkv) is MyLinear and custom.blocks[0].attn.qkv._forward_hooks
    torch.testing.assert_close(run(custom, vit_inputs()), run(plain, vit_inputs()), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_spectral_and_embedded_trace_under_torch_compile():
    """Both patches go through dynamo without graph breaks into eager code paths we cannot follow
    (aot_eager: the same tracing as inductor, no C++ compiler needed)."""
    for method in ("spectral", "embedded"):
        model = tiny_vit().eval()
        condattn.apply_conditioning(model, method, **({"solver": "newton_schulz"} if method == "embedded" else {}))
        eager = run(model, vit_inputs())
        compiled = torch.compile(model, backend="aot_eager", fullgraph=method == "spectral")
        torch.testing.assert_close(run(compiled, vit_inputs()), eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(197, 384), (128, 768), (50, 192)])
@pytest.mark.parametrize("spectrum", ["kappa1e1", "kappa1e3", "kappa1e6", "rank_deficient", "one_spike"])
def test_newton_schulz_bound_across_spectra(shape, spectrum):
    """κ(X + C) ≤ 2.05 for the fast solver whatever the tokens' spectrum: well conditioned, the κ ~ 1e3 the
    CET paper reports for trained ViT-B tokens, far worse, exactly rank-deficient (LayerNorm'd tokens, N < D),
    and one dominant direction (a large mean token) over a flat rest."""
    n, d = shape
    r = min(n, d)
    g = torch.Generator().manual_seed(sum(shape))
    u, _ = torch.linalg.qr(torch.randn(n, r, generator=g))
    v, _ = torch.linalg.qr(torch.randn(d, r, generator=g))
    s = {
        "kappa1e1": torch.logspace(1, 0, r),
        "kappa1e3": torch.logspace(3, 0, r),
        "kappa1e6": torch.logspace(6, 0, r),
        "rank_deficient": torch.cat([torch.logspace(2, 0, r - r // 4), torch.zeros(r // 4)]),
        "one_spike": torch.cat([torch.tensor([1e3]), torch.ones(r - 1)]),
    }[spectrum]
    x = ((u * s) @ v.T).unsqueeze(0)
    sv = torch.linalg.svdvals(polar_correction(x, solver="newton_schulz").double())[0]
    exact = torch.linalg.svdvals(polar_correction(x, solver="svd").double())[0]
    assert float(sv[0] / sv[-1]) <= 2.05
    assert float(exact[0] / exact[-1]) <= 2.0 + 1e-4


@pytest.mark.parametrize("kept", [63, 64, 65, 74, 100])
def test_newton_schulz_bound_on_padded_layernormed_tokens(kept):
    """The hard case for the fast solver: LayerNorm'd tokens (every row sums to zero: an exact null direction)
    with padding leaving about as many rows as channels. The regularisation's fill-in direction is then
    mostly inside X's column space (found on padded ListOps batches: κ up to 7.2 with the old 1e-3 / 6 lifts)."""
    g = torch.Generator().manual_seed(kept)
    n, d = 128, 64
    x = torch.nn.functional.layer_norm(torch.randn(8, n, d, generator=g) * torch.logspace(0, 1, d), (d,))
    keep = torch.zeros(8, n, dtype=torch.bool)
    keep[:, :kept] = True
    y = polar_correction(x, keep, solver="newton_schulz")
    for i in range(8):
        sv = torch.linalg.svdvals(y[i][keep[i]].double())
        assert float(sv[0] / sv[-1]) <= 2.05
    assert torch.equal(y[~keep], x[~keep])


def test_unconverged_or_nan_polar_factor_falls_back_to_the_exact_svd():
    """The per-sample check must also catch a NaN/inf polar factor (NaN compares false with everything), and
    leave samples whose tokens are themselves non-finite alone (the trainer's loss check reports those)."""
    from condattn.conditioning.embedded import _exact_where_unconverged, _svd_polar

    x = torch.randn(3, 20, 8, generator=torch.Generator().manual_seed(0))
    x[2, 0, 0] = float("nan")
    sigma, polar = _svd_polar(x[:2])
    sigma = torch.cat([sigma, torch.ones(1, 1, 1)])
    polar = torch.cat([polar, torch.zeros(1, 20, 8)])
    polar[0] = float("nan")  # sample 0: diverged iteration
    polar[1, :, 0] *= 0.5  # sample 1: a singular value far below 1
    s2, p2 = _exact_where_unconverged(x, None, sigma, polar)
    for b in range(2):
        s_ref, p_ref = _svd_polar(x[b])
        torch.testing.assert_close(p2[b], p_ref)
        torch.testing.assert_close(s2[b], s_ref)
    assert torch.equal(p2[2], polar[2])  # non-finite tokens: untouched


class _WideValues(torch.nn.Module):
    """q/k heads of width 4, value heads of width 8 (LeViT / EfficientFormer style d_v = 2·d)."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.num_heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(dim, heads * w) for w in (4, 4, 8))
        self.proj = torch.nn.Linear(heads * 8, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.num_heads, -1).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        return self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


def test_per_head_identity_follows_each_roles_own_head_width():
    """identity=per_head gives every head λ I of its own width: 4 for q/k, 8 for the wider value heads."""
    model = torch.nn.Sequential(_WideValues())
    condattn.apply_conditioning(model, "spectral", lam=1.0, identity="per_head")
    (site,) = condattn.conditioning.find_attention(model)
    for role, width in (("q", 4), ("k", 4), ("v", 8)):
        delta = site.weight(role) - site.weight(role, effective=False)
        want = torch.cat([torch.eye(width, 16)] * 2)
        torch.testing.assert_close(delta, want, rtol=0, atol=1e-6, msg=role)


def test_conditioned_init_and_the_diagnostics_follow_the_wider_value_heads():
    from condattn.diagnostics.weights import weight_conditioning

    model = torch.nn.Sequential(_WideValues())
    condattn.apply_conditioning(model, "conditioned_init", identity="per_head")
    (site,) = condattn.conditioning.find_attention(model)
    assert site.role_head_dim("v") == 8 and site.role_head_dim("q") == 4
    torch.testing.assert_close(site.weight("v"), torch.cat([torch.eye(8, 16)] * 2), rtol=0, atol=0)
    (entry,) = weight_conditioning(model)
    assert len(entry["v"]["kappa_heads"]) == 2 and len(entry["q"]["kappa_heads"]) == 2
