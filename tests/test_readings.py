"""The readings of the two papers that table 9 compares (configs/conditioning/_options.yaml): SCA's correction=svd
(Theorem 3.5, refreshed), mode=init, lam_unit; conditioned_init; CET's scale=norm and before_pos_embed per vision
layout; the saturation diagnostics against a hand computation; and the table 9 renderer."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import tiny_vit, vit_inputs

import condattn
from condattn.conditioning import find_attention, find_tokens, polar_correction

pytestmark = pytest.mark.usefixtures("one_thread")


def kappa(m: torch.Tensor) -> float:
    """κ of a matrix, or the largest κ of a batch of matrices."""
    s = torch.linalg.svdvals(m.double())
    return float((s[..., 0] / s[..., -1]).max())


def effective_map(lin: torch.nn.Module) -> torch.Tensor:
    """The (out, in) matrix a Linear really applies, read from its input→output map: lin(I) − lin(0)."""
    eye = torch.eye(lin.in_features)
    with torch.no_grad():
        return (lin(eye) - lin(torch.zeros(1, lin.in_features))).T


def natural_images(b: int = 4, size: int = 224) -> torch.Tensor:
    """Smooth, spatially correlated images (low-pass noise): natural-image-like statistics, offline."""
    g = torch.Generator().manual_seed(0)
    return torch.nn.functional.interpolate(torch.randn(b, 3, 14, 14, generator=g), size=size, mode="bilinear")


def vit_small():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_224", pretrained=False).eval()


# ---------------------------------------------------------------- SCA correction=svd


@pytest.mark.parametrize("identity", ["full", "per_head"])
@pytest.mark.slow
def test_svd_correction_bounds_kappa_from_the_layers_map_and_keeps_attention_spread(identity):
    from condattn.diagnostics import cheap_diagnostics

    model = vit_small()
    rep = condattn.apply_conditioning(model, "spectral", correction="svd", identity=identity)
    assert rep.counts == {"spectral:timm_fused_qkv": 12} and any("correction=svd" in n for n in rep.notes)
    x = natural_images(b=2)
    diag = cheap_diagnostics(model, lambda m, b: m(b), x)  # first forward computes C
    for site in find_attention(model):
        m = effective_map(site.proj["q"].linear)  # (3D, D): [W_Q + C_Q; W_K + C_K; W_V + C_V] in torch layout
        for role in "qkv":
            block = m[site.proj[role].cols]
            if identity == "full":
                assert kappa(block) <= 2.05, (site.name, role)
            else:
                heads = block.reshape(site.num_heads, site.head_dim, -1)
                assert kappa(heads) <= 2.05, (site.name, role)
    att0 = diag["attention"][0]
    assert att0["entropy"] >= 0.5 * att0["entropy_uniform"]
    # the paper's λI at λ = 10 on the same images: one-hot self-attention (what svd avoids)
    sat = vit_small()
    condattn.apply_conditioning(sat, "spectral")
    d = cheap_diagnostics(sat, lambda m, b: m(b), x)["attention"][0]
    assert d["entropy"] < 0.2 * d["entropy_uniform"] and d["self_argmax"] > 0.9


def test_svd_correction_is_refreshed_every_n_weight_updates_and_detached():
    model = tiny_vit().train()
    condattn.apply_conditioning(model, "spectral", correction="svd", refresh_every=2)
    lin = model.blocks[0].attn.qkv
    shift = lin._condattn_shift
    x = vit_inputs()["x"]
    model(x)
    assert shift.refreshes == 1
    c0 = shift.delta_weight().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    refreshes = []
    for _ in range(4):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        model(x)  # a forward after the update sees the new weight version
        refreshes.append(shift.refreshes)
    assert refreshes == [1, 2, 2, 3]  # recomputed after every 2nd optimizer step, held in between
    assert not torch.equal(shift.delta_weight(), c0)
    # C is the current weights' Theorem 3.5 correction: κ(W + C) ≤ 2 per block, and C = σ_max·polar(W)
    site = find_attention(model)[0]
    w = lin.weight.detach()[site.proj["q"].cols]
    u, s, vh = torch.linalg.svd(w)
    torch.testing.assert_close(shift.delta_weight()[site.proj["q"].cols], s[0] * u @ vh, rtol=1e-4, atol=1e-5)
    assert kappa(effective_map(lin)[site.proj["k"].cols]) <= 2.05
    # detached: the weight's gradient is that of a plain Linear with the constant weight W + C
    xin = torch.randn(5, lin.in_features)
    lin.weight.grad = None
    lin(xin).sum().backward()
    ref = torch.nn.Linear(lin.in_features, lin.out_features)
    with torch.no_grad():
        ref.weight.copy_(lin.weight)
        ref.bias.copy_(lin.bias)
    ref(xin).sum().backward()
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
    # eval-mode forwards do not count as updates
    before = shift.refreshes
    with torch.no_grad():
        model.eval()(x)
        model(x)
    assert shift.refreshes == before


def test_svd_correction_state_dict_unchanged_and_removable():
    base = tiny_vit()
    model = tiny_vit()
    condattn.apply_conditioning(model, "spectral", correction="svd")
    assert list(model.state_dict()) == list(base.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
    x = vit_inputs()
    with torch.no_grad():
        assert not torch.allclose(model(**x), base(**x))
    condattn.remove_conditioning(model)
    with torch.no_grad():
        torch.testing.assert_close(model(**x), base(**x), rtol=0, atol=0)


# ---------------------------------------------------------------- SCA mode=init and lam_unit


@pytest.mark.parametrize("correction", ["identity", "svd"])
@pytest.mark.slow
def test_mode_init_leaves_plain_linears_holding_original_plus_shift(correction):
    base = vit_small()
    model = copy.deepcopy(base)
    rep = condattn.apply_conditioning(model, "spectral", mode="init", correction=correction, lam=10.0)
    assert any("mode=init" in n for n in rep.notes) and "mode=init" in str(rep)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert not any(hasattr(m, "_condattn_shift") for m in model.modules())
    assert list(model.state_dict()) == list(base.state_dict())
    for site, ref in zip(find_attention(model), find_attention(base)):
        w0, w1 = ref.proj["q"].linear.weight.detach(), site.proj["q"].linear.weight.detach()
        for role in "qkv":
            cols = site.proj[role].cols
            if correction == "identity":
                shift = 10.0 * torch.eye(cols.stop - cols.start, w0.shape[1])
            else:
                u, s, vh = torch.linalg.svd(w0[cols])
                shift = s[0] * u @ vh
            torch.testing.assert_close(w1[cols], w0[cols] + shift, rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="mode=init set the weights. values once"):
        condattn.remove_conditioning(model)


def test_mode_init_shift_is_trained_and_decayed():
    model = tiny_vit().train()
    condattn.apply_conditioning(model, "spectral", mode="init", lam=10.0)
    lin = model.blocks[0].attn.qkv
    diag0 = lin.weight.detach().diagonal().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.5)
    for _ in range(3):
        opt.zero_grad()
        model(vit_inputs()["x"]).square().mean().backward()
        opt.step()
    assert float(lin.weight.detach().diagonal().mean()) < float(diag0.mean()) - 0.1  # the λI part decays


@pytest.mark.parametrize("unit", ["init_std", "sigma_max"])
def test_lam_unit_scales_the_identity_by_the_block_at_application(unit):
    model = tiny_vit()
    w = model.blocks[0].attn.qkv.weight.detach().clone()
    condattn.apply_conditioning(model, "spectral", lam=0.5, lam_unit=unit, identity="per_head")
    site = find_attention(model)[0]
    shift = site.proj["q"].linear._condattn_shift
    delta = shift.delta_weight()
    for role in "qkv":
        for h in range(site.num_heads):
            rows = slice(site.proj[role].cols.start + h * site.head_dim,
                         site.proj[role].cols.start + (h + 1) * site.head_dim)
            blk = w[rows]
            unit_v = blk.std() if unit == "init_std" else torch.linalg.matrix_norm(blk, ord=2)
            expect = 0.5 * float(unit_v) * torch.eye(site.head_dim, w.shape[1])
            torch.testing.assert_close(delta[rows], expect)
    assert torch.equal(effective_map(site.proj["q"].linear), w + delta) or \
        torch.allclose(effective_map(site.proj["q"].linear), w + delta, atol=1e-5)


@pytest.mark.parametrize("opts, match", [
    ({"correction": "exact"}, r"correction='exact' is invalid; choose one of \['identity', 'svd'\]"),
    ({"mode": "trained"}, r"mode='trained' is invalid; choose one of \['fixed', 'init'\]"),
    ({"lam_unit": "std"}, "lam_unit='std' is invalid"),
    ({"refresh_every": 0}, "refresh_every=0 must be an integer >= 1"),
    ({"refresh_every": "x"}, "refresh_every='x' must be an integer >= 1"),
    ({"scale": "unit"}, r"scale='unit' is invalid; choose one of \['keep', 'norm'\]"),
])
def test_bad_reading_options_are_refused(opts, match):
    with pytest.raises(ValueError, match=match):
        condattn.apply_conditioning(tiny_vit(), "spectral", **opts)


def test_none_stays_bit_identical_whatever_the_reading_options():
    base, model = tiny_vit(), tiny_vit()
    from condattn.conditioning.spec import conditioning_spec

    # a config node carries every option (the Hydra group holds them all); the baseline ignores the readings' options
    spec = conditioning_spec({"method": "none", "correction": "svd", "mode": "init", "lam_unit": "sigma_max",
                              "scale": "norm"})
    rep = condattn.apply_conditioning(model, spec)
    assert rep.counts == {} and rep.options == {}
    x = vit_inputs()
    with torch.no_grad():
        assert torch.equal(model(**x), base(**x))


# ---------------------------------------------------------------- conditioned_init


def test_conditioned_init_per_head_semi_orthogonal_qk_and_identity_v():
    base = vit_small()
    model = copy.deepcopy(base)
    rep = condattn.apply_conditioning(model, "conditioned_init")
    rep.check(attention_layers=12)
    assert rep.counts == {"conditioned_init:timm_fused_qkv": 12} and rep.notes
    assert list(model.state_dict()) == list(base.state_dict())
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    for site in find_attention(model):
        for role in "qk":
            heads = torch.stack([site.head_weight(role, h) for h in range(site.num_heads)])
            assert kappa(heads) <= 1.01
        # independent draws: W_Q and W_K of a head differ, and different heads are not one orthogonal matrix's rows
        assert not torch.allclose(site.head_weight("q", 0), site.head_weight("k", 0))
        cross = site.head_weight("q", 0) @ site.head_weight("q", 1).T
        assert float(cross.abs().max()) > 1e-3
        torch.testing.assert_close(site.weight("v"), torch.eye(site.weight("v").shape[0], site.weight("v").shape[1]))
    with pytest.raises(RuntimeError, match="conditioned_init set the weights' values once"):
        condattn.remove_conditioning(model)
    per_head = copy.deepcopy(base)
    condattn.apply_conditioning(per_head, "conditioned_init", identity="per_head")
    s = find_attention(per_head)[0]
    for h in range(s.num_heads):  # every head's W_V is the same top-left rectangular identity
        torch.testing.assert_close(s.head_weight("v", h), torch.eye(s.head_dim, s.weight("v").shape[1]))


# ---------------------------------------------------------------- CET scale=norm and before_pos_embed


def test_cet_scale_norm_keeps_kappa_and_the_frobenius_norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 32, generator=g) * torch.logspace(0, 2, 32)
    mask = torch.ones(3, 17, dtype=torch.bool)
    mask[1, 12:] = False
    keep = polar_correction(x, mask, solver="svd")
    norm = polar_correction(x, mask, solver="svd", scale="norm")
    for b in range(3):
        rows = mask[b]
        assert kappa(norm[b, rows]) == pytest.approx(kappa(keep[b, rows]), rel=1e-5)
        assert float(norm[b, rows].norm()) == pytest.approx(float(x[b, rows].norm()), rel=1e-5)
        assert kappa(norm[b, rows]) <= 2.0 + 1e-5
    assert torch.equal(norm[1, 12:], x[1, 12:])  # padded rows untouched


def test_cet_before_pos_embed_patches_only_on_vit_corrects_the_raw_patch_embeddings():
    model = tiny_vit()
    rep = condattn.apply_conditioning(model, "embedded", position="before_pos_embed", tokens="patches_only",
                                      solver="svd")
    assert rep.entries[0].module == "patch_embed" and not rep.notes
    seen = {}
    h = find_tokens(model).embed.register_forward_hook(lambda m, a, out: seen.update(x=out))  # after CET's hook
    with torch.no_grad():
        model(**vit_inputs())
    h.remove()
    assert seen["x"].shape[1] == 16  # the 16 patches, no class token yet
    assert kappa(seen["x"]) <= 2.0 + 1e-4


# ---------------------------------------------------------------- saturation diagnostics, by hand


def test_saturation_diagnostics_match_a_hand_computation():
    from condattn.diagnostics import cheap_diagnostics, grad_diagnostics

    model = tiny_vit()
    condattn.apply_conditioning(model, "spectral", lam=1.0)
    x = vit_inputs()["x"]
    diag = cheap_diagnostics(model, lambda m, b: m(b), x)
    flat = diag["flat"]
    # by hand: block i's input through norm1 and the (shifted) qkv, softmax(q kᵀ · scale) per head
    inputs = {}
    hooks = [b.register_forward_pre_hook(lambda m, a, i=i: inputs.update({i: a[0]}))
             for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        model(x)
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
    for h in hooks:
        h.remove()
    for i, blk in enumerate(model.blocks):
        attn = blk.attn
        with torch.no_grad():
            qkv = attn.qkv(blk.norm1(inputs[i]))
        b, n, _ = qkv.shape
        q, k, _ = qkv.reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        p = torch.softmax(q @ k.transpose(-1, -2) * attn.scale, dim=-1)  # (B, H, N, N)
        self_share = float((p.argmax(-1) == torch.arange(n)).float().mean())
        cls_self = float(p[:, :, 0, 0].mean())
        assert flat[f"self_argmax/l{i}"] == pytest.approx(self_share, abs=1e-6)
        assert flat[f"cls_self/l{i}"] == pytest.approx(cls_self, rel=1e-4)
    f = feats.reshape(feats.shape[0], -1)
    spread = float((f - f.mean(0)).norm(dim=1).mean() / f.norm(dim=1).mean())
    assert flat["feature_spread"] == pytest.approx(spread, rel=1e-4)
    model.zero_grad()
    model(x).logsumexp(-1).mean().backward()
    g = grad_diagnostics(model)["gradnorm_embed"]
    by_hand = torch.cat([p.grad.flatten() for p in model.patch_embed.parameters()]).double().norm()
    assert g == pytest.approx(float(by_hand), rel=1e-6)


@pytest.mark.slow
def test_saturated_sca_shows_input_independent_features_and_no_embedding_gradient():
    from condattn.diagnostics import cheap_diagnostics, grad_diagnostics

    model = vit_small()
    condattn.apply_conditioning(model, "spectral", lam=10.0)
    x = natural_images(b=2)
    flat = cheap_diagnostics(model, lambda m, b: m(b), x)["flat"]
    assert flat["cls_self/mean"] > 0.99 and flat["feature_spread"] < 1e-3
    model.zero_grad()
    model(x).logsumexp(-1).mean().backward()
    assert grad_diagnostics(model)["gradnorm_embed"] < 1e-6


# ---------------------------------------------------------------- table 9: experiment and renderer


def test_a_step0_mean_counts_the_runs_that_recorded_it():
    from condattn.reporting.readings import _fmt
    from condattn.table.step0 import step0

    d0 = [{"maxprob/mean": 0.2, "entropy/mean": 1.0, "entropy_uniform/mean": 2.0}, {"maxprob/mean": 0.4},
          {"maxprob/mean": float("nan")}, {}]  # a NaN and an absent value are not values
    got = {s.key: s for s in step0([{"diagnostics": {"step0": d}} for d in d0] + [{}])}
    assert (got["maxprob"].mean, got["maxprob"].n, got["maxprob"].of) == (pytest.approx(0.3), 2, 5)
    assert _fmt(got["maxprob"]) == "0.300 (n=2)" and _fmt(got["entropy_share"]) == "0.500 (n=1)"
    assert (got["gradnorm_wq"].mean, got["gradnorm_wq"].n) == (None, 0) and _fmt(got["gradnorm_wq"]) == "–"
    every = {s.key: s for s in step0([{"diagnostics": {"step0": {"maxprob/mean": 0.2}}}] * 2)}
    # every run recorded it: no n beside the mean
    assert _fmt(every["maxprob"]) == "0.200" and _fmt(every["maxprob"], sci=True) == "2.00e-01"


def test_table9_renderer_from_run_summaries(tmp_path):
    from helpers import experiment_raw, plan_of, typed

    from condattn.reporting.readings import write_table

    exp = experiment_raw("table9_readings")
    tasks = {spec["task"] for spec in exp["rows"].values()}
    assert tasks == {"vit", "listops", "vit_hard", "vit_hard_qkn", "vit_noaug"}
    # the committed small scale trains the ViT tasks and says why ListOps waits; rendered here with vit and listops
    small_rows = exp["scales"]["small"]["rows"]
    assert all(r.startswith("vit_") for r in small_rows) and len(small_rows) == 15 + 17 + 13
    exp["rows"] = {r: spec for r, spec in exp["rows"].items() if spec["task"] in ("vit", "listops")}
    readings = {r.split("_", 1)[1] for r in exp["rows"]}
    assert len(readings) == 15
    assert "ListOps is left out at this scale" in exp["notes"]["small"]
    exp["scales"]["small"] = {k: v for k, v in exp["scales"]["small"].items() if k not in ("rows", "family_seeds")}
    t = typed(exp)
    runs = tmp_path / "runs"
    for row, spec in exp["rows"].items():
        (method,) = t.methods_of(row)
        metric = t.row_metric("small", row)  # the small ViT rows report their test split
        assert metric == ("final_test_acc" if spec["task"] == "vit" else "test_acc")
        for seed in (0, 1, 2):
            if row == "vit_cet_norm" and seed == 2:
                continue  # a missing cell
            d = runs / "small" / f"{exp['table']}_{row}_{method}_small_s{seed}"
            d.mkdir(parents=True)
            good = row.endswith("svd_full")
            acc = (0.8 if good else 0.5) + 0.01 * seed
            step0 = {"entropy/mean": 2.0, "entropy_uniform/mean": 2.5, "maxprob/mean": 0.2, "self_argmax/mean": 0.1,
                     "gradnorm_wq/mean": 1e-2, "cls_self/mean": 0.3, "feature_spread": 0.5}
            if row == "vit_sca10" and seed == 1:
                step0.pop("maxprob/mean")  # one run did not record it: its mean is over 2 of 3 runs
            summary = {"status": "finished", "run_dir": str(d), "metrics": {metric: acc}, "steps": 10,
                       "wall_time_s": 3.0, "diagnostics": {"step0": step0}, "data": {"stand_in": True}}
            (d / "summary.json").write_text(json.dumps(summary))
    md_path, md = write_table(plan_of(t, "small", runs, tmp_path / "results", [0, 1, 2]))
    assert md_path.name == "table9_readings.md"
    assert "**vit** (`final_test_acc`)" in md and "**listops** (`test_acc`)" in md
    # no lr grid, no curves: lr and steps-to-target are "–"; the baseline has no test of its own
    assert ("| baseline (no conditioning) | baseline | 51.00 ± 1.00 (n=3) | (baseline) | – | – | – | – | – | – | "
            "0.800 | 0.200 | 0.100 | 1.00e-02 |") in md
    assert "missing seeds [2]" in md
    # a primary row equal to the baseline: p = 1, no difference, with the MDE at α = 0.05 and at 0.05/7 (7 primaries)
    assert "| SCA λ = 10, λI fixed (the paper as read) | primary | 51.00 ± 1.00 (n=3) | +0.00 [" in md
    sca = next(x for x in md.splitlines() if x.startswith("| SCA λ = 10, λI fixed (the paper as read) |"))
    assert sca.endswith("| 0.800 | 0.200 (n=2) | 0.100 | 1.00e-02 |")  # a mean over 2 of its 3 runs says so
    assert "| 1.000 / 1.000 / 1.000 | no difference detected (MDE " in md
    # the exploratory svd_full row is far above: its BH q, its label, and the closing verdict says so
    assert "| exploratory | 81.00 ± 1.00 (n=3) | +30.00 [" in md and "| better (exploratory) |" in md
    assert "better than the baseline: vit: SCA Theorem 3.5 C = σ_max·UVᵀ, full D×D block" in md
    assert "Convergence (vit): not tested yet" in md
    csv = (md_path.parent / "table9_readings.csv").read_text().splitlines()
    assert len(csv) == 1 + 30 and "step0_feature_spread" in csv[0]
    for col in ("hypothesis", "p_welch", "p_adjusted", "p_permutation", "verdict", "mde_corrected", "diff_2x", "code"):
        assert col in csv[0].split(","), col
