"""The conditioning library's required properties, on a small timm ViT and the HF Nyströmformer."""

import pytest
import torch
from conftest import MODELS, nystrom_inputs, tiny_nystromformer, tiny_vit, vit_inputs

import condattn
from condattn.conditioning import find_attention, find_tokens, polar_correction, remove_conditioning

METHODS = ["none", "spectral", "embedded", "spectral+embedded"]


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)


def kappa(x: torch.Tensor) -> torch.Tensor:
    s = torch.linalg.svdvals(x.double())
    return s[..., 0] / s[..., -1]


@pytest.mark.parametrize("name", list(MODELS))
def test_none_is_bit_identical_and_patches_nothing(name):
    build, inputs = MODELS[name]
    ref, model = build(), build()
    rep = condattn.apply_conditioning(model, "none")
    assert rep.counts == {}
    assert torch.equal(run(ref, inputs()), run(model, inputs()))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method", METHODS[1:])
def test_no_new_parameters_and_state_dict_round_trip(name, method):
    build, inputs = MODELS[name]
    base, cond = build(), build()
    params = {n: p.shape for n, p in base.named_parameters()}
    condattn.apply_conditioning(cond, method, lam=2.0)
    assert {n: p.shape for n, p in cond.named_parameters()} == params
    assert list(cond.state_dict()) == list(base.state_dict())
    # a baseline checkpoint loads into the conditioned model and back, strictly
    cond.load_state_dict(base.state_dict(), strict=True)
    base.load_state_dict(cond.state_dict(), strict=True)
    out = run(cond, inputs())
    assert torch.isfinite(out).all()
    assert not torch.equal(out, run(base, inputs()))  # the patch is live
    remove_conditioning(cond)
    assert torch.equal(run(cond, inputs()), run(base, inputs()))


@pytest.mark.parametrize("name,expected", [("vit", {"spectral:timm_fused_qkv": 2}),
                                           ("nystromformer", {"spectral:hf_separate_qkv": 2})])
def test_report_counts(name, expected):
    model = MODELS[name][0]()
    rep = condattn.apply_conditioning(model, "spectral+embedded")
    assert {k: v for k, v in rep.counts.items() if k.startswith("spectral")} == expected
    assert rep.count("embedded") == 1
    rep.check(attention_layers=2)
    with pytest.raises(RuntimeError, match="expects 12"):
        rep.check(attention_layers=12)


def _explicit_weight(weight, num_heads, head_dim, cols_per_role, roles, lam, identity):
    """(W + λI)^T in torch layout, built directly from the definition (independent of SpectralShift)."""
    w = weight.clone()
    d_in = w.shape[1]
    for role_idx in roles:
        start = cols_per_role * role_idx
        if identity == "full":
            w[start : start + cols_per_role] += lam * torch.eye(cols_per_role, d_in)
        else:
            for h in range(num_heads):
                s = start + h * head_dim
                w[s : s + head_dim] += lam * torch.eye(head_dim, d_in)
    return w


@pytest.mark.parametrize("identity", ["full", "per_head"])
@pytest.mark.parametrize("targets", [["q", "k", "v"], ["v"], ["q", "k"]])
def test_spectral_equals_explicit_formula_fused_qkv(identity, targets):
    model = tiny_vit()
    condattn.apply_conditioning(model, "spectral", lam=3.0, identity=identity, targets=targets)
    site = find_attention(model)[0]
    lin = site.proj["q"].linear
    seen = {}
    lin.register_forward_hook(lambda m, a, o: seen.update(x=a[0], y=o))  # sees the shifted output
    run(model, vit_inputs())
    a = site.num_heads * site.head_dim
    roles = [("q", "k", "v").index(t) for t in targets]
    w = _explicit_weight(lin.weight.detach(), site.num_heads, site.head_dim, a, roles, 3.0, identity)
    expected = seen["x"] @ w.T + lin.bias.detach()
    torch.testing.assert_close(seen["y"], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(site.weight("q", effective=True), w[:a])


@pytest.mark.parametrize("identity", ["full", "per_head"])
def test_spectral_equals_explicit_formula_separate_qkv(identity):
    model = tiny_nystromformer()
    condattn.apply_conditioning(model, "spectral", lam=10.0, identity=identity)
    for site in find_attention(model):
        for role in ("q", "k", "v"):
            lin = site.proj[role].linear
            seen = {}
            h = lin.register_forward_hook(lambda m, a, o, seen=seen: seen.update(x=a[0], y=o))
            run(model, nystrom_inputs())
            h.remove()
            w = _explicit_weight(lin.weight.detach(), site.num_heads, site.head_dim, lin.out_features, [0],
                                 10.0, identity)
            torch.testing.assert_close(seen["y"], seen["x"] @ w.T + lin.bias.detach(), rtol=1e-5, atol=1e-4)


def _first_block_input(model, inputs):
    site = find_tokens(model)
    seen = {}
    h = site.first_block.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
    run(model, inputs)
    h.remove()
    return seen["x"]


@pytest.mark.parametrize("solver,bound", [("svd", 2.0 + 1e-4), ("newton_schulz", 2.05)])
def test_embedded_kappa_at_most_two_vit(solver, bound):
    base, cond = tiny_vit(), tiny_vit()
    condattn.apply_conditioning(cond, "embedded", solver=solver)
    x0, x1 = _first_block_input(base, vit_inputs()), _first_block_input(cond, vit_inputs())
    assert (kappa(x0) > 5).all()  # the raw tokens are badly conditioned
    assert (kappa(x1) <= bound).all(), kappa(x1)


@pytest.mark.parametrize("solver,bound", [("svd", 2.0 + 1e-4), ("newton_schulz", 2.05)])
def test_embedded_padding_untouched_and_kappa_nystromformer(solver, bound):
    base, cond = tiny_nystromformer(), tiny_nystromformer()
    condattn.apply_conditioning(cond, "embedded", solver=solver)
    inputs = nystrom_inputs()
    x0, x1 = _first_block_input(base, inputs), _first_block_input(cond, inputs)
    mask = inputs["attention_mask"].bool()
    assert torch.equal(x0[~mask], x1[~mask])  # padded positions: bit-identical
    assert not torch.equal(x0[mask], x1[mask])
    for b in range(x1.shape[0]):
        assert kappa(x1[b, mask[b]]) <= bound
        assert kappa(x0[b, mask[b]]) > 2.5


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
    with pytest.raises(ValueError, match="no attention module"):
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


def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=96, num_hidden_layers=2, num_attention_heads=4, intermediate_size=192)
    return BertModel(cfg).eval()


@pytest.mark.parametrize("solver,bound", [("svd", 2.0 + 1e-4), ("newton_schulz", 2.05)])
def test_bert_layouts_counts_and_kappa(solver, bound):
    ids = torch.randint(1000, 30000, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    base, cond = tiny_bert(), tiny_bert()
    rep = condattn.apply_conditioning(cond, "spectral+embedded", solver=solver)
    assert rep.counts == {"spectral:hf_separate_qkv": 2, "embedded:hf_encoder": 1}
    remove_conditioning(cond)
    condattn.apply_conditioning(cond, "embedded", solver=solver)
    x0, x1 = _first_block_input(base, inputs), _first_block_input(cond, inputs)
    keep = mask.bool()
    assert torch.equal(x0[~keep], x1[~keep])
    for b in range(3):
        assert kappa(x1[b, keep[b]]) <= bound


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
