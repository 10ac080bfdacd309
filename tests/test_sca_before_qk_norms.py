"""SCA on attention that normalises q and k after its projections (Qwen3's per-head RMSNorm, timm's qk_norm=True):
λI is added to W_Q/W_K before the norm, and the PatchReport says so in one note (issue 54). The note's claim is
checked on a tiny Qwen3 built offline: with a large λ the normalised q is the norm of x's own channels per head."""

from __future__ import annotations

import pytest
import torch

import condattn

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]  # compat: scripts/compat.py

CAVEAT = "normalise q, k after the projections"


@pytest.fixture(scope="module", autouse=True)
def _qwen3_imported():
    """transformers imports its Qwen3 module on first use (about 1.5 s): once, in setup, not in a unit test's call."""
    try:
        import transformers

        transformers.Qwen3ForCausalLM  # noqa: B018
    except (ImportError, AttributeError):
        pass


def qwen3(**kw):
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "Qwen3Config"):
        pytest.skip(f"transformers {tf.__version__} has no Qwen3")
    torch.manual_seed(0)
    cfg = tf.Qwen3Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=32, **kw)
    return tf.Qwen3ForCausalLM(cfg).eval()


def notes(report) -> list[str]:
    return [n for n in report.notes if CAVEAT in n]


def test_sca_on_qwen3_says_where_lambda_lands():
    report = condattn.apply_conditioning(qwen3(), "spectral", lam=2.0)
    (note,) = notes(report)
    assert note.startswith("2 of 2 attention layers") and "q_norm, k_norm: Qwen3RMSNorm over each head's 8 channels" \
        in note and "λI is added to W_Q/W_K before that norm" in note and "model.layers.0.self_attn" in note
    assert f"note: {note}" in str(report).splitlines()[-1]  # printed as one line of the report


@pytest.mark.parametrize(("method", "options"), [("spectral", {"targets": ["v"]}), ("none", {}),
                                                 ("conditioned_init", {})])
def test_no_caveat_where_sca_does_not_touch_w_q_or_w_k(method, options):
    assert not notes(condattn.apply_conditioning(qwen3(), method, **options))


def test_no_caveat_without_qk_norms():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    llama = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64)).eval()
    assert not notes(condattn.apply_conditioning(llama, "spectral", lam=2.0))


def test_a_timm_vit_with_qk_norm_gets_the_caveat_and_one_without_does_not():
    timm = pytest.importorskip("timm")
    build = lambda qk: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,  # noqa: E731
                                         qk_norm=qk).eval()
    (note,) = notes(condattn.apply_conditioning(build(True), "spectral", lam=2.0))
    assert "q_norm, k_norm: LayerNorm over each head's 64 channels, e.g. blocks.0.attn" in note
    assert not notes(condattn.apply_conditioning(build(False), "spectral", lam=2.0))  # (nn.Identity norms)


def test_the_caveat_holds_lambda_lands_before_the_norm():
    """With λ = 1e4 the q that layer 0's q_norm returns is q_norm of the attention input's own channels per head:
    norm(x(W + λI)) = norm(xW/λ + x) → norm(x), as the note says (RMSNorm is scale-free up to its eps)."""
    model = qwen3()
    attn = model.model.layers[0].self_attn
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(x=kw.get("hidden_states", a[0] if a else None)),
                                   with_kwargs=True)
    attn.q_norm.register_forward_hook(lambda m, a, out: seen.update(q=out))
    condattn.apply_conditioning(model, "spectral", lam=1e4)
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1)))
        x = seen["x"]
        expected = attn.q_norm(x.view(*x.shape[:-1], 4, 8))
    q = seen["q"].reshape(expected.shape)
    assert torch.allclose(q, expected, atol=1e-2), (q - expected).abs().max()
    unpatched = qwen3()
    with torch.no_grad():  # the unpatched layer's q is far from it: the check can fail
        assert not torch.allclose(unpatched.model.layers[0].self_attn.q_norm(
            unpatched.model.layers[0].self_attn.q_proj(x).view(*x.shape[:-1], 4, 8)), expected, atol=1e-1)
