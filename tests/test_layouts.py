"""The conditioning contract, once for every architecture family in the layout registry (conditioning/layouts/).

One small model per family, built offline (timm with pretrained=False, transformers from small configs, the
project's crammed BERT / Nyströmformer / GPT-2 / DETR builders). For each: the layouts find exactly the attention
layers its architecture defines, `none` is bit-identical, SCA's effective weight and the patched model equal the
explicit W + λI, CET bounds κ(X + C) at the first block's input and leaves padded rows untouched, and
remove_conditioning restores the model's outputs. A registered layout without a case here fails
`test_every_registered_layout_has_a_case`: a new family is one layout module plus one case.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import condattn
from condattn.conditioning import ATTENTION_LAYOUTS, ROLES, TOKEN_LAYOUTS, find_attention, find_tokens, polar_correction
from condattn.conditioning.sites import as_matrix, stored_weight

# tiny models (conftest.py); compat: scripts/compat.py runs these on every release claimed
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict]
    run: Callable[[torch.nn.Module, dict], torch.Tensor]  # one output tensor of the model
    attention: dict[str, int]  # attention sites per layout, from the architecture's definition
    token: str | None  # the token layout (None: a family with attention layouts only, e.g. nn.MultiheadAttention)
    keep: Callable[[dict], torch.Tensor | None] = lambda inputs: None  # (B, N) real tokens at the first block
    raw_kappa_min: float = 2.5  # the first block's raw tokens are worse conditioned than this (CET has work to do)
    causal: bool = False  # a causal decoder: CET is refused there unless conditioning.causal_leak=accept
    layers: int | None = None  # attention layers where they are fewer than the sites (a site per head: `layer#h<h>`)

    @property
    def cet(self) -> dict:
        """The options CET needs on this family (tests/test_verify.py: the refusal itself)."""
        return {"causal_leak": "accept"} if self.causal else {}

    @property
    def attention_layers(self) -> int:
        return self.layers if self.layers is not None else sum(self.attention.values())

    @property
    def methods(self) -> tuple[str, ...]:
        return ("spectral", "embedded", "spectral+embedded") if self.token else ("spectral",)


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn().eval()

    return build


def _timm(name: str, **kw):
    def build():
        import timm

        if not timm.is_model(name):  # (scripts/compat.py: an older timm release)
            pytest.skip(f"timm {timm.__version__} has no model {name}")
        return timm.create_model(name, pretrained=False, num_classes=10, **kw)

    return _seeded(build)


def _project(**cfg):
    from condattn.models import build_model

    return _seeded(lambda: build_model(cfg))


def _images(b: int = 3) -> dict:
    return {"x": torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(3))}


def _tokens(vocab: int, n: int = 24, b: int = 3, low: int = 1) -> dict:
    """Right-padded token batches (sample 0 unpadded, then 5 and 10 padded positions; pad id 0)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(low, vocab, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    for i in range(1, b):
        mask[i, n - 5 * i:] = 0
        ids[i, n - 5 * i:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64))


def _detr_inputs() -> dict:
    """Two images zero-padded to 96 × 128 (the second is 64 × 80): DETR's pixel_mask marks the padding."""
    g = torch.Generator().manual_seed(3)
    x = torch.zeros(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.long)
    for i, (h, w) in enumerate(((96, 128), (64, 80))):
        x[i, :, :h, :w] = torch.randn(3, h, w, generator=g)
        mask[i, :h, :w] = 1
    return {"pixel_values": x, "pixel_mask": mask}


def _detr_keep(inputs: dict) -> torch.Tensor:
    """The encoder's tokens are the stride-32 feature map (3 × 4 here), masked as DETR downsamples the pixel mask."""
    m = torch.nn.functional.interpolate(inputs["pixel_mask"][None].float(), size=(3, 4))[0]
    return m.bool().flatten(1)


def _detr_out(model, inputs) -> torch.Tensor:
    out = model(**inputs)
    return torch.cat([out.logits.flatten(), out.pred_boxes.flatten()])


def _kw(model, inputs):
    return model(**inputs)


def _positional(model, inputs):
    return model(inputs["input_ids"], inputs["attention_mask"])


def _hidden(model, inputs):
    return model(**inputs).last_hidden_state


def _lm_logits(model, inputs):
    return model(**inputs).logits


def _mask(inputs):
    return inputs["attention_mask"].bool()


def _eva(**kw):
    def build():
        import inspect

        import timm
        from timm.models.eva import Eva

        missing = sorted(set(kw) - set(inspect.signature(Eva).parameters))
        if missing:  # (scripts/compat.py: an older timm release)
            pytest.skip(f"timm {timm.__version__}'s Eva has no option {missing[0]}")
        return Eva(img_size=32, patch_size=8, embed_dim=64, depth=2, num_classes=10, **kw)

    return _seeded(build)


def _hf_vit():
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64))


def _pixels(model, inputs):
    return model(pixel_values=inputs["x"]).last_hidden_state


def _llama():
    """A tiny Llama with grouped-query attention (4 query heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64))


def _roberta():
    """Matched by structure (separate query/key/value Linears, num_attention_heads): no named layout."""
    from transformers import RobertaConfig, RobertaModel

    return RobertaModel(RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64))


def _gpt_neox():
    """Matched by structure: one `query_key_value` Linear interleaved per head [q_h; k_h; v_h]."""
    from transformers import GPTNeoXConfig, GPTNeoXModel

    return GPTNeoXModel(GPTNeoXConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=64))


class ConvStack(torch.nn.Module):
    """timm attention modules with 1×1-conv projections on (B, C, H, W) maps, each a residual (a module whose output
    is not its input's shape, CSATv2's spatial map, replaces it)."""

    def __init__(self, *blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            y = b(x)
            x = x + y if y.shape == x.shape else y
        return x


def _conv_attention(kind: str):
    """Two attention modules of one layout (two variants where the module has them), random init, tiny widths."""

    def blocks():
        import importlib.util

        from timm.layers.attention2d import MultiQueryAttention2d
        from timm.layers.bottleneck_attn import BottleneckAttn
        from timm.layers.halo_attn import HaloAttn

        def mod(n):  # (imported when its case builds: an older timm may lack the module)
            if importlib.util.find_spec(f"timm.models.{n}") is None:
                import timm

                pytest.skip(f"timm {timm.__version__} has no timm.models.{n}")
            return importlib.import_module(f"timm.models.{n}")

        return {
            "maxxvit": lambda: (mod("maxxvit").Attention2d(32, dim_head=8),  # head_first: per head [q; k; v]
                                mod("maxxvit").Attention2d(32, dim_head=16, head_first=False)),  # stacked
            "halo": lambda: (HaloAttn(32, num_heads=2, block_size=4, halo_size=1),
                             HaloAttn(32, num_heads=4, block_size=4, halo_size=1, qkv_bias=True)),
            "bottleneck": lambda: (BottleneckAttn(32, feat_size=(8, 8), num_heads=2),
                                   BottleneckAttn(32, feat_size=(8, 8), num_heads=4, qkv_bias=True)),
            "pwise": lambda: (mod("lowformer").ConvAttention(128, att_stride=2, att_kernel=3),
                              mod("cpubone").ConvAttention(128, head_dim_mul=0.5, att_stride=2)),
            "csatv2": lambda: (mod("csatv2").SpatialAttention(), mod("csatv2").SpatialAttention()),
            # structural: a stacked conv qkv (Visformer), conv query/key/value after pooling / depthwise conv + BN
            # (MobileNetV5's multi-query attention: one k/v head)
            "structural": lambda: (mod("visformer").Attention(32, num_heads=2),
                                   MultiQueryAttention2d(32, num_heads=2, key_dim=16, value_dim=16, kv_stride=2)),
        }[kind]()

    return _seeded(lambda: ConvStack(*blocks()))


def _maps(channels: int):
    return lambda: {"x": torch.randn(2, channels, 8, 8, generator=torch.Generator().manual_seed(3))}


def randomise_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """Random BatchNorm affine and running statistics (timm inits some γ to 0, e.g. LeViT's output norm), so the
    norm after a projection is a real per-channel map in eval."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(0.1 * torch.randn(n, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(n, generator=g))
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


def _bn_attention(kind: str):
    """Attention whose projections are Linear / 1×1 conv + BatchNorm (layouts/timm_bn.py); value heads 2× wider."""

    def blocks():
        import importlib

        def mod(n):
            return importlib.import_module(f"timm.models.{n}")

        return {  # LeViT on (B, N, C) tokens: fused qkv, then q after token subsampling and a fused kv
            "levit": lambda: (mod("levit").Attention(32, key_dim=8, num_heads=2, attn_ratio=2, resolution=4),
                              mod("levit").AttentionDownsample(32, 48, key_dim=8, num_heads=2, attn_ratio=2,
                                                               resolution=4)),
            "efficientformer_v2": lambda: (  # separate q / k / v; strided; q as a LocalGlobalQuery
                mod("efficientformer_v2").Attention2d(32, key_dim=8, num_heads=2, attn_ratio=2, resolution=8),
                mod("efficientformer_v2").Attention2d(32, key_dim=8, num_heads=2, attn_ratio=2, resolution=8, stride=2),
                mod("efficientformer_v2").Attention2dDownsample(32, key_dim=8, num_heads=2, attn_ratio=2, resolution=8,
                                                                out_dim=48)),
            "efficientvit_msra": lambda: tuple(  # cascaded group attention: one q/k/v ConvNorm per head
                importlib.import_module("timm.models.efficientvit_msra").CascadedGroupAttention(
                    32, key_dim=8, num_heads=2, attn_ratio=2, resolution=8) for _ in range(2)),
        }[kind]()

    return _seeded(lambda: randomise_batchnorm(ConvStack(*blocks())))


def _gcvit():
    """A 2-stage GCViT: in each stage block 0 is local window attention (q/k/v), block 1 global (queries: the stage's
    global query tokens, `qkv` holds W_K, W_V only; layouts/timm_gcvit.py)."""
    from timm.models.gcvit import GlobalContextVit

    return GlobalContextVit(num_classes=10, img_size=32, depths=(2, 2), num_heads=(2, 4), embed_dim=32,
                            window_ratio=(8, 8))


class UserMHAModel(torch.nn.Module):
    """A user's model built from torch.nn: a 2-layer nn.TransformerEncoder (packed in_proj_weight; its fused
    inference path would bypass nn.MultiheadAttention.forward) and a cross-attention with kdim/vdim != embed_dim
    (separate q/k/v_proj_weight)."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.cross = torch.nn.MultiheadAttention(32, 2, kdim=16, vdim=24, batch_first=True)

    def forward(self, x, k, v):
        h = self.encoder(x)
        return h + self.cross(h, k, v, need_weights=False)[0]


class UserViT(torch.nn.Module):
    """A user's ViT written from scratch: patch embedding, class token, position embedding, 2 pre-norm blocks whose
    attention is separate q/k/v and `out` Linears with the head count in `self.h` (no layout names any of it: the
    structural layouts find the sites, W_O and heads, and CET's token site, the input of `blocks.0`)."""

    class Attention(torch.nn.Module):
        def __init__(self, dim: int, h: int):
            super().__init__()
            self.h = h
            self.q, self.k, self.v, self.out = (torch.nn.Linear(dim, dim) for _ in range(4))

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = (f(x).view(b, n, self.h, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.out(y.transpose(1, 2).reshape(b, n, d))

    class Block(torch.nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.n1, self.attn, self.n2 = torch.nn.LayerNorm(dim), UserViT.Attention(dim, 2), torch.nn.LayerNorm(dim)
            lin = torch.nn.Linear
            self.mlp = torch.nn.Sequential(lin(dim, 2 * dim), torch.nn.GELU(), lin(2 * dim, dim))

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))

    def __init__(self, dim: int = 32):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, dim, 8, 8)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(1, 17, dim) * 0.1)
        self.blocks = torch.nn.ModuleList(UserViT.Block(dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
        for blk in self.blocks:
            t = blk(t)
        return self.head(t[:, 0])


def _mha_inputs() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"x": torch.randn(3, 10, 32, generator=g), "k": torch.randn(3, 5, 16, generator=g),
            "v": torch.randn(3, 5, 24, generator=g)}


CASES = {
    "vit": Case(_timm("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=64, num_heads=2, depth=2),
                _images, _kw, {"timm_fused_qkv": 2}, "timm_vit"),
    "swin": Case(_timm("swin_tiny_patch4_window7_224", img_size=32, patch_size=4, window_size=4, embed_dim=32,
                       depths=(2, 2), num_heads=(2, 4)),
                 _images, _kw, {"timm_swin_window": 2 + 2}, "timm_swin"),
    "xcit": Case(_timm("xcit_nano_12_p16_224", img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2),
                 _images, _kw, {"timm_xca": 2, "timm_class_attn": 2}, "timm_xcit"),
    "davit": Case(_timm("davit_tiny", depths=(1, 1), embed_dims=(32, 64), num_heads=(2, 4), window_size=4),
                  _images, _kw, {"timm_davit_window": 1 + 1, "timm_davit_channel": 1 + 1}, "timm_davit"),
    "bert": Case(_seeded(_bert), lambda: _tokens(100, n=40), _hidden, {"hf_separate_qkv": 2}, "hf_encoder",
                 keep=_mask),
    "nystromformer": Case(_project(builder="nystromformer_classifier", vocab_size=19, num_classes=10, seq_len=128,
                                   num_landmarks=64),
                          lambda: _tokens(19, n=128, low=2), _kw, {"hf_separate_qkv": 2}, "hf_encoder", keep=_mask),
    "gpt2": Case(_project(builder="gpt2", vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=2),
                 lambda: _tokens(61), _lm_logits, {"hf_gpt2": 2}, "hf_gpt2", keep=_mask, raw_kappa_min=3.0,
                 causal=True),
    "crammed_bert": Case(_project(builder="crammed_bert", vocab_size=97, seq_len=32, hidden_size=32, num_layers=2,
                                  num_heads=2, intermediate_size=128),
                         lambda: _tokens(97, low=5), _positional, {"crammed_bert": 2}, "crammed_bert", keep=_mask),
    "detr": Case(_project(builder="detr", backbone="resnet18", use_pretrained_backbone=False, d_model=64,
                          encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=128, decoder_ffn_dim=128, num_queries=20, num_classes=3),
                 _detr_inputs, _detr_out, {"hf_detr": 1 + 2 * 2}, "hf_detr", keep=_detr_keep, raw_kappa_min=0.0),
    # EVA-02 style: EvaAttention, fused qkv with q/v biases passed to F.linear (SCA folds into qkv.weight)
    "eva02": Case(_eva(num_heads=2, use_rot_pos_emb=True, qkv_fused=True), _images, _kw, {"timm_eva": 2}, "timm_eva"),
    # RoPE ViT with timm's AttentionRope, separate projections and grouped-query attention (2 k/v heads of 4)
    "rope_vit_gqa": Case(_eva(num_heads=4, use_rot_pos_emb=True, attn_type="rope", qkv_fused=False, num_kv_heads=2),
                         _images, _kw, {"timm_eva": 2}, "timm_eva"),
    "rope_vit": Case(_timm("vit_small_patch16_rope_224", img_size=32, patch_size=8, embed_dim=64, depth=2,
                           num_heads=2, init_values=None),
                     _images, _kw, {"timm_eva": 2}, "timm_eva"),
    "beit": Case(_timm("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                       init_values=None),
                 _images, _kw, {"timm_beit": 2}, "timm_beit"),
    "hf_vit": Case(_seeded(_hf_vit), _images, _pixels, {"hf_vit": 2}, "hf_vit"),
    "llama": Case(_seeded(_llama), lambda: _tokens(61), _lm_logits, {"hf_llama": 2}, "hf_llama", keep=_mask,
                  causal=True),
    "torch_mha": Case(_seeded(UserMHAModel), _mha_inputs, _kw, {"torch_mha": 2 + 1}, "torch_encoder"),
    "user_vit": Case(_seeded(UserViT), _images, _kw, {"structural": 2}, "structural_tokens"),
    "roberta_structural": Case(_seeded(_roberta), lambda: _tokens(100, n=16, low=3), _hidden, {"structural": 2}, None),
    "gpt_neox_structural": Case(_seeded(_gpt_neox), lambda: _tokens(61), _hidden, {"structural": 2}, None),
    # 1×1-conv projections (layouts/timm_conv.py; structural for stacked ones)
    "maxxvit_conv": Case(_conv_attention("maxxvit"), _maps(32), _kw, {"timm_maxxvit_conv": 2}, None),
    "halo_conv": Case(_conv_attention("halo"), _maps(32), _kw, {"timm_halo": 2}, None),
    "bottleneck_conv": Case(_conv_attention("bottleneck"), _maps(32), _kw, {"timm_bottleneck": 2}, None),
    "pwise_conv": Case(_conv_attention("pwise"), _maps(128), _kw, {"timm_pwise_conv": 2}, None),
    "csatv2_spatial": Case(_conv_attention("csatv2"), _maps(32), _kw, {"timm_csatv2_spatial": 2}, None),
    "conv_structural": Case(_conv_attention("structural"), _maps(32), _kw, {"structural": 2}, None),
    # Linear / 1×1 conv + BatchNorm projections (layouts/timm_bn.py: λI added to W before its BatchNorm)
    "levit_bn": Case(_bn_attention("levit"), lambda: {"x": torch.randn(2, 16, 32, generator=torch.Generator()
                                                                       .manual_seed(3))}, _kw, {"timm_levit": 2}, None),
    "efficientformer_v2_bn": Case(_bn_attention("efficientformer_v2"), _maps(32), _kw,
                                  {"timm_efficientformer_v2": 3}, None),
    "efficientvit_msra_bn": Case(_bn_attention("efficientvit_msra"), _maps(32), _kw, {"timm_efficientvit_msra": 4},
                                 None, layers=2),
    # GCViT: 2 local sites (q/k/v) and 2 global ones without W_Q (layouts/timm_gcvit.py: λI on W_K, W_V only)
    "gcvit": Case(_seeded(_gcvit), _images, _kw, {"timm_gcvit": 4}, None),
}
NAMES = list(CASES)


def output(case: Case, model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return case.run(model, inputs)


def test_every_registered_layout_has_a_case():
    assert {n for c in CASES.values() for n in c.attention} == set(ATTENTION_LAYOUTS)
    assert {c.token for c in CASES.values()} - {None} == set(TOKEN_LAYOUTS)


# ---------------------------------------------------------------- sites and patch counts


@pytest.mark.parametrize("name", NAMES)
def test_sites_and_patch_counts_match_the_architecture(name):
    case = CASES[name]
    model = case.build()
    sites = find_attention(model)
    assert Counter(s.layout for s in sites) == case.attention
    for s in sites:  # each role's columns hold all its heads (k/v: fewer under grouped-query attention; v: wider)
        assert set(s.proj) | set(s.missing) == set(ROLES) and not set(s.proj) & set(s.missing), s.name
        assert (s.proj["q"] if "q" in s.proj else s.proj["k"]).out_features == s.num_heads * s.head_dim, s.name
        assert all(p.out_features % s.role_head_dim(r) == 0 and p.out_features // s.role_head_dim(r) <= s.num_heads
                   for r, p in s.proj.items()), s.name
    assert (find_tokens(model) and find_tokens(model).layout) == case.token
    rep = condattn.apply_conditioning(model, case.methods[-1], **case.cet)
    embedded = {f"embedded:{case.token}": 1} if case.token else {}
    assert rep.counts == {**{f"spectral:{k}": v for k, v in case.attention.items()}, **embedded}
    rep.check(attention_layers=case.attention_layers)
    with pytest.raises(RuntimeError, match=f"expects {case.attention_layers + 1}"):
        rep.check(attention_layers=case.attention_layers + 1)


# ---------------------------------------------------------------- none, parameters, state_dict, removal


@pytest.mark.parametrize("name", NAMES)
def test_none_is_bit_identical_and_remove_restores(name):
    case = CASES[name]
    base, inputs = case.build(), case.inputs()
    ref = output(case, base, inputs)
    plain = case.build()
    assert condattn.apply_conditioning(plain, "none").counts == {}
    assert torch.equal(output(case, plain, inputs), ref)
    params = {n: p.shape for n, p in base.named_parameters()}
    for method in case.methods:
        model = case.build()
        condattn.apply_conditioning(model, method, **({"lam": 2.0} if "spectral" in method else {}), **case.cet)
        assert {n: p.shape for n, p in model.named_parameters()} == params  # no new parameters
        assert list(model.state_dict()) == list(base.state_dict())  # unchanged keys
        model.load_state_dict(base.state_dict(), strict=True)  # checkpoints load either way
        base.load_state_dict(model.state_dict(), strict=True)
        out = output(case, model, inputs)
        assert torch.isfinite(out).all() and not torch.equal(out, ref), method  # the patch is live
        condattn.remove_conditioning(model)
        assert torch.equal(output(case, model, inputs), ref), method


# ---------------------------------------------------------------- SCA: W + λI, from the definition


def _torch_weight(p) -> torch.Tensor:
    w = as_matrix(stored_weight(p).detach().clone())  # (a 1×1 convolution's (out, in) view)
    return w.T.contiguous() if p.transposed else w


def _projected(lin, x: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:
    """What the projection computes with the torch-layout weight w: x Wᵀ + b, or the 1×1 convolution with W."""
    if isinstance(lin, torch.nn.modules.conv._ConvNd):
        conv = torch.nn.functional.conv2d if lin.weight.dim() == 4 else torch.nn.functional.conv1d
        b = bias if isinstance(bias, torch.Tensor) else None
        return conv(x, w.reshape(lin.weight.shape), b, lin.stride, lin.padding, lin.dilation)
    return x @ w.T + bias


def _explicit(site, targets, lam: float, identity: str) -> dict[tuple[int, str], torch.Tensor]:
    """Per projection weight (module, parameter name): its torch-layout (out, in) weight with λI added by hand on
    each target role's output columns (all of the block for `full`, the same λI_{d×D} in every head for
    `per_head`)."""
    out: dict[tuple[int, str], torch.Tensor] = {}
    for role in (r for r in targets if r in site.proj):  # (a role the layer lacks, GCViT's global W_Q: none)
        p = site.proj[role]
        w = out.setdefault((id(p.linear), p.param), _torch_weight(p))
        rows, d_in = p.rows, w.shape[1]  # (a role's rows: a range, or per head when interleaved)
        if identity == "full":
            w[rows] += lam * torch.eye(len(rows), d_in)
        else:  # the role's own heads (k/v of grouped-query attention have fewer; value heads may be wider)
            d = site.role_head_dim(role)
            for h in range(p.out_features // d):
                w[rows[h * d:(h + 1) * d]] += lam * torch.eye(d, d_in)
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("identity", "targets"), [("full", ("q", "k", "v")), ("per_head", ("q", "k", "v")),
                                                   ("full", ("v",)), ("per_head", ("q", "k"))])
def test_sca_is_the_explicit_formula(name, identity, targets):
    """site.weight (what diagnostics read), every called projection's output and the whole model's output equal those
    of W + λI built by hand; the stored parameters never hold λI."""
    lam, case = 3.0, CASES[name]
    model, inputs = case.build(), case.inputs()
    explicit = copy.deepcopy(model)
    stored = {k: v.clone() for k, v in model.state_dict().items()}
    condattn.apply_conditioning(model, "spectral", lam=lam, identity=identity, targets=list(targets))
    sites = find_attention(model)
    seen: dict[tuple[int, str], tuple] = {}
    handles = []
    for site in sites:
        want = _explicit(site, targets, lam, identity)
        for role in site.roles:
            p = site.proj[role]
            w = want.get((id(p.linear), p.param), _torch_weight(p))
            torch.testing.assert_close(site.weight(role, effective=True), w[p.cols])
            torch.testing.assert_close(site.weight(role, effective=False), _torch_weight(p)[p.cols])
            lin = p.linear
            if (id(lin), p.param) not in seen:
                calls: list = []
                seen[(id(lin), p.param)] = (lin, w, p, calls)
                if p.called:  # (a module that reads the weight itself has no projection call to capture)
                    handles.append(lin.register_forward_hook(lambda m, a, o, calls=calls: calls.append((a[0], o))))
    out = output(case, model, inputs)
    for h in handles:
        h.remove()
    for lin, w, p, captured in seen.values():
        assert captured or not p.called
        bias = lin.bias.detach() if p.called and lin.bias is not None else 0.0
        for x, y in captured:
            torch.testing.assert_close(y, _projected(lin, x, w, bias), rtol=1e-5, atol=1e-5)
    # the whole model with W + λI written into its weights computes the same function
    by_name = {id(m): n for n, m in model.named_modules()}
    explicit_modules = dict(explicit.named_modules())
    with torch.no_grad():
        for lin, w, p, _ in seen.values():  # (Conv1D stores the paper's W: the transpose)
            param = getattr(explicit_modules[by_name[id(lin)]], p.param)
            param.copy_((w.T if p.transposed else w).reshape(param.shape))
    torch.testing.assert_close(out, output(case, explicit, inputs), rtol=1e-4, atol=1e-4)
    assert all(torch.equal(v, stored[k]) for k, v in model.state_dict().items())  # parameters never hold λI


# ---------------------------------------------------------------- CET at the first block


def _first_block_input(model, inputs, case: Case) -> torch.Tensor:
    """The first block's input as (B, N, D) tokens, read by a pre-hook registered after any CET hook."""
    site, seen = find_tokens(model), []

    def hook(module, args, kwargs):
        seen.append((args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))).detach())

    h = site.first_block.register_forward_pre_hook(hook, with_kwargs=True)
    output(case, model, inputs)
    h.remove()
    x = seen[0]
    if x.dim() == 4:  # (B, H, W, C) maps, or channels first (B, C, H, W): X is the (H·W) × C matrix
        x = x.flatten(2).transpose(1, 2) if site.channels_first else x.reshape(x.shape[0], -1, x.shape[-1])
    return x


def _kappa(x: torch.Tensor) -> float:
    s = torch.linalg.svdvals(x.double())
    return float(s[0] / s[-1])


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].token])
@pytest.mark.parametrize(("solver", "bound"), [("svd", 2.0 + 1e-4), ("newton_schulz", 2.05)])
def test_cet_bounds_kappa_and_leaves_padding_untouched(name, solver, bound):
    """κ(X + C) ≤ 2 (exact SVD) or the fast solver's documented 2.05 (conditioning/embedded.py) for every sample's
    real tokens at the first block's input; padded rows leave CET exactly as they came."""
    case = CASES[name]
    base, cond, inputs = case.build(), case.build(), case.inputs()
    condattn.apply_conditioning(cond, "embedded", solver=solver, **case.cet)
    x0, x1 = _first_block_input(base, inputs, case), _first_block_input(cond, inputs, case)
    keep = case.keep(inputs)
    if keep is None:
        keep = torch.ones(x0.shape[:2], dtype=torch.bool)
    else:
        assert not keep.all()  # the case has padding to leave alone
    assert keep.shape == x0.shape[:2]
    assert torch.equal(x1[~keep], x0[~keep])
    assert not torch.equal(x1[keep], x0[keep])
    for b in range(x1.shape[0]):
        assert _kappa(x0[b][keep[b]]) > case.raw_kappa_min
        assert _kappa(x1[b][keep[b]]) <= bound, (b, _kappa(x1[b][keep[b]]))


# ---------------------------------------------------------------- the registry


def test_priority_not_registration_order_decides(monkeypatch):
    """Two finders that both match a module: the higher priority wins whichever registered first; equal
    priorities fall back to the layout names, never to the registration order."""
    from condattn.conditioning import sites

    lin = torch.nn.Linear(4, 12)

    def finder(layout):
        return lambda name, m: sites.AttentionSite(name, m, layout, 1, 4, sites.stacked(m, 1)[1]) \
            if isinstance(m, torch.nn.Linear) else None

    for order in (("low", "high"), ("high", "low")):
        monkeypatch.setattr(sites, "ATTENTION_LAYOUTS", {})
        monkeypatch.setattr(sites, "PRIORITY", {})
        for layout in order:
            sites.attention_layout(layout, priority=1 if layout == "high" else 0)(finder(layout))
        assert [s.layout for s in sites.find_attention(lin)] == ["high"]
    for order in (("b", "a"), ("a", "b")):
        monkeypatch.setattr(sites, "ATTENTION_LAYOUTS", {})
        monkeypatch.setattr(sites, "PRIORITY", {})
        for layout in order:
            sites.attention_layout(layout)(finder(layout))
        assert [s.layout for s in sites.find_attention(lin)] == ["a"]
    with pytest.raises(ValueError, match="registered twice"):
        sites.attention_layout("a")(finder("a"))


# ---------------------------------------------------------------- weights read by their module (Projection.called)


@pytest.mark.parametrize("name", ["eva02", "beit", "torch_mha"])
def test_sca_fold_trains_the_stored_weight(name):
    """timm Eva / BEiT with q/v biases and nn.MultiheadAttention read their projection weights themselves: in
    training, the loss and the gradient on each stored weight equal those of the model with W + λI written into
    its weights, and no folded weight is left on a module after a forward, also after one that raised."""
    case = CASES[name]
    model, inputs = case.build().train(), case.inputs()
    explicit = copy.deepcopy(model)
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    sites = find_attention(model)
    folded = {(id(p.linear), p.param): p for s in sites for p in s.proj.values() if not p.called}
    assert folded
    by_name = {id(m): n for n, m in model.named_modules()}
    explicit_modules = dict(explicit.named_modules())
    with torch.no_grad():
        for s in sites:
            for role, p in s.proj.items():
                getattr(explicit_modules[by_name[id(p.linear)]], p.param)[p.cols] = s.weight(role)
    loss, ref = case.run(model, inputs).square().mean(), case.run(explicit, inputs).square().mean()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    ref.backward()
    for p in folded.values():
        assert p.param not in vars(p.linear)
        grad = stored_weight(p).grad
        want = getattr(explicit_modules[by_name[id(p.linear)]], p.param).grad
        assert grad is not None and grad.abs().sum() > 0
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-6)
    clone = copy.deepcopy(model)  # the copy's hooks fold into the copy's own weights
    with torch.no_grad():
        for p in folded.values():
            stored_weight(p).mul_(0.5)  # (changes the original only)
        torch.testing.assert_close(case.run(clone, inputs).square().mean(), ref.detach(), rtol=1e-5, atol=1e-6)
    module = next(s.module for s in sites if not s.proj["q"].called)
    x = torch.randn(2, 5, 7)  # a width no projection accepts: the forward raises after the fold
    with pytest.raises((RuntimeError, AssertionError)):
        module(x, x, x) if isinstance(module, torch.nn.MultiheadAttention) else module(x)
    assert not any(p.param in vars(p.linear) for p in folded.values())


# ---------------------------------------------------------------- a user's own layout (docs/getting-started.md)


def test_the_docs_register_a_layout_for_a_users_model(monkeypatch):
    """Getting started's "Register a layout for your own model" example runs as written: it registers an attention
    and a token layout from user code (no library edit), and SCA, CET and removal act on the user's model."""
    from pathlib import Path

    from condattn.conditioning import sites

    page = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in page.split("```")[1::2] if b.startswith("python\n")]
    (code,) = [b for b in blocks if "@attention_layout(" in b]
    monkeypatch.setattr(sites, "ATTENTION_LAYOUTS", dict(sites.ATTENTION_LAYOUTS))  # registrations end with the test
    monkeypatch.setattr(sites, "TOKEN_LAYOUTS", dict(sites.TOKEN_LAYOUTS))
    monkeypatch.setattr(sites, "PRIORITY", dict(sites.PRIORITY))
    ns: dict = {}
    exec(compile(code, "docs/getting-started.md", "exec"), ns)
    report, model = ns["report"], ns["model"]
    assert report.counts == {"spectral:my_attention": 2, "embedded:my_model": 1}
    assert "my_attention" in sites.ATTENTION_LAYOUTS and "my_model" in sites.TOKEN_LAYOUTS
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x)
        condattn.remove_conditioning(model)
        plain = model(x)
        assert not torch.equal(out, plain)
        # SCA on the user's layout is W + λI: the same model with λI written into W_Q, W_K, W_V
        for blk in model.blocks:
            for lin in (blk.q, blk.k, blk.v):
                lin.weight += 10.0 * torch.eye(*lin.weight.shape)
        site = find_tokens(model)
        seen = []
        h = site.first_block.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
        model(x)
        h.remove()
        want = polar_correction(seen[0], solver="newton_schulz")  # CET at the first block's input
        y = want
        for blk in model.blocks:
            y = blk(y)
        torch.testing.assert_close(out, y, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the report lists the options that act on the model


@pytest.mark.parametrize("name", ["vit", "nystromformer", "detr"])
def test_patch_report_lists_only_the_options_that_apply(name):
    """`detr_attention` only for a model whose attention sites carry kinds (DETR), not for ViT or the LRA
    Nyströmformer; the newton_schulz iteration counts only with that solver; each method's own options only."""
    case = CASES[name]
    grouped = any(s.group is not None for s in find_attention(case.build()))
    assert grouped == (name == "detr")
    rep = condattn.apply_conditioning(case.build(), "spectral+embedded", lam=2.0)
    assert ("detr_attention" in rep.options) == grouped
    assert ("detr_attention" in str(rep)) == grouped and ("detr_attention" in str(rep.to_dict())) == grouped
    assert {"lam", "targets", "identity", "position", "solver", "lift_iters", "ns_iters", "power_iters"} <= set(
        rep.options)
    svd = condattn.apply_conditioning(case.build(), "embedded", solver="svd")
    assert set(svd.options) == {"position", "tokens", "gradient", "solver", "scale"}
    spectral = condattn.apply_conditioning(case.build(), "spectral")
    detr = {"detr_attention"} if grouped else set()
    assert set(spectral.options) == {"lam", "targets", "identity", "correction", "mode", "lam_unit"} | detr
    exact = condattn.apply_conditioning(case.build(), "spectral", correction="svd")
    assert set(exact.options) == {"targets", "identity", "correction", "mode", "refresh_every"} | detr


# ---------------------------------------------------------------- diagnostics on the new families


@pytest.mark.parametrize("name", ["eva02", "rope_vit_gqa", "beit", "hf_vit", "llama", "torch_mha"])
def test_cheap_diagnostics_on_the_new_layouts(name):
    """Weight κ (per head too: k/v of grouped-query attention have fewer heads) and attention entropy of an SCA
    model. Entropy is the module's own attention probabilities (diagnostics/readers.py), also where the module reads its
    weights itself (Eva / BEiT with q/v biases, nn.MultiheadAttention)."""
    from condattn.diagnostics import cheap_diagnostics

    case = CASES[name]
    model, inputs = case.build(), case.inputs()
    condattn.apply_conditioning(model, "spectral", lam=2.0)
    mask = case.keep(inputs)
    diag = cheap_diagnostics(model, case.run, inputs, mask)
    sites = find_attention(model)
    assert len(diag["weights"]) == len(sites) == case.attention_layers
    for entry, site in zip(diag["weights"], sites):
        for role in ROLES:
            heads = site.proj[role].out_features // site.head_dim
            assert len(entry[role]["kappa_heads"]) == heads
            assert 1.0 <= entry[role]["kappa"] < 10.0  # W + 2I of a small random init is well conditioned
    for entry, site in zip(diag["attention"], sites):
        assert entry["absent"] is None, (site.name, entry["absent"])
        assert 0.0 <= entry["entropy"] <= entry["entropy_uniform"] + 1e-6, (site.name, entry["entropy"])
