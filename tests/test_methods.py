"""The field's methods (conditioning/methods/: qk_norm, sigma_reparam, mimetic_init, ns_attention) on every zoo family
of tests/test_layouts.py: each applies where it makes sense and is refused in one line where it does not; removal
restores the model where the method can be removed; and each does what it is defined to do."""

from __future__ import annotations

import copy

import pytest
import torch
from test_layouts import CASES, NAMES, output

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning.methods.common import output_projection
from condattn.conditioning.methods.ns_attention import ns_heads
from condattn.conditioning.sites import stored_weight

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = ["qk_norm", "sigma_reparam", "mimetic_init", "ns_attention"]
# (method, family) -> the words of its one-line refusal
REFUSED = {
    ("qk_norm", "beit"): "reads its projection weight itself",
    ("qk_norm", "torch_mha"): "reads its projection weight itself",
    ("ns_attention", "gpt2"): "causal",
    ("ns_attention", "llama"): "causal",
    ("ns_attention", "gpt_neox_structural"): "causal",
    ("ns_attention", "torch_mha"): "never as a module call",
    **{("qk_norm", n): "1×1 convolutions" for n in ("maxxvit_conv", "halo_conv", "bottleneck_conv", "pwise_conv",
                                                   "conv_structural")},
    ("qk_norm", "csatv2_spatial"): "1 wide",
    **{("qk_norm", n): "followed by BatchNorm" for n in ("levit_bn", "efficientformer_v2_bn", "efficientvit_msra_bn")},
    # W_O is a 1×1 conv, a Linear/Conv + BatchNorm, or absent (csatv2): output_projection finds Linear / Conv1D only
    **{("ns_attention", n): "no output projection W_O found" for n in ("maxxvit_conv", "halo_conv", "bottleneck_conv",
                                                                      "pwise_conv", "csatv2_spatial",
                                                                      "conv_structural", "levit_bn",
                                                                      "efficientformer_v2_bn", "efficientvit_msra_bn")},
}
# (method, family) -> why the output is unchanged although the method applied: CSATv2's spatial attention reads
# LayerNorm(1) of its input, i.e. the norm's bias (0 at init), so its q and k are constant over the positions and only
# W_V acts (mimetic_init sets W_Q, W_K; this site has no W_O)
NO_EFFECT = {("mimetic_init", "csatv2_spatial")}
# mimetic_init refuses a model whose layers cannot take the VO half (no W_O found by structure, or W_O after BatchNorm
# or of another width), unless mimetic_missing_vo=accept (tests/test_output_projection.py)
REFUSED.update({("mimetic_init", n): "cannot take the VO half" for n in (
    "maxxvit_conv", "halo_conv", "bottleneck_conv", "pwise_conv", "csatv2_spatial", "conv_structural", "levit_bn",
    "efficientformer_v2_bn", "efficientvit_msra_bn")})
# (method, family) -> sites listed as skipped (channel-softmax attention; MHA cross-attention over other widths;
# GCViT's global attention, which has no W_Q: its queries are the stage's global query tokens)
SKIPPED = {("qk_norm", "xcit"): 2, ("qk_norm", "davit"): 2, ("mimetic_init", "xcit"): 2,
           ("mimetic_init", "davit"): 2, ("mimetic_init", "torch_mha"): 1, ("qk_norm", "gcvit"): 2,
           ("mimetic_init", "gcvit"): 2}
ADDS_KEYS = {"qk_norm", "sigma_reparam"}


def apply(model, method: str, **options) -> condattn.PatchReport:
    return condattn.apply_conditioning(model, method, **options)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", METHODS)
def test_applies_or_refuses_in_one_line(method, name):
    case = CASES[name]
    model, inputs = case.build(), case.inputs()
    if (method, name) in REFUSED:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(ValueError, match=REFUSED[method, name]) as err:
            apply(model, method)
        assert model._condattn is None if hasattr(model, "_condattn") else True
        assert list(model.state_dict()) == list(before) and all(torch.equal(v, before[k])
                                                                for k, v in model.state_dict().items())
        assert "\n" not in str(err.value) and str(err.value).startswith(method)
        return
    base = case.build()
    ref = output(case, base, inputs)
    params = dict(base.named_parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rep = apply(model, method)
    assert rep.layers(method) + len({e.module.partition("#")[0] for e in rep.skipped}) == case.attention_layers
    assert len(rep.skipped) == SKIPPED.get((method, name), 0), [e.detail for e in rep.skipped]
    keys = set(model.state_dict())
    assert (keys > set(base.state_dict())) if method in ADDS_KEYS else keys == set(base.state_dict())
    if method == "ns_attention":
        assert dict(model.named_parameters()).keys() == params.keys()  # parameter-free
    if method == "sigma_reparam":  # Ŵ = W at init: the patch is live through γ
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 0:
                    p.mul_(2.0)
    out = output(case, model, inputs)
    assert torch.isfinite(out).all() and (not torch.equal(out, ref) or (method, name) in NO_EFFECT)
    if method == "mimetic_init":  # init only: nothing attached, nothing to remove
        assert model._condattn.handles == []
        with pytest.raises(RuntimeError, match="mimetic_init set the weights. values once"):
            condattn.remove_conditioning(model)
        return
    condattn.remove_conditioning(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert set(model.state_dict()) == set(base.state_dict())
    assert torch.equal(output(case, model, inputs), ref)


# ---------------------------------------------------------------- qk_norm


def _timm_pair(kind: str, **kw):
    import timm
    from timm.models.eva import Eva

    def build(qk_norm: bool):
        torch.manual_seed(0)
        if kind == "vit":
            return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                     embed_dim=64, num_heads=2, depth=2, num_classes=10, qk_norm=qk_norm).eval()
        return Eva(img_size=32, patch_size=8, embed_dim=64, depth=2, num_classes=10, qk_norm=qk_norm, **kw).eval()

    return build(False), build(True)


@pytest.mark.parametrize(("kind", "kw"), [("vit", {}), ("eva", {"num_heads": 2, "use_rot_pos_emb": True}),
                                          ("eva", {"num_heads": 4, "use_rot_pos_emb": True, "attn_type": "rope",
                                                   "qkv_fused": False, "num_kv_heads": 2})])
def test_qk_norm_equals_timms_switch(kind, kw):
    """On timm's own q_norm/k_norm slots the patched model is timm's qk_norm=True model: the same state_dict keys,
    and with the same weights loaded the same outputs."""
    model, native = _timm_pair(kind, **kw)
    rep = apply(model, "qk_norm")
    assert all("native" in e.detail for e in rep.entries)
    assert list(model.state_dict()) == list(native.state_dict())
    native.load_state_dict(model.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), native(x), rtol=0, atol=0)


def _scale_queries(model, factor: float) -> None:
    """Multiply the query projection (weight rows and bias of the q columns) of every token-softmax site (those
    that carry the norm) by `factor`."""
    with torch.no_grad():
        for site in find_attention(model):
            if site.form.over != "tokens" or "q" not in site.proj:  # (GCViT's global attention: no W_Q, skipped)
                continue
            p = site.proj["q"]
            w = stored_weight(p)
            if p.transposed:
                w[:, p.cols] *= factor
            else:
                w[p.cols] *= factor
            bias = getattr(site.module, "q_bias", None) if not p.called else getattr(p.linear, "bias", None)
            if bias is not None:
                bias[p.cols if bias.shape[0] > p.out_features else slice(None)] *= factor


# DETR's decoder queries start at about 1e-3 (embeddings and weights both drawn with std 0.02), where the norm's
# eps = 1e-6 is not negligible against the variance: the invariance holds there only up to eps
@pytest.mark.parametrize("name", [n for n in NAMES if ("qk_norm", n) not in REFUSED and n != "detr"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_qk_norm_output_is_invariant_to_rescaling_the_query_projection(name, norm):
    """LayerNorm / RMSNorm of c·q is that of q: scaling W_Q (and its bias) by 4 leaves the model's output as it was,
    where the same scaling moves the model without QK-norm."""
    case = CASES[name]
    model, inputs = case.build(), case.inputs()
    plain = copy.deepcopy(model)
    apply(model, "qk_norm", norm=norm)
    ref = output(case, model, inputs)
    _scale_queries(model, 4.0)
    _scale_queries(plain, 4.0)
    torch.testing.assert_close(output(case, model, inputs), ref, rtol=1e-3, atol=1e-4)
    assert not torch.equal(output(case, plain, inputs), output(case, case.build(), inputs))  # without: it moves


# ---------------------------------------------------------------- sigma_reparam


def _reparams(model):
    """Every σReparam block: (holder, suffix, torch-layout rows of the stored weight, γ)."""
    out = []
    for m in model.modules():
        for name, g in m._parameters.items():
            if name.startswith("sigma_gamma") and g is not None:
                out.append((m, name[len("sigma_gamma"):], g))
    return out


def _sigma_blocks(model, partition: str):
    """(γ, stored v, torch-layout W_b) of every σReparam block of the attention sites."""
    from condattn.conditioning.sites import as_matrix

    seen, out = set(), []
    for site in find_attention(model):
        for role, p in site.proj.items():
            w = as_matrix(stored_weight(p).detach())
            w = w.T if p.transposed else w
            if partition == "fused":
                suffix, rows = ("" if p.param == "weight" else f"_{p.param}"), None
            else:
                suffix, rows = (f"_{role}" if p.param == "weight" else f"_{p.param}_{role}"), p.rows
            if (id(p.linear), suffix) in seen:
                continue
            seen.add((id(p.linear), suffix))
            out.append((getattr(p.linear, f"sigma_gamma{suffix}"), getattr(p.linear, f"sigma_v{suffix}"),
                        w if rows is None else w[rows]))
    return out


@pytest.mark.parametrize("partition", ["fused", "per_role"])
@pytest.mark.parametrize("name", ["vit", "eva02", "bert", "gpt2", "torch_mha", "llama"])
def test_sigma_reparam_is_invariant_to_rescaling_the_weight_and_keeps_sigma_max_at_gamma(name, partition):
    """Ŵ = γ/σ(W)·W: the output does not move when every reparametrised weight is scaled by 3; after training-mode
    forwards on a perturbed W, the power iteration has converged and σ_max(Ŵ) = γ for every block; eval forwards
    leave the stored v alone."""
    from condattn.conditioning.methods.sigma_reparam import power_step

    case = CASES[name]
    model, inputs = case.build(), case.inputs()
    apply(model, "sigma_reparam", partition=partition)
    with torch.no_grad():  # move W away from the SVD the buffers started at
        for site in find_attention(model):
            for p in site.proj.values():
                stored_weight(p).add_(0.03 * stored_weight(p).std() * torch.randn_like(stored_weight(p)))
    model.train()
    for _ in range(60):
        case.run(model, inputs)
    model.eval()
    buffers = {k: v.clone() for k, v in model.state_dict().items() if "sigma_v" in k}
    ref = output(case, model, inputs)
    assert buffers and all(torch.equal(model.state_dict()[k], v) for k, v in buffers.items())  # not stored in eval
    blocks = _sigma_blocks(model, partition)
    assert len(blocks) == len(_reparams(model))
    for gamma, v, w in blocks:
        u, v_new = power_step(w, v)
        w_hat = gamma / (u @ w @ v_new) * w
        torch.testing.assert_close(torch.linalg.matrix_norm(w_hat, ord=2), gamma.detach(), rtol=1e-3, atol=0)
    with torch.no_grad():
        for site in find_attention(model):
            for p in site.proj.values():
                stored_weight(p).mul_(3.0)
    torch.testing.assert_close(output(case, model, inputs), ref, rtol=1e-4, atol=1e-5)


def test_sigma_reparam_trains_gamma_and_all_linear_covers_every_linear():
    case = CASES["vit"]
    model, inputs = case.build(), case.inputs()
    rep = apply(model, "sigma_reparam", scope="all_linear")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Conv2d)]
    assert {m for m, _, _ in _reparams(model)} == set(linears)
    assert any(e.kind == "sigma_reparam:linear" for e in rep.entries)
    model.train()
    case.run(model, inputs).square().mean().backward()
    assert all(g.grad is not None and torch.isfinite(g.grad) for _, _, g in _reparams(model))
    with pytest.raises(ValueError, match="scope='every' is invalid"):
        apply(case.build(), "sigma_reparam", scope="every")


# ---------------------------------------------------------------- mimetic_init


def _qk_vo(model, site):
    """Per head h the paper's D × D products W_Q^h W_K^hᵀ, and W_V W_O over all heads."""
    d = site.head_dim
    wq, wk, wv = site.weight("q"), site.weight("k"), site.weight("v")
    group = wq.shape[0] // wk.shape[0]
    qk = [wq[h * d:(h + 1) * d].T @ wk[(h // group) * d:(h // group + 1) * d] for h in range(site.num_heads)]
    out = output_projection(model, site)
    wo = out.weight().detach()
    wo = wo.T if out.transposed else wo  # torch layout (D, H·d)
    if group > 1:  # each kv head's values reach the W_O columns of its query heads
        wv = torch.cat([wv[(h // group) * d:(h // group + 1) * d] for h in range(site.num_heads)])
    return qk, wv.T @ wo.T


def _diag_off(p: torch.Tensor) -> tuple[float, float]:
    off = p - torch.diag(torch.diag(p))
    return float(p.diagonal().mean()), float(off.abs().sum() / (p.numel() - p.shape[0]))


def test_mimetic_single_head_products_are_the_targets():
    """One head of the full width: W_Q W_Kᵀ = α₁Z + β₁I and W_V W_O = α₂Z − β₂I exactly (full rank), so the mean
    diagonal is β₁ (resp. −β₂) up to Z's own diagonal, and the off-diagonal is Z's scale α/√D."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                              num_heads=1, depth=2, num_classes=10)
    torch.manual_seed(0)  # (the draws of Z use torch's global RNG, which the trainer seeds)
    apply(model, "mimetic_init")
    for site in find_attention(model):
        (qk,), vo = _qk_vo(model, site)
        diag, off = _diag_off(qk)
        assert abs(diag - 0.7) < 0.05 and off < 0.1, (diag, off)
        diag, off = _diag_off(vo)
        assert abs(diag + 0.4) < 0.05 and off < 0.06, (diag, off)


@pytest.mark.parametrize("method", ["mimetic_init", "conditioned_init"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_init_methods_draw_in_float32_under_a_half_precision_default(method, dtype):
    """transformers builds a model under torch_dtype=fp16/bf16 with torch's default dtype set to it: the init methods
    draw and factor in float32 anyway (no half-precision SVD/QR on a CPU) and write the weights in their own dtype,
    equal to the float32 init cast. Before: "svd_cpu" / "geqrf_cpu" not implemented for 'Half'."""
    import timm

    def built():
        torch.manual_seed(0)
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                                 num_heads=2, depth=1, num_classes=10)

    ref = built()
    torch.manual_seed(1)
    apply(ref, method)
    half = built().to(dtype)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(1)
        apply(half, method)
    finally:
        torch.set_default_dtype(old)
    w, w_ref = half.blocks[0].attn.qkv.weight, ref.blocks[0].attn.qkv.weight
    assert w.dtype == dtype and torch.equal(w, w_ref.to(dtype))


@pytest.mark.parametrize("name", ["vit", "swin", "bert", "gpt2", "detr", "rope_vit_gqa", "llama", "hf_vit"])
def test_mimetic_per_head_products_have_the_identity_components(name):
    """Several heads: each W_Q^h W_K^hᵀ is the rank-head_dim part of α₁Z + β₁I, whose diagonal is positive and
    well above its off-diagonal entries; W_V W_O (rank H·d) keeps −β₂ on the diagonal. Before: neither."""
    case = CASES[name]
    model = case.build()
    before = [_qk_vo(model, s) for s in find_attention(model)]
    apply(model, "mimetic_init")
    for site, (_, vo0) in zip(find_attention(model), before):
        qk, vo = _qk_vo(model, site)
        for p in qk:
            diag, off = _diag_off(p)
            assert diag > 0.1 and diag > 2.5 * off, (site.name, diag, off)
        diag, off = _diag_off(vo)
        if site.weight("v").shape[0] == vo.shape[0]:  # full rank: the target itself
            assert abs(diag + 0.4) < 0.05, (site.name, diag)
        assert -diag > 0.1 and -diag > 2.5 * off, (site.name, diag, off)  # (GQA: rank Hkv·d)
        assert abs(_diag_off(vo0)[0]) < 0.1


# ---------------------------------------------------------------- ns_attention


def _wo_inputs(model, case, inputs) -> list[torch.Tensor]:
    """The input of every site's W_O, as its forward receives it (after any pre-hook registered before)."""
    seen, handles = [], []
    for site in find_attention(model):
        out = output_projection(model, site)
        handles.append(out.module.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach())))
    output(case, model, inputs)
    for h in handles:
        h.remove()
    return seen


def _flatness(x: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample and head: σ_min/σ_max and the entropy of the normalised singular values."""
    s = torch.linalg.svdvals(x.unflatten(-1, (heads, -1)).transpose(-2, -3).double())
    p = s / s.sum(-1, keepdim=True)
    return s[..., -1] / s[..., 0], -(p * p.clamp_min(1e-30).log()).sum(-1)


@pytest.mark.parametrize("name", [n for n in NAMES if ("ns_attention", n) not in REFUSED])
def test_ns_attention_flattens_each_heads_spectrum(name):
    """At the first attention layer (whose input both models share) every head output's spectrum is flatter after
    NS-attention: σ_min/σ_max and the entropy of the normalised singular values rise on average; its Frobenius
    norm is kept."""
    case = CASES[name]
    base, model, inputs = case.build(), case.build(), case.inputs()
    apply(model, "ns_attention")
    site = find_attention(model)[0]
    x0, x1 = _wo_inputs(base, case, inputs)[0], _wo_inputs(model, case, inputs)[0]
    if x0.dim() == 3 and x0.shape[1] > 1 and case.keep(inputs) is not None and site.masked_queries:
        keep = case.keep(inputs)
        if keep.shape == x0.shape[:2]:
            assert torch.equal(x1[~keep], x0[~keep])  # padded tokens untouched
            x0, x1 = x0[:1], x1[:1]  # sample 0 is unpadded
    r0, e0 = _flatness(x0, site.num_heads)
    r1, e1 = _flatness(x1, site.num_heads)
    assert r1.mean() > r0.mean() and e1.mean() > e0.mean(), (r0.mean(), r1.mean(), e0.mean(), e1.mean())


def test_ns_heads_is_one_quintic_step_on_the_normalised_matrix():
    g = torch.Generator().manual_seed(0)
    o = torch.randn(2, 3, 10, 4, generator=g)
    y = ns_heads(o)
    for b in range(2):
        for h in range(3):
            x = o[b, h].T  # d × N
            n = torch.linalg.matrix_norm(x)
            xn = x / n
            a = xn @ xn.T
            want = (3.4445 * xn + (-4.7750 * a + 2.0315 * a @ a) @ xn) * n
            torch.testing.assert_close(y[b, h].T, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ns_heads(o, steps=0), o * 1.0) or torch.allclose(ns_heads(o, steps=0), o)


@pytest.mark.parametrize("method", METHODS)
def test_the_patch_report_counts_each_methods_layers(method):
    """PatchReport.check (the trainer's assertion against model.attention_layers) counts the registered methods'
    entries, and their skipped sites, as it counts SCA's."""
    rep = apply(CASES["vit"].build(), method)
    rep.check(attention_layers=2)
    with pytest.raises(RuntimeError, match=f"{method} patched 2 attention layers, the model config expects 3"):
        rep.check(attention_layers=3)
    if method in ("qk_norm", "mimetic_init"):  # XCiT: 2 channel-softmax layers skipped with why, 2 class-attention
        xcit = apply(CASES["xcit"].build(), method)
        assert len(xcit.skipped) == 2
        xcit.check(attention_layers=4)


def test_ns_attention_forgets_the_mask_of_the_previous_call():
    """A call without an attention mask after a padded call: every token is real again (no stale mask)."""
    case = CASES["bert"]
    model, fresh, inputs = case.build(), case.build(), case.inputs()
    fresh.load_state_dict(model.state_dict())
    apply(model, "ns_attention")
    apply(fresh, "ns_attention")
    unmasked = {k: v for k, v in inputs.items() if k != "attention_mask"}
    output(case, model, inputs)  # the padded call
    torch.testing.assert_close(output(case, model, unmasked), output(case, fresh, unmasked), rtol=0, atol=0)
