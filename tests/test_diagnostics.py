"""condattn.diagnostics: κ of weights / tokens / attention outputs, attention entropy, grad norms, κ(J)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import timm
import torch

import condattn
from condattn.conditioning import find_attention
from condattn.diagnostics import (
    attention_entropy,
    attention_head,
    attention_jacobian,
    batch_condition_numbers,
    cheap_diagnostics,
    condition_number,
    grad_diagnostics,
    jacobian_condition_number,
    jacobian_condition_number_matfree,
    jacobian_singular_values,
    qkv_grad_norms,
    sigma_max,
    sigma_min,
    token_conditioning,
    weight_conditioning,
)
from condattn.models.lra import NystromformerClassifier

LENGTHS = (128, 70, 9)  # right-padded Nyströmformer batch


def vit(seed: int = 0):
    torch.manual_seed(seed)
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=10)
    return m.eval()


def nystrom(seed: int = 0, landmarks: int = 64):
    torch.manual_seed(seed)
    return NystromformerClassifier(vocab_size=19, num_classes=10, seq_len=128, num_landmarks=landmarks).eval()


def vit_forward(model, batch):
    return model(batch)


def nys_forward(model, batch):
    return model(input_ids=batch[0], attention_mask=batch[1])


@pytest.fixture(scope="module")
def images():
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def text():
    g = torch.Generator().manual_seed(2)
    mask = torch.zeros(len(LENGTHS), 128, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    ids = torch.randint(1, 19, (len(LENGTHS), 128), generator=g) * mask
    return ids, mask


# ---------------------------------------------------------------- linalg


def test_condition_number_matches_numpy():
    rng = np.random.default_rng(0)
    for shape in [(5, 5), (7, 3), (3, 7)]:
        a = rng.standard_normal(shape)
        s = np.linalg.svd(a, compute_uv=False)
        assert condition_number(torch.from_numpy(a)) == pytest.approx(np.linalg.cond(a), rel=1e-10)
        assert sigma_min(torch.from_numpy(a)) == pytest.approx(s[-1], rel=1e-10)
        assert sigma_max(torch.from_numpy(a)) == pytest.approx(s[0], rel=1e-10)
    # a zero singular value is left out: κ over the nonzero ones
    d = torch.diag(torch.tensor([3.0, 2.0, 0.0], dtype=torch.float64))
    assert condition_number(d) == pytest.approx(1.5)
    assert sigma_min(d) == pytest.approx(2.0)
    # rank-2 product matrix (numerically tiny, not exactly zero, third singular value)
    b = torch.from_numpy(rng.standard_normal((6, 2)) @ rng.standard_normal((2, 5)))
    s = np.linalg.svd(b.numpy(), compute_uv=False)[:2]
    assert np.linalg.matrix_rank(b.numpy()) == 2
    assert condition_number(b) == pytest.approx(s[0] / s[1], rel=1e-10)
    # the tolerance follows the stored dtype, like numpy's matrix_rank
    tiny = torch.diag(torch.tensor([1.0, 1e-10], dtype=torch.float64))
    assert condition_number(tiny) == pytest.approx(1e10, rel=1e-8)
    assert condition_number(tiny.float()) == pytest.approx(1.0)
    assert math.isnan(condition_number(torch.zeros(3, 3)))
    # 16-bit inputs use float32's eps (bf16's would discard every σ but σ_max of a 64-column matrix)
    wide = torch.from_numpy(rng.standard_normal((64, 64)) @ np.diag(np.linspace(1, 0.05, 64)))
    assert condition_number(wide.bfloat16()) == pytest.approx(condition_number(wide), rel=0.1)
    # float32 input is measured in float64
    a32 = torch.from_numpy(rng.standard_normal((8, 8))).float()
    assert condition_number(a32) == pytest.approx(np.linalg.cond(a32.double().numpy()), rel=1e-10)


def test_batch_condition_numbers_with_row_mask():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 10, 4, generator=g)
    keep = torch.zeros(3, 10, dtype=torch.bool)
    for b, n in enumerate((10, 6, 3)):
        keep[b, :n] = True
    x[~keep] = 123.0  # padded rows must not count
    got = batch_condition_numbers(x, keep)
    for b, n in enumerate((10, 6, 3)):
        assert got[b].item() == pytest.approx(condition_number(x[b, :n]), rel=1e-10)


# ---------------------------------------------------------------- weights


def test_sca_lowers_weight_kappa_and_obeys_weyl():
    base = weight_conditioning(vit())
    m = vit()
    lam = 10.0
    condattn.apply_conditioning(m, "spectral", lam=lam)
    eff = weight_conditioning(m, effective=True)
    raw = weight_conditioning(m, effective=False)
    assert len(base) == len(eff) == 2 and [e["layer"] for e in eff] == [0, 1]
    for b, e, r in zip(base, eff, raw):
        assert r["q"]["kappa"] == pytest.approx(b["q"]["kappa"])  # the stored weights are untouched
        assert len(e["q"]["kappa_heads"]) == e["num_heads"] == 3
        for role in "qkv":
            smax = b[role]["sigma_max"]
            assert smax < lam
            assert e[role]["kappa"] < b[role]["kappa"]
            assert e[role]["sigma_min"] > b[role]["sigma_min"]
            assert e[role]["kappa"] <= (lam + smax) / (lam - smax) + 1e-9  # Weyl
            assert e[role]["sigma_min"] >= lam - smax - 1e-9
            assert max(e[role]["kappa_heads"]) < min(b[role]["kappa_heads"])


# ---------------------------------------------------------------- tokens


def test_cet_bounds_kappa_x_vit(images):
    base = token_conditioning(vit(), vit_forward, images)
    m = vit()
    condattn.apply_conditioning(m, "embedded", solver="svd")
    cet = token_conditioning(m, vit_forward, images)
    b0, c0 = base["blocks"][0], cet["blocks"][0]
    assert len(c0["kappa"]) == len(images) and len(cet["blocks"]) == 2 and len(cet["attn_out"]) == 2
    assert max(c0["kappa"]) <= 2 + 1e-3 and c0["kappa_max"] <= 2 + 1e-3
    assert min(b0["kappa"]) > 2
    assert c0["kappa_min"] <= c0["kappa_mean"] <= c0["kappa_max"]
    assert all(math.isfinite(a["kappa_mean"]) for a in cet["attn_out"])


def test_cet_bounds_kappa_x_nystromformer_with_padding(text):
    ids, mask = text
    base = token_conditioning(nystrom(), nys_forward, text, mask=mask)
    m = nystrom()
    condattn.apply_conditioning(m, "embedded", solver="svd")
    cet = token_conditioning(m, nys_forward, text, mask=mask)
    assert max(cet["blocks"][0]["kappa"]) <= 2 + 1e-3
    assert min(base["blocks"][0]["kappa"]) > 2
    # no mask given: the probe reads the one the encoder receives, so padded rows are still left out
    unmasked = token_conditioning(m, nys_forward, text)
    assert unmasked["blocks"][0]["kappa"] == pytest.approx(cet["blocks"][0]["kappa"])
    # ...and with them the bound would not hold: κ over all rows of the corrected tokens
    seen = {}
    h = m.backbone.encoder.layer[0].register_forward_pre_hook(
        lambda mod, a, kw: seen.update(x=a[0] if a else kw["hidden_states"]), with_kwargs=True
    )
    with torch.no_grad():
        nys_forward(m, text)
    h.remove()
    sv = torch.linalg.svdvals(seen["x"].double())
    assert float((sv[:, 0] / sv[:, -1]).max()) > 2 + 1e-3


# ---------------------------------------------------------------- attention entropy


def _zero_queries(site):
    p = site.proj["q"]
    with torch.no_grad():
        p.linear.weight[p.cols] = 0
        if p.linear.bias is not None:
            p.linear.bias[p.cols] = 0


def test_uniform_attention_entropy_is_log_n(images, text):
    m = vit()
    _zero_queries(find_attention(m)[0])
    r = attention_entropy(m, vit_forward, images)[0]
    n = (32 // 8) ** 2 + 1
    assert r["entropy"] == pytest.approx(math.log(n), abs=1e-5)
    assert r["entropy_heads"] == pytest.approx([math.log(n)] * 3, abs=1e-5)
    assert r["maxprob"] == pytest.approx(1 / n, abs=1e-6)
    # padded keys are masked out and padded queries left out: each query sees log(its length)
    ids, mask = text
    m = nystrom(landmarks=128)  # exact softmax (num_landmarks == seq_len): the model's own probabilities
    _zero_queries(find_attention(m)[0])
    r = attention_entropy(m, nys_forward, text, mask=mask)[0]
    want = sum(n * math.log(n) for n in LENGTHS) / sum(LENGTHS)
    assert r["entropy"] == pytest.approx(want, abs=1e-5)
    assert r["entropy_uniform"] == pytest.approx(want, abs=1e-9)
    # the landmark approximation forms no probability matrix: absent, with the reason, never NaN
    r = attention_entropy(nystrom(), nys_forward, text, mask=mask)[0]
    assert r["entropy"] is r["maxprob"] is r["self_argmax"] is None and "64 landmarks for 128 tokens" in r["absent"]


def test_entropy_matches_timm_attention_probs_under_sca(images):
    m = vit()
    condattn.apply_conditioning(m, "spectral", lam=0.3)
    site = find_attention(m)[0]
    site.module.fused_attn = False
    probs = []
    h = site.module.attn_drop.register_forward_hook(lambda mod, a, out: probs.append(out.detach()))
    r = attention_entropy(m, vit_forward, images)[0]
    h.remove()
    p = probs[0]
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1).mean((0, 2))
    assert r["entropy_heads"] == pytest.approx(ent.tolist(), abs=1e-4)
    assert r["maxprob_heads"] == pytest.approx(p.amax(-1).mean((0, 2)).tolist(), abs=1e-5)
    assert 0.1 < r["entropy"] < math.log(17) - 0.01  # λ=0.3 sharpens but does not saturate


def test_entropy_matches_nystromformer_exact_softmax(text):
    ids, mask = text
    m = nystrom(landmarks=128)  # num_landmarks == seq_len: transformers runs exact softmax attention
    r = attention_entropy(m, nys_forward, text, mask=mask)
    with torch.no_grad():
        att = m.backbone(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for layer, p in zip(r, att):
        w = mask[:, None, :].float()
        ent = (-(p * p.clamp_min(1e-30).log()).sum(-1) * w).sum((0, 2)) / w.sum((0, 2))
        assert layer["entropy_heads"] == pytest.approx(ent.tolist(), abs=1e-4)


def test_sca_lambda_10_makes_attention_one_hot(images):
    base = attention_entropy(vit(), vit_forward, images)
    m = vit()
    condattn.apply_conditioning(m, "spectral", lam=10.0)
    r = attention_entropy(m, vit_forward, images)
    assert base[0]["entropy"] > 0.9 * math.log(17)
    for layer in r:
        assert layer["entropy"] < 1e-3 and layer["maxprob"] > 0.999


def test_self_logit_unit_is_the_head_norm_of_the_attention_input_and_predicts_sca_saturation(images):
    """‖x_h‖²/√d_h of each attention input, read by the probe, equals the value recomputed from the block's norm1
    output; λ² times it is the self-logit λI adds, so λ = 10 (~566 at d_h = 64) saturates and λ = 0.1 does not."""
    m = vit()
    seen = []
    h = m.blocks[0].norm1.register_forward_hook(lambda mod, a, out: seen.append(out.detach().double()))
    r = attention_entropy(m, vit_forward, images)
    h.remove()
    heads, d_h = m.blocks[0].attn.num_heads, m.blocks[0].attn.head_dim
    want = seen[0].reshape(-1, heads, d_h).pow(2).sum(-1).mean() / d_h ** 0.5
    assert r[0]["self_logit_unit"] == pytest.approx(float(want), rel=1e-9)
    assert r[0]["self_logit_unit"] == pytest.approx(d_h ** 0.5, rel=0.05)  # LayerNorm at init: ‖x_h‖² ≈ d_h
    for lam, saturated in ((10.0, True), (0.1, False)):
        c = vit()
        condattn.apply_conditioning(c, "spectral", lam=lam)
        ent = attention_entropy(c, vit_forward, images)[0]["entropy"]
        assert (ent < 0.1) is saturated and (lam ** 2 * r[0]["self_logit_unit"] > 10) is saturated


# ---------------------------------------------------------------- Jacobian


def _random_head(n, dim, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    ws = [torch.randn(dim, d, generator=g, dtype=torch.float64) / dim**0.5 for _ in range(3)]
    return x, ws


def test_jacobian_matches_finite_differences():
    x, ws = _random_head(4, 3, 2)
    J = attention_jacobian(x, *ws)
    assert J.shape == (4 * 2, 3 * 3 * 2)
    flat = torch.cat([w.reshape(-1) for w in ws])
    eps = 1e-6
    fd = torch.empty_like(J)
    for j in range(flat.numel()):
        e = torch.zeros_like(flat)
        e[j] = eps
        plus, minus = ((flat + s * e).split(6) for s in (1, -1))
        f = [attention_head(x, *(p.reshape(3, 2) for p in ps)).reshape(-1) for ps in (plus, minus)]
        fd[:, j] = (f[0] - f[1]) / (2 * eps)
    torch.testing.assert_close(J, fd, rtol=1e-6, atol=1e-8)
    s = torch.linalg.svdvals(fd)
    assert jacobian_condition_number(x, *ws) == pytest.approx(float(s[0] / s[-1]), rel=1e-5)
    assert jacobian_singular_values(x, *ws).numel() == 8


@pytest.mark.parametrize("n,dim,d", [(8, 6, 3), (6, 8, 4), (10, 12, 2)])
def test_jacobian_exact_and_matrix_free_agree(n, dim, d):
    x, ws = _random_head(n, dim, d, seed=n)
    exact = jacobian_condition_number(x, *ws)
    approx, info = jacobian_condition_number_matfree(x, *ws, return_info=True)
    assert info["converged"]
    assert approx == pytest.approx(exact, rel=1e-6)
    s = jacobian_singular_values(x, *ws)
    assert info["sigma_max"] == pytest.approx(float(s[0]), rel=1e-6)
    assert info["sigma_min"] == pytest.approx(float(s[-1]), rel=1e-6)
    # float32 inputs, scale given: still agree (both compute in float64)
    xf, wf = x.float(), [w.float() for w in ws]
    assert jacobian_condition_number_matfree(xf, *wf, scale=1.0) == pytest.approx(
        jacobian_condition_number(xf, *wf, scale=1.0), rel=1e-6
    )


def test_jacobian_scale_handling():
    x, (wq, wk, wv) = _random_head(5, 4, 2)
    d = wq.shape[1]
    manual = torch.softmax((x @ wq) @ (x @ wk).T / math.sqrt(d), -1) @ (x @ wv)
    torch.testing.assert_close(attention_head(x, wq, wk, wv), manual)
    assert jacobian_condition_number(x, wq, wk, wv) == pytest.approx(
        jacobian_condition_number(x, wq, wk, wv, scale=d**-0.5), rel=1e-12
    )
    assert jacobian_condition_number(x, wq, wk, wv, scale=1.0) != pytest.approx(
        jacobian_condition_number(x, wq, wk, wv), rel=1e-3
    )
    # softmax(X (sW_q) W_k^T X^T) = the same head with scale s: the W_q block scales by s, the rest is equal
    s = 0.37
    j_s = attention_jacobian(x, wq, wk, wv, scale=s)
    j_1 = attention_jacobian(x, s * wq, wk, wv, scale=1.0)
    k = wq.numel()
    torch.testing.assert_close(j_s[:, :k], s * j_1[:, :k])
    torch.testing.assert_close(j_s[:, k:], j_1[:, k:])


def test_matrix_free_flags_rank_deficient_jacobian():
    x, ws = _random_head(20, 3, 2)  # N·d = 40 rows, at most 3·D·d = 18 independent columns
    with pytest.warns(UserWarning, match="numerically singular"):
        assert jacobian_condition_number_matfree(x, *ws) == math.inf
    assert math.isfinite(jacobian_condition_number(x, *ws))


def test_jacobian_importable_from_package():
    import condattn.diagnostics as D

    assert D.jacobian_condition_number is jacobian_condition_number


# ---------------------------------------------------------------- gradients and the bundles


def test_grad_norms_none_before_backward_positive_after(images):
    m = vit()
    condattn.apply_conditioning(m, "spectral", lam=1.0)
    assert all(e[r] is None for e in qkv_grad_norms(m) for r in "qkv")
    assert grad_diagnostics(m) == {}
    m(images).sum().backward()
    norms = qkv_grad_norms(m)
    assert len(norms) == 2 and all(e[r] > 0 for e in norms for r in "qkv")
    flat = grad_diagnostics(m)
    for r in "qkv":
        assert flat[f"gradnorm_w{r}/l0"] == pytest.approx(norms[0][r])
        assert f"gradnorm_w{r}/l1" in flat and f"gradnorm_w{r}/mean" in flat


def _hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("training", [True, False])
def test_cheap_diagnostics_vit(images, training):
    m = vit()
    condattn.apply_conditioning(m, "spectral+embedded", solver="svd")
    m.train(training)
    m.head.eval()  # a module in its own mode must keep it
    hooks = _hook_count(m)
    r = cheap_diagnostics(m, vit_forward, images)
    assert m.training is training and m.blocks[0].training is training and not m.head.training
    assert _hook_count(m) == hooks
    assert all(p.grad is None for p in m.parameters())
    json.dumps({k: v for k, v in r.items()}, allow_nan=False)
    flat = r["flat"]
    per_layer = ("kappa_wq", "kappa_wk", "kappa_wv", "sigma_min_wq", "sigma_max_wv", "kappa_head_wk")
    per_layer += ("kappa_attn", "entropy", "maxprob")
    keys = [f"{k}/{s}" for k in per_layer for s in ("l0", "l1", "mean")]
    keys += [f"{k}/{s}" for k in ("kappa_x", "kappa_x_max") for s in ("b0", "b1", "mean")]
    for key in keys:
        assert key in flat and math.isfinite(flat[key]), key
    assert flat["kappa_x_max/b0"] <= 2 + 1e-3  # CET active
    assert flat["kappa_wq/l0"] < 1.2  # SCA λ=10 active
    assert flat["entropy/mean"] == pytest.approx((flat["entropy/l0"] + flat["entropy/l1"]) / 2)
    assert set(r) == {"weights", "blocks", "attn_out", "attention", "features", "flat"}
    for key in ("self_argmax/l0", "cls_self/l1", "entropy_uniform/mean", "feature_spread"):  # saturation
        assert key in flat and 0 <= flat[key] <= flat.get("entropy_uniform/l0", 1e9), key


def test_cheap_diagnostics_nystromformer(text):
    ids, mask = text
    m = nystrom()
    m.train()
    r = cheap_diagnostics(m, nys_forward, text, mask=mask)
    assert m.training
    json.dumps(r, allow_nan=False)
    flat = r["flat"]
    for key in ("kappa_wq/l1", "kappa_x/b1", "kappa_attn/l0"):
        assert math.isfinite(flat[key]), key
    # 64 landmarks for 128 tokens: no probability matrix, so no entropy keys, and the reason in the report
    assert not any(k.startswith(("entropy", "maxprob", "self_argmax")) for k in flat), sorted(flat)
    assert all("Nyström approximation" in a["absent"] for a in r["attention"])
    exact = cheap_diagnostics(nystrom(landmarks=128), nys_forward, text, mask=mask)
    assert 0 < exact["flat"]["entropy/l0"] <= exact["attention"][0]["entropy_uniform"] + 1e-6


@pytest.mark.parametrize("method", ["none", "spectral"])
def test_channel_head_matches_timm_davit_channel_attention(method):
    """The DaViT channel-attention form's head function (κ(J)) and scores (entropy probe) are timm's
    `ChannelAttention` in the layout's roles: the module's output per head, from the site's effective weights."""
    from timm.models.davit import ChannelAttention

    from condattn.conditioning import ROLES

    torch.manual_seed(0)
    m = ChannelAttention(16, num_heads=2, qkv_bias=False).eval()
    condattn.apply_conditioning(m, method, **({"lam": 2.0} if method == "spectral" else {}))
    m.proj = torch.nn.Identity()
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = m(x)
    (site,) = find_attention(m)
    assert site.form.name == "channel_softmax" and site.attends_over == "channels"
    for h in range(2):
        fn, params = site.form.head(site, h)
        assert params["scale"] == pytest.approx(8**-0.5)
        W = [site.head_weight(r, h, effective=True).T for r in ROLES]
        for b in range(2):
            torch.testing.assert_close(fn(x[b], *W), out[b, :, h * 8:(h + 1) * 8], rtol=1e-5, atol=1e-6)
