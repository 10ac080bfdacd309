"""Patching is atomic and strict, and a patched model keeps the contracts of torch and timm.

Every refusal of `apply_conditioning` leaves the model bit-identical (state_dict, module types, hooks, output); a
model with attention layers no layout matches is refused by default with the class named and the registration to
write, and patched with a warning under partial=True.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from helpers import assert_compiles_like_eager, assert_identical, snapshot
from torch import nn

import condattn
from condattn.conditioning import find_attention
from condattn.conditioning import sites as sites_mod
from condattn.conditioning.embedded import EmbeddedTokens

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]  # compat: scripts/compat.py


class OddAttention(nn.Module):
    """Attention whose projections are convolutions over neighbouring tokens (kernel 3), which no layout matches
    (a pointwise one, kernel 1, is matched by structure)."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.qkv = heads, nn.Conv1d(dim, 3 * dim, 3, padding=1)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x.transpose(1, 2)).transpose(1, 2).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return x + nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)


class Mixed(nn.Module):
    """One nn.MultiheadAttention (matched) and one OddAttention (not)."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.odd = OddAttention()

    def forward(self, x):
        return self.odd(x + self.mha(x, x, x, need_weights=False)[0])


class _TwoStacks(nn.Module):
    """Two stacks of attention layers (an encoder and a decoder of the user's own): which one's input is X is
    ambiguous, so CET's token site is not found by structure (an nn.TransformerEncoder alone is: torch_encoder)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleList([nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)])
        self.decoder = nn.ModuleList([nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)])

    def forward(self, x):
        return self.decoder[0](self.encoder[0](x))


def _tokens():
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))


def _pit():
    import timm

    return timm.create_model("pit_ti_224", pretrained=False, img_size=32, num_classes=10)


def _images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


REFUSALS = {  # (build, input, method, options, message)
    "cet_half_on_two_stacks": (_TwoStacks, _tokens, "spectral+embedded", {}, "cannot locate the first"),
    "cet_half_on_pit": (_pit, _images, "spectral+embedded", {}, "cannot locate the first"),
    "cet_half_mode_init": (_pit, _images, "spectral+embedded", {"mode": "init"}, "cannot locate the first"),
    "unmatched_attention": (Mixed, _tokens, "spectral", {}, "OddAttention"),
    "unmatched_conditioned_init": (Mixed, _tokens, "conditioned_init", {}, "OddAttention"),
    "no_attention": (lambda: nn.Sequential(nn.Linear(16, 16)), _tokens, "spectral", {}, "has no attention layer"),
    "no_tokens": (lambda: nn.Sequential(nn.Linear(16, 16)), _tokens, "embedded", {}, "cannot locate the first"),
    "bad_option": (_pit, _images, "spectral", {"identity": "diag"}, "identity='diag'"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_every_refusal_leaves_the_model_bit_identical(name):
    build, inputs, method, opts, match = REFUSALS[name]
    torch.manual_seed(0)
    model, x = build().eval(), inputs()
    before = snapshot(model, x)
    with pytest.raises(ValueError, match=match):
        condattn.apply_conditioning(model, method, **opts)
    assert_identical(before, snapshot(model, x))
    assert condattn.conditioning_report(model) is None
    condattn.remove_conditioning(model)  # nothing to remove
    assert_identical(before, snapshot(model, x))


def test_spectral_after_a_refused_cet_half_is_one_lambda_i():
    """The bug of issue 27: a refused spectral+embedded used to leave W + λI applied, and `spectral` then stacked a
    second λI. Now the second call is the first patch: equal to spectral on a fresh copy."""
    torch.manual_seed(0)
    model, x = _pit().eval(), _images()
    torch.manual_seed(0)
    fresh = _pit().eval()
    with pytest.raises(ValueError):
        condattn.apply_conditioning(model, "spectral+embedded", lam=20.0)
    condattn.apply_conditioning(model, "spectral", lam=20.0)
    condattn.apply_conditioning(fresh, "spectral", lam=20.0)
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))


def test_an_error_while_patching_undoes_what_was_attached(monkeypatch):
    """A failure after planning (here: CET's attach raising) removes the SCA patch already attached."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2).eval()
    x = _images()
    before = snapshot(model, x)

    def boom(self):
        raise RuntimeError("attach failed")

    monkeypatch.setattr(EmbeddedTokens, "attach", boom)
    with pytest.raises(RuntimeError, match="attach failed"):
        condattn.apply_conditioning(model, "spectral+embedded")
    assert_identical(before, snapshot(model, x))


def test_unmatched_attention_names_the_class_and_the_registration():
    model = Mixed()
    with pytest.raises(ValueError) as err:
        condattn.apply_conditioning(model, "spectral")
    msg = str(err.value)
    assert "1 of 2 attention layers of Mixed" in msg and f"{__name__}.OddAttention (1×, e.g. odd)" in msg
    assert "partial=True" in msg and "@attention_layout('my_oddattention')" in msg
    assert "if type(m) is not OddAttention" in msg
    assert "is a Conv1d with kernel (3,), groups 1: only pointwise convolutions" in msg  # why, in one line


def test_partial_patches_the_matched_layers_with_a_warning():
    torch.manual_seed(0)
    model, x = Mixed().eval(), _tokens()
    with torch.no_grad():
        ref = model(x)
    rep = condattn.apply_conditioning(model, "spectral", partial=True, lam=2.0)
    assert rep.counts == {"spectral:torch_mha": 1}
    assert len(rep.warnings) == 1 and "OddAttention" in rep.warnings[0] and "WARNING" in str(rep)
    assert rep.to_dict()["warnings"] == rep.warnings
    with torch.no_grad():
        assert not torch.equal(model(x), ref)
    condattn.remove_conditioning(model)
    with torch.no_grad():
        assert torch.equal(model(x), ref)


def test_partial_reaches_the_registered_methods_too():
    """sigma_reparam (a method registered outside api.py) refuses the unmatched layer, and patches the matched one
    with the same warning under partial=True."""
    model = Mixed().eval()
    with pytest.raises(ValueError, match="partial=True"):
        condattn.apply_conditioning(model, "sigma_reparam")
    assert not any("sigma" in k for k in model.state_dict())  # nothing was attached
    rep = condattn.apply_conditioning(model, "sigma_reparam", partial=True)
    assert rep.counts == {"sigma_reparam:torch_mha": 1}
    assert len(rep.warnings) == 1 and "OddAttention" in rep.warnings[0]


def test_reregistering_a_layout_takes_replace(monkeypatch):
    monkeypatch.setattr(sites_mod, "ATTENTION_LAYOUTS", dict(sites_mod.ATTENTION_LAYOUTS))
    monkeypatch.setattr(sites_mod, "PRIORITY", dict(sites_mod.PRIORITY))

    def odd(name, m):
        if type(m) is not OddAttention:
            return None
        return None

    sites_mod.attention_layout("odd_user")(odd)
    with pytest.raises(ValueError, match=r"registered twice; pass replace=True"):
        sites_mod.attention_layout("odd_user")(odd)

    def odd2(name, m):
        return None

    sites_mod.attention_layout("odd_user", replace=True)(odd2)
    assert sites_mod.ATTENTION_LAYOUTS["odd_user"] is odd2


# ---------------------------------------------------------------- conditioned_init on a layout interleaved per head


@pytest.mark.parametrize("identity", ["full", "per_head"])
def test_conditioned_init_on_an_interleaved_fused_qkv(identity):
    """GPT-NeoX's `query_key_value` rows are [q_h; k_h; v_h] per head: conditioned_init writes each role's own rows
    (read back both through the site and straight from the raw weight)."""
    from transformers import GPTNeoXConfig, GPTNeoXModel

    torch.manual_seed(0)
    model = GPTNeoXModel(GPTNeoXConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64)).eval()
    rep = condattn.apply_conditioning(model, "conditioned_init", identity=identity)
    assert rep.counts == {"conditioned_init:structural": 2}
    for site in find_attention(model):
        d, heads = site.head_dim, site.num_heads
        w = site.module.query_key_value.weight.detach()
        for h in range(heads):
            for i, role in enumerate("qkv"):
                raw = w[h * 3 * d + i * d: h * 3 * d + (i + 1) * d]
                assert torch.equal(raw, site.head_weight(role, h))
            for role in "qk":  # semi-orthogonal rows per head
                q = site.head_weight(role, h)
                torch.testing.assert_close(q @ q.T, torch.eye(d), atol=1e-5, rtol=0)
        v = site.weight("v")
        if identity == "full":
            torch.testing.assert_close(v, torch.eye(heads * d, v.shape[1]))
        else:
            for h in range(heads):
                torch.testing.assert_close(site.head_weight("v", h), torch.eye(d, v.shape[1]))


# ---------------------------------------------------------------- contracts a patched zoo model keeps (issue 27.5)

ZOO = {  # family -> (timm name, tiny config, image size)
    "vit": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2), 32),
    "deit": ("deit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2), 32),
    "swin": ("swin_tiny_patch4_window7_224", dict(img_size=32, patch_size=4, window_size=4, embed_dim=32,
                                                  depths=(2, 2), num_heads=(2, 4)), 32),
    "xcit": ("xcit_nano_12_p16_224", dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2), 32),
    "davit": ("davit_tiny", dict(depths=(1, 1), embed_dims=(32, 64), num_heads=(2, 4), window_size=4), 32),
    "eva02": ("eva02_tiny_patch14_224", dict(img_size=28, embed_dim=64, num_heads=2, depth=2), 28),
    "beit": ("beit_base_patch16_224", dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                           init_values=None), 32),
}
ZOO_CASES = [(f, m) for f in ZOO for m in ("spectral", "embedded")]


def zoo_model(family: str, method: str | None = None, **kw) -> tuple[nn.Module, torch.Tensor]:
    """A tiny random-init zoo model (eval), patched with `method` (CET with its default Newton–Schulz solver)."""
    import timm

    name, cfg, size = ZOO[family]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **({"num_classes": 10} | cfg | kw)).eval()
    if method:
        condattn.apply_conditioning(model, method)
    return model, torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(3))


def _eager(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("family,method", ZOO_CASES)
@pytest.mark.slow
def test_fx_symbolic_trace_and_feature_extraction_keep_the_numbers(family, method):
    """torch.fx traces W + C (a graph constant) and CET (one leaf call) with the eager ops, so the traced graph and
    torchvision's feature extractor give the patched model's numbers; tracing leaves the model copyable."""
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

    model, x = zoo_model(family, method)
    ref = _eager(model, x)
    graph = torch.fx.symbolic_trace(model)
    assert torch.equal(_eager(graph, x), ref)
    if method == "embedded":
        assert any(n.op == "call_function" and n.target.__name__ == "corrected_tokens" for n in graph.graph.nodes)
    last = get_graph_node_names(model)[1][-1]
    assert torch.equal(_eager(create_feature_extractor(model, return_nodes={last: "out"}), x)["out"], ref)
    assert torch.equal(_eager(copy.deepcopy(model), x), ref)


@pytest.mark.parametrize("family,method", [pytest.param(f, m, marks=[pytest.mark.slow] if m == "embedded" else [])
                                           for f, m in ZOO_CASES])  # CET's export: about 2 s each
@pytest.mark.slow
def test_torch_export_keeps_the_numbers(family, method):
    """torch.export (non-strict here, strict below) gives the patched model's numbers (CET's convergence fallback
    is a torch.cond in the graph)."""
    model, x = zoo_model(family, method)
    ep = torch.export.export(model, (x,), strict=False)
    torch.testing.assert_close(_eager(ep.module(), x), _eager(model, x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(ZOO))
def test_torch_export_strict_keeps_the_numbers(family):
    model, x = zoo_model(family, "spectral+embedded")
    ep = torch.export.export(model, (x,), strict=True)
    torch.testing.assert_close(_eager(ep.module(), x), _eager(model, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family,method", ZOO_CASES)
def test_deepcopy_and_pickle_carry_the_patch_to_the_copy(family, method):
    """A copy gives the patched numbers, its patch acts on its own weights, and removing it leaves the original."""
    model, x = zoo_model(family, method)
    plain, _ = zoo_model(family)
    ref = _eager(model, x)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(_eager(clone, x), ref)
        assert condattn.conditioning_report(clone).counts == condattn.conditioning_report(model).counts
        condattn.remove_conditioning(clone)
        assert torch.equal(_eager(clone, x), _eager(plain, x))
        assert torch.equal(_eager(model, x), ref)
    if method == "spectral":  # the copy's W + λI reads the copy's weight, not the original's
        clone = copy.deepcopy(model)
        with torch.no_grad():
            for p in clone.parameters():
                p.mul_(0.5)
        assert not torch.equal(_eager(clone, x), ref) and torch.equal(_eager(model, x), ref)


@pytest.mark.parametrize("family,method", ZOO_CASES)
def test_torchscript_is_refused_in_one_line(family, method):
    model, _ = zoo_model(family, method)
    with pytest.raises(RuntimeError) as err:
        torch.jit.script(model)
    msg = str(err.value)
    assert msg.startswith("torch.jit.script: this model is conditioned by condattn") and "\n" not in msg
    assert "torch.export.export" in msg and "remove_conditioning" in msg
    condattn.remove_conditioning(model)
    assert not hasattr(model, "__prepare_scriptable__")


def test_torchscript_of_a_patched_submodule_is_refused_too():
    model, _ = zoo_model("vit", "spectral")
    with pytest.raises(RuntimeError, match="torch.jit.script: this model is conditioned by condattn"):
        torch.jit.script(model.blocks[0])


@pytest.mark.parametrize("family,method", ZOO_CASES)
def test_features_only_models_can_be_conditioned(family, method):
    """timm's features_only wrappers (FeatureGetterNet around ViT-likes, FeatureListNet flattening Swin/DaViT) patch
    as the model does: the same sites, the features change, CET bounds κ at the first block, removal restores."""
    full = condattn.apply_conditioning(zoo_model(family)[0], method).counts
    if family == "xcit":  # timm prunes what follows the last feature: the head and its class-attention layers
        full.pop("spectral:timm_class_attn", None)
    ks = {} if family in ("swin", "davit") else {"out_indices": (0, 1)}
    model, x = zoo_model(family, features_only=True, **ks)
    ref = _eager(model, x)
    rep = condattn.apply_conditioning(model, method)
    assert rep.counts == full
    if method == "embedded":
        seen = []
        site = condattn.conditioning.find_tokens(model)
        site.first_block.register_forward_pre_hook(lambda m, a: seen.append(a[0]))  # after CET's own pre-hook
        out = _eager(model, x)
        t = seen[0] if seen[0].dim() == 3 else seen[0].flatten(1, 2) if family == "swin" else seen[0].flatten(2).mT
        sv = torch.linalg.svdvals(t.double())
        assert float((sv[:, 0] / sv[:, -1]).max()) <= 2.05
    else:
        out = _eager(model, x)
    assert all(not torch.equal(a, b) for a, b in zip(out, ref))
    condattn.remove_conditioning(model)
    assert all(torch.equal(a, b) for a, b in zip(_eager(model, x), ref))


def test_spectral_applies_on_the_meta_device():
    """The cost estimate builds models on the meta device: SCA's row indices (interleaved GPT-NeoX included) must not
    be meta tensors."""
    from transformers import GPTNeoXConfig, GPTNeoXModel

    with torch.device("meta"):
        neox = GPTNeoXModel(GPTNeoXConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=64))
        try:
            vit = zoo_model("vit")[0]
        except RuntimeError as e:  # (scripts/compat.py: timm 1.0.15 calls .item() while building, before any patch)
            if "meta tensors" not in str(e):
                raise
            import timm

            pytest.skip(f"timm {timm.__version__} cannot build a ViT on the meta device ({e})")
    assert condattn.apply_conditioning(neox, "spectral").counts == {"spectral:structural": 2}
    assert condattn.apply_conditioning(vit, "spectral").counts == {"spectral:timm_fused_qkv": 2}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(ZOO))
def test_compile_fullgraph_captures_train_and_eval(family):
    """torch.compile(fullgraph=True) captures SCA and CET together in one graph, in train mode (with the backward)
    and in eval mode, with the eager numbers. backend=aot_eager checks the capture (dynamo + AOT autograd) cheaply;
    the inductor test below compiles one family for real."""
    model, x = zoo_model(family, "spectral+embedded")
    assert_compiles_like_eager(model, x, _eager(model, x))


@pytest.mark.slow
def test_compile_fullgraph_inductor_on_vit():
    """Inductor's real code for SCA + CET: the forward and the backward of one compile (one graph pair, so a cold
    inductor cache compiles once) give eager's output and gradients. Train-mode capture: the aot_eager test above."""
    import copy

    model, x = zoo_model("vit", "spectral+embedded")
    eager = copy.deepcopy(model)
    ref = eager(x)
    ref.sum().backward()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    out.sum().backward()
    for (n, a), b in zip(eager.named_parameters(), model.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, atol=1e-4, rtol=1e-3, msg=n)
    assert all(p.grad is not None for p in model.blocks[0].attn.qkv.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("padded", [False, True])
def test_newton_schulz_fallback_under_compile_equals_eager(padded):
    """Under torch.compile the per-sample fallback to the exact SVD is a torch.cond (no host branch): for a diverged
    sample, a sample with a singular value far below 1 and a non-finite one, the eager numbers (to one fp32 ulp: on
    some CPUs LAPACK's SVD of the padded batch differs from eager's in the last bit), non-finite entries in place."""
    from condattn.conditioning.embedded import _exact_where_unconverged, _svd_polar

    x = torch.randn(3, 20, 8, generator=torch.Generator().manual_seed(0))
    x[2, 0, 0] = float("nan")
    keep = None
    if padded:
        keep = torch.ones(3, 20, dtype=torch.bool)
        keep[1, 15:] = False
        x = x * keep.unsqueeze(-1)
    sigma, polar = _svd_polar(x[:2])
    sigma, polar = torch.cat([sigma, torch.ones(1, 1, 1)]), torch.cat([polar, torch.zeros(1, 20, 8)])
    polar[0] = float("nan")
    polar[1, :, 0] *= 0.5
    torch._dynamo.reset()
    eager = _exact_where_unconverged(x, keep, sigma, polar)
    compiled = torch.compile(_exact_where_unconverged, fullgraph=True, backend="eager")(x, keep, sigma, polar)
    for e, c in zip(eager, compiled):
        assert torch.equal(e.isfinite(), c.isfinite())
        torch.testing.assert_close(c.nan_to_num(7.0), e.nan_to_num(7.0), rtol=0, atol=2.5e-7)


@pytest.mark.slow  # export's first call: about 3 s
def test_svd_correction_traces_with_fx_and_is_refused_by_export_in_one_line():
    """correction=svd: an fx graph holds C as of trace time (the same numbers); export / compile, which cannot trace
    the refresh between steps, stop with one line naming correction=identity."""
    model, x = zoo_model("vit")
    condattn.apply_conditioning(model, "spectral", correction="svd")
    ref = _eager(model, x)
    assert torch.equal(_eager(torch.fx.symbolic_trace(model), x), ref)
    with pytest.raises(NotImplementedError, match=r"^spectral correction=svd .* use correction=identity there"):
        torch.export.export(model, (x,), strict=False)
    assert torch.equal(_eager(model, x), ref)
