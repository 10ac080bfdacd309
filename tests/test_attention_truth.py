"""The entropy probe reports each model's OWN attention: entropy, max probability, self-argmax and the class token's
self-attention agree within 1e-4 with the probabilities the family itself returns (transformers' output_attentions
under eager attention, timm's unfused run, nn.MultiheadAttention's need_weights), masks, RoPE and biases included.
Tiny random-init models built from configs, offline."""

from __future__ import annotations

import math

import pytest
import torch

import condattn
from condattn.diagnostics import attention_entropy

pytestmark = pytest.mark.usefixtures("one_thread")


def stats(p: torch.Tensor, w: torch.Tensor | None = None) -> dict:
    """Per-head entropy / max prob, self-argmax share and class→class of probabilities p (B, H, N, N); w (B, N)
    weights the queries (padding excluded)."""
    p = p.double()
    b, h, nq, nk = p.shape
    w = torch.ones(b, nq, dtype=p.dtype) if w is None else w.to(p.dtype)
    w3 = w[:, None, :]
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)
    hit = (p.argmax(-1) == torch.arange(nq)).to(p.dtype)
    return {"entropy_heads": ((ent * w3).sum((0, 2)) / w.sum()).tolist(),
            "maxprob_heads": ((p.amax(-1) * w3).sum((0, 2)) / w.sum()).tolist(),
            "self_argmax": float((hit * w3).sum() / (w.sum() * h)), "cls_self": float(p[:, :, 0, 0].mean())}


def check(probe: list[dict], own: list[torch.Tensor], w=None, cls: bool = False) -> None:
    assert len(probe) == len(own) > 0
    for r, p in zip(probe, own):
        want = stats(p, w)
        assert r["absent"] is None, r["absent"]
        assert r["entropy_heads"] == pytest.approx(want["entropy_heads"], abs=1e-4), r["name"]
        assert r["maxprob_heads"] == pytest.approx(want["maxprob_heads"], abs=1e-4), r["name"]
        assert r["self_argmax"] == pytest.approx(want["self_argmax"], abs=1e-4), r["name"]
        if cls:
            assert r["cls_self"] == pytest.approx(want["cls_self"], abs=1e-4), r["name"]


def tokens(vocab: int, n: int = 24, b: int = 3) -> dict:
    """Right-padded batches: sample 0 full, then 5 and 10 padded positions (pad id 0)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    for i in range(1, b):
        mask[i, n - 5 * i:], ids[i, n - 5 * i:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


def hf_own(model, inputs: dict) -> list[torch.Tensor]:
    """transformers' own attention probabilities: output_attentions=True under the eager implementation."""
    old = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return list(model(**inputs, output_attentions=True).attentions)
    finally:
        model.config._attn_implementation = old


def hf_case(model, inputs: dict, run) -> tuple[list[dict], torch.Tensor]:
    assert model.config._attn_implementation == "sdpa"  # the probe must not read a fused kernel's non-output
    with torch.no_grad():
        before = run(model, inputs)
    probe = attention_entropy(model, run, inputs)
    assert model.config._attn_implementation == "sdpa"  # restored
    with torch.no_grad():
        assert torch.allclose(run(model, inputs), before, atol=1e-5)
    check(probe, hf_own(model, inputs), inputs["attention_mask"])
    keys = inputs["attention_mask"].sum(1)
    return probe, keys


def _logits(m, b):
    return m(**b).logits


def test_llama_with_grouped_query_attention_rope_causal_and_padding():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, max_position_embeddings=64, attn_implementation="sdpa")
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    model = LlamaForCausalLM(cfg).eval()
    inputs = tokens(61, n=32)
    probe, keys = hf_case(model, inputs, _logits)
    # uniform over the keys a query may see: causal (i + 1 of them) within its sample's length
    want = sum(sum(math.log(i + 1) for i in range(int(n))) for n in keys) / float(keys.sum())
    assert probe[0]["entropy_uniform"] == pytest.approx(want, abs=1e-6)
    assert probe[0]["entropy"] < math.log(32) - 0.5  # the old probe's reading: uniform over all 32 keys


def test_gpt2_causal_with_padding():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       attn_implementation="sdpa")).eval()
    hf_case(model, tokens(61), _logits)


def test_bert_with_padding():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa")).eval()
    probe, keys = hf_case(model, tokens(100, n=40), lambda m, b: m(**b).last_hidden_state)
    want = float((keys * keys.double().log()).sum() / keys.sum())  # each real query sees its sample's real keys
    assert probe[1]["entropy_uniform"] == pytest.approx(want, abs=1e-6)


def timm_own(model, x: torch.Tensor) -> list[torch.Tensor]:
    """timm's own probabilities: an unfused run (fused_attn=False), read where timm passes them to attn_drop."""
    mods = [m for m in model.modules() if hasattr(m, "fused_attn") and isinstance(getattr(m, "attn_drop", None),
                                                                                   torch.nn.Module)]
    got: list[torch.Tensor] = []
    hooks = [m.attn_drop.register_forward_hook(lambda mod, a, out: got.append(out.detach())) for m in mods]
    old = [m.fused_attn for m in mods]
    for m in mods:
        m.fused_attn = False
    try:
        with torch.no_grad():
            model(x)
    finally:
        for m, f in zip(mods, old):
            m.fused_attn = f
        for h in hooks:
            h.remove()
    return got


def timm_case(model, lam: float, size: int = 32) -> list[dict]:
    x = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(3))
    if lam:
        condattn.apply_conditioning(model, "spectral", lam=lam)
    own = timm_own(model, x)
    probe = attention_entropy(model, lambda m, b: m(b), x)
    check(probe, own, cls=True)
    return probe


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_eva02_rope_and_qv_bias(lam):
    """EVA-02 (timm's eva02_tiny, 2 blocks, 4 × 4 patches): RoPE on q and k; q/v biases make the module read
    qkv.weight itself (SCA folds W + λI into it)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=56, depth=2, num_classes=10).eval()
    blk = model.blocks[0].attn
    assert blk.q_bias is not None and model.rope is not None and blk.fused_attn
    timm_case(model, lam, size=56)
    assert blk.fused_attn  # restored


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_beit_relative_position_bias_and_qv_bias(lam):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("beit_base_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64,
                              depth=2, num_heads=2, num_classes=10, init_values=None).eval()
    attn = model.blocks[0].attn
    assert attn.q_bias is not None and attn.relative_position_bias_table is not None
    with torch.no_grad():  # a visible relative position bias (zeros at init)
        for b in model.blocks:
            b.attn.relative_position_bias_table.normal_(0, 2.0)
    timm_case(model, lam)


def test_torch_multihead_attention_with_key_padding():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(3))
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[1, 7:], pad[2, 4:] = True, True
    run = lambda m, b: m(b, src_key_padding_mask=pad)  # noqa: E731
    own, ins = [], []
    hooks = [mod.self_attn.register_forward_pre_hook(lambda mod, a, kw: ins.append(a[0]), with_kwargs=True)
             for mod in model.layers]
    with torch.no_grad():
        before = run(model, x)
        for h in hooks:
            h.remove()
        for mod, h in zip(model.layers, ins):
            own.append(mod.self_attn(h, h, h, key_padding_mask=pad, need_weights=True,
                                     average_attn_weights=False)[1])
    probe = attention_entropy(model, run, x, mask=~pad)
    with torch.no_grad():
        assert torch.allclose(run(model, x), before, atol=1e-5)
    check(probe, own, ~pad)
    assert probe[0]["entropy_uniform"] == pytest.approx(float((~pad).sum(1).double().log().mul((~pad).sum(1)).sum()
                                                               / (~pad).sum()), abs=1e-6)


def test_sdpa_reader_reproduces_the_modules_output():
    """crammed BERT calls F.scaled_dot_product_attention: the probabilities read from its inputs give back the
    module's own output (p @ v, then its output projection)."""
    from condattn.models import build_model

    torch.manual_seed(0)
    model = build_model({"builder": "crammed_bert", "vocab_size": 97, "seq_len": 32, "hidden_size": 32,
                         "num_layers": 2, "num_heads": 2, "intermediate_size": 128}).eval()
    inputs = tokens(97)
    attn = next(m for m in model.modules() if type(m).__name__ == "CrammedSelfAttention")
    seen = {}
    attn.register_forward_hook(lambda m, a, out: seen.update(x=a[0], out=out))
    from condattn.diagnostics import AttentionProbe

    ps = []
    with torch.no_grad(), AttentionProbe(model) as probe:
        orig = probe._accumulate
        probe._accumulate = lambda i, p, allowed: (ps.append(p) if i == 0 else None, orig(i, p, allowed))
        model(inputs["input_ids"], inputs["attention_mask"])
    res = probe.results()
    assert res[0]["reader"] == "sdpa" and res[0]["absent"] is None
    b, n, d = seen["x"].shape
    v = attn.qkv(seen["x"]).view(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
    out = attn.dense((ps[0].to(v) @ v).transpose(1, 2).reshape(b, n, d))
    assert torch.allclose(out, seen["out"], atol=1e-5)
    keys = inputs["attention_mask"].sum(1)
    assert res[0]["entropy_uniform"] == pytest.approx(float((keys * keys.double().log()).sum() / keys.sum()))


def test_diagnose_cli_on_ones_own_model(tmp_path, capsys):
    """`python -m condattn.diagnose --model module:callable` (in-process main): the table, with the model's own
    causal RoPE entropy, both arms, gradient norms from the callable's loss, and the json."""
    import json

    from condattn.diagnose import main

    assert main(["--model", "own_model:tiny_llama", "--method", "spectral", "conditioning.lam=2",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "own_model:tiny_llama, baseline (none) → spectral(lam=2)" in out and "hf_llama ×2" in out
    r = json.loads((tmp_path / "tiny_llama_spectral.json").read_text())
    base, cond = r["baseline"]["flat"], r["conditioned"]["flat"]
    assert cond["kappa_wq/l0"] < base["kappa_wq/l0"] and base["gradnorm_wq/l1"] > 0
    assert base["entropy/l0"] < base["entropy_uniform/l0"] + 1e-6 < math.log(32)  # causal: fewer keys than 32
    assert f"{base['entropy/l0']:.4g} → {cond['entropy/l0']:.4g}" in out


@pytest.mark.parametrize("args, message", [
    (["--model", "no_such_module_xyz:make"], "No module named 'no_such_module_xyz'"),
    (["--model", "own_model"], "give --model module:callable"),
    (["--model", "own_model:not_a_model"], "must return (model, batch)"),
    (["--model", "own_model:tiny_llama", "model.x=1"], "only conditioning.KEY=VALUE overrides"),
    (["--model", "own_model:tiny_llama", "conditioning.lam=-1"], "ValueError"),
])
def test_diagnose_cli_own_model_errors(args, message, capsys):
    from condattn.diagnose import main

    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_the_docs_diagnose_a_users_own_model(monkeypatch):
    """Getting started's diagnostics block ("Measure what a method does") runs after its layout block, and reads
    MyAttention's SDPA probabilities: the entropy equals softmax(q kᵀ / sqrt(d)) of the module's (SCA-shifted) q and
    k."""
    from pathlib import Path

    from condattn.conditioning import sites

    page = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in page.split("```")[1::2] if b.startswith("python\n")]
    (layout,) = [b for b in blocks if "@attention_layout(" in b]
    (diag,) = [b for b in blocks if "compare_conditioning(" in b]
    for name in ("ATTENTION_LAYOUTS", "TOKEN_LAYOUTS", "PRIORITY"):
        monkeypatch.setattr(sites, name, dict(getattr(sites, name)))
    ns: dict = {}
    exec(compile(layout, "docs/getting-started.md", "exec"), ns)
    exec(compile(diag, "docs/getting-started.md", "exec"), ns)
    d, both, model, x = ns["d"], ns["both"], ns["model"], ns["x"]
    assert d["attention"][0]["reader"] == "sdpa" and both["patch"]["counts"] == {"spectral:my_attention": 2}
    blk, seen = model.blocks[0], {}
    h = blk.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
    with torch.no_grad():
        model(x)
        h.remove()
        b, n, _ = seen["x"].shape
        q, k = (f(seen["x"]).view(b, n, blk.heads, -1).transpose(1, 2) for f in (blk.q, blk.k))
        p = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
    check([d["attention"][0]], [p])
    assert both["conditioned"]["flat"]["entropy/l0"] < both["baseline"]["flat"]["entropy/l0"]
