"""GCViT (layouts/timm_gcvit.py): its global attention has no W_Q (the queries are the stage's global query tokens,
not a projection of x), so under the stated reading SCA adds λI to W_K and W_V only, and each such site's PatchReport
entry says so. The other methods act on the roles the site has or skip it in one line; diagnostics of its W_Q are
absent with the reason. The contract tests of tests/test_layouts.py run on a small GCViT too (CASES: gcvit)."""

from __future__ import annotations

import copy
import math

import pytest
import timm
import torch
from helpers import assert_identical, snapshot

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning.layouts.timm_gcvit import NOTE
from condattn.conditioning.sites import attention_layers

pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("gcvit_xxtiny", pretrained=False).eval()


def _image() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))


def _global(model) -> list:
    return [s for s in find_attention(model) if "q" not in s.proj]


def test_every_attention_layer_is_patched_global_ones_on_wk_wv_only():
    """gcvit_xxtiny: 12 of 12 attention layers, 6 of them global (k/v only, the note in their entry); each global
    qkv's W_K / W_V blocks are W0 + λI (the parameter keeps W0) and the model equals the one with W0 + λI written
    into qkv; the output changes in eval, removal restores it bit-exactly, state_dict keys never change."""
    model, x, lam = _model(), _image(), 2.0
    keys, explicit = list(model.state_dict()), copy.deepcopy(model)
    with torch.no_grad():
        ref = model(x)
    assert len(attention_layers(model)) == 12
    rep = condattn.apply_conditioning(model, "spectral", lam=lam)
    rep.check(attention_layers=12)
    assert rep.counts == {"spectral:timm_gcvit": 12} and not rep.skipped
    glob = {s.name for s in _global(model)}
    assert len(glob) == 6
    for e in rep.entries:
        if e.module in glob:
            assert e.detail.startswith("k/v ") and e.detail.endswith(NOTE), e.detail
        else:
            assert e.detail.startswith("q/k/v ") and NOTE not in e.detail, e.detail
    modules = dict(explicit.named_modules())
    for site in _global(model):
        w0 = site.module.qkv.weight.detach()
        dim = w0.shape[1]
        assert w0.shape == (2 * dim, dim) and torch.equal(w0, modules[site.name].qkv.weight)  # parameter: W0
        for role, rows in (("k", slice(0, dim)), ("v", slice(dim, 2 * dim))):
            torch.testing.assert_close(site.weight(role), w0[rows] + lam * torch.eye(dim))
        with torch.no_grad():
            modules[site.name].qkv.weight += lam * torch.eye(dim).repeat(2, 1)
    for site in find_attention(model):
        if site.name not in glob:  # the local ones: all of [Q; K; V]
            with torch.no_grad():
                modules[site.name].qkv.weight += lam * torch.eye(site.module.qkv.in_features).repeat(3, 1)
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        out = model(x)
        assert not torch.equal(out, ref)
        torch.testing.assert_close(out, explicit(x), rtol=1e-4, atol=1e-4)
        condattn.remove_conditioning(model)
        assert torch.equal(model(x), ref)
    assert list(model.state_dict()) == keys
    assert not any("Shifted" in type(m).__name__ for m in model.modules())


def test_site_without_wq_says_why():
    (site, *_) = _global(_model())
    assert site.roles == ("k", "v") and set(site.missing) == {"q"}
    assert "global query tokens" in site.lacks("q") and site.lacks("k", "v") == ""
    with pytest.raises(KeyError, match="no W_Q: its queries are the stage's global query tokens"):
        site.weight("q")


@pytest.mark.slow  # every method / the diagnostics on the whole gcvit_xxtiny: seconds
def test_other_methods_act_on_the_roles_it_has_or_skip_it_in_one_line():
    """conditioned_init and sigma_reparam on W_K, W_V of the global sites; ns_attention before W_O of all 12; qk_norm
    and mimetic_init need W_Q: the global sites are listed as skipped with why; targets=[q] skips them too."""
    want = {"conditioned_init": (12, 0), "sigma_reparam": (12, 0), "ns_attention": (12, 0), "qk_norm": (6, 6),
            "mimetic_init": (6, 6)}
    for method, (n, skipped) in want.items():
        model = _model()
        rep = condattn.apply_conditioning(model, method)
        rep.check(attention_layers=12)
        assert (len(rep.entries), len(rep.skipped)) == (n, skipped), method
        assert all("no W_Q" in e.detail and "\n" not in e.detail for e in rep.skipped), method
        glob = {s.name for s in _global(model)}
        if method in ("conditioned_init", "sigma_reparam"):
            assert all(e.detail.startswith("k/v ") and "no W_Q" in e.detail for e in rep.entries if e.module in glob)
        if method == "conditioned_init":  # W_K semi-orthogonal per head, W_V the identity
            site = _global(model)[0]
            wk, wv = site.weight("k"), site.weight("v")
            for h in range(site.num_heads):
                blk = wk[h * site.head_dim:(h + 1) * site.head_dim]
                torch.testing.assert_close(blk @ blk.T, torch.eye(site.head_dim), rtol=1e-5, atol=1e-5)
            assert torch.equal(wv, torch.eye(wv.shape[0], wv.shape[1]))
    rep = condattn.apply_conditioning(_model(), "spectral", targets=["q"])
    assert rep.counts == {"spectral:timm_gcvit": 6} and len(rep.skipped) == 6
    assert "targets=['q']: no W_Q" in rep.skipped[0].detail
    rep.check(attention_layers=12)


def test_targets_selecting_no_role_of_any_layer_is_refused_and_changes_nothing():
    """A model whose only attention is GCViT's global attention: targets=[q] selects nothing; refused, unchanged."""
    torch.manual_seed(0)
    attn = timm.models.gcvit.WindowAttentionGlobal(32, num_heads=2, window_size=4, use_global=True).eval()

    class Global(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = attn

        def forward(self, x):
            return self.attn(x, x[:1])

    model, x = Global(), torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))
    before = snapshot(model, x)
    for method in ("spectral", "conditioned_init"):
        with pytest.raises(ValueError, match=rf"{method}: targets=\['q'\] selects no projection .*no W_Q"):
            condattn.apply_conditioning(model, method, targets=["q"])
        assert_identical(before, snapshot(model, x))
    with pytest.raises(ValueError, match="no W_Q"):
        condattn.apply_conditioning(model, "qk_norm")
    assert_identical(before, snapshot(model, x))
    from condattn.diagnostics import jacobian_kappa

    with pytest.raises(ValueError, match=r"κ\(J\) at attn: it has no W_Q"):
        jacobian_kappa(model, lambda m, b: m(b), x)


@pytest.mark.slow  # every method / the diagnostics on the whole gcvit_xxtiny: seconds
def test_diagnostics_of_the_missing_wq_are_absent_with_the_reason_and_entropy_is_the_modules_own():
    """weight κ of W_Q: None with the reason (no NaN, no flat key); gradient norms likewise; the global sites'
    entropy is that of the module's own softmax(q_global·kᵀ·scale + relative bias), computed here by hand."""
    from condattn.diagnostics import cheap_diagnostics, grad_diagnostics, qkv_grad_norms

    model, x = _model(), torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))  # (spread: B > 1)
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    sites = find_attention(model)
    glob = [i for i, s in enumerate(sites) if "q" not in s.proj]
    seen: dict[int, tuple] = {}
    handles = [sites[i].module.register_forward_pre_hook(lambda m, a, i=i: seen.setdefault(i, a)) for i in glob]
    diag = cheap_diagnostics(model, lambda m, b: m(b), x)
    for h in handles:
        h.remove()
    flat = diag["flat"]
    assert all(math.isfinite(v) for v in flat.values())
    for i, (w, a) in enumerate(zip(diag["weights"], diag["attention"])):
        assert a["absent"] is None and a["entropy"] is not None
        if i in glob:
            assert w["q"] is None and "global query tokens" in w["absent"]["q"]
            assert f"kappa_wq/l{i}" not in flat and f"kappa_wk/l{i}" in flat and f"entropy/l{i}" in flat
            assert a["self_argmax"] is None  # the queries are not the keys' tokens
            m, (xw, qg) = sites[i].module, seen[i]
            with torch.no_grad():
                b, n, c = xw.shape
                k = m.qkv(xw).reshape(b, n, 2, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)[0]
                q = qg.repeat_interleave(b // qg.shape[0], dim=0).reshape(b, n, m.num_heads, m.head_dim)
                p = m.rel_pos((q.transpose(1, 2) * m.scale) @ k.transpose(-2, -1)).softmax(-1)
                ent = float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())
            assert a["entropy"] == pytest.approx(ent, rel=1e-4)
        else:
            assert "absent" not in w and w["q"]["kappa"] >= 1.0
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    norms = qkv_grad_norms(model)
    assert all(norms[i]["q"] is None and "no W_Q" in norms[i]["absent"]["q"] and norms[i]["k"] > 0 for i in glob)
    g = grad_diagnostics(model)
    assert all(f"gradnorm_wq/l{i}" not in g and f"gradnorm_wk/l{i}" in g for i in glob)
