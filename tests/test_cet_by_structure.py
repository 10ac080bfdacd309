"""CET's token site found by structure (layouts/structural_tokens.py, and nn.TransformerEncoder's own layout) on
models written here: a home-made ViT-like model (patch embedding, class token, position embedding, blocks), the
README's nn.TransformerEncoder batch-first and sequence-first with a padding mask, a causal decoder that says so only
in its kernel call, and an encoder–decoder whose X is ambiguous. And every README / getting-started code block that
runs as written, with each alternative its comments name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import condattn

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]
DIM = 32


class Attention(nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        self.n_heads, self.causal = 4, causal
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 4, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(o.transpose(1, 2).reshape(b, n, DIM))


class Block(nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(DIM), Attention(causal)
        self.norm2, self.mlp = nn.LayerNorm(DIM), nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, DIM))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, 10)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


class TinyDecoder(nn.Module):  # causal only in its SDPA call: no is_causal attribute anywhere
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, DIM)
        self.layers = nn.Sequential(*(Block(causal=True) for _ in range(2)))

    def forward(self, ids):
        return self.layers(self.tok(ids))


class EncDec(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleList(Block() for _ in range(2))
        self.decoder = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for b in self.encoder:
            x = b(x)
        for b in self.decoder:
            x = b(x)
        return x


def _kappa_at(model, name: str, run) -> torch.Tensor:
    """κ of each sample's token matrix entering module `name`."""
    seen = []
    h = model.get_submodule(name).register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        run()
    h.remove()
    s = torch.linalg.svdvals(seen[0].double())
    return s[..., 0] / s[..., -1]


def test_cet_patches_a_home_made_vit_with_no_layout_written():
    torch.manual_seed(0)
    model, img = TinyViT().eval(), torch.randn(3, 3, 16, 16)
    before = model(img)
    rep = condattn.apply_conditioning(model, "embedded", solver="svd")
    assert rep.counts == {"embedded:structural_tokens": 1}
    entry = rep.entries[0]
    assert entry.module == "blocks.0 input" and "found by structure" in entry.detail
    kappa = _kappa_at(model, "blocks.0.norm1", lambda: model(img))  # X + C as the first block reads it
    assert bool((kappa <= 2 + 1e-6).all()), kappa  # CET's bound κ ≤ 2 (float64 SVD of float32 tokens)
    assert not torch.allclose(model(img), before)
    condattn.remove_conditioning(model)
    assert torch.equal(model(img), before)


@pytest.mark.parametrize("option, value", [("position", "before_pos_embed"), ("tokens", "patches_only")])
def test_what_structure_cannot_know_is_refused_with_why(option, value):
    with pytest.raises(ValueError, match=f"embedded: {option}={value} cannot be read on TinyViT: found by structure"):
        condattn.apply_conditioning(TinyViT(), "embedded", **{option: value})


def test_a_decoder_causal_only_in_its_kernel_call_is_refused_for_cet_and_ns_attention():
    with pytest.raises(ValueError, match="embedded: refused on the causal decoder TinyDecoder"):
        condattn.apply_conditioning(TinyDecoder(), "embedded")
    with pytest.raises(ValueError, match="causal self-attention"):
        condattn.apply_conditioning(TinyDecoder(), "ns_attention")
    rep = condattn.apply_conditioning(TinyDecoder(), "embedded", causal_leak="accept")
    assert rep.count("embedded") == 1


def test_an_ambiguous_stack_is_refused_with_the_one_line_that_names_it():
    with pytest.raises(ValueError, match=r"not the children of one nn.ModuleList or nn.Sequential .*ambiguous.*"
                                         r"Name it in one line: condattn.conditioning.token_layout\('encdec'\)") as e:
        condattn.apply_conditioning(EncDec(), "embedded")
    assert "\n" not in str(e.value)
    snippet = str(e.value).split("Name it in one line: ")[1].split(" (docs/")[0].replace("YOUR_BLOCKS", "encoder")
    ns = {"condattn": condattn, "EncDec": EncDec}
    exec(snippet.replace("token_layout('encdec')", "token_layout('encdec', replace=True)"), ns)
    try:
        assert condattn.apply_conditioning(EncDec(), "embedded").entries[0].module == "encoder.0 input"
    finally:
        from condattn.conditioning.sites import PRIORITY, TOKEN_LAYOUTS

        TOKEN_LAYOUTS.pop("encdec")
        PRIORITY.pop(("token", "encdec"))


@pytest.mark.parametrize("batch_first", [True, False])
def test_the_torch_encoder_reads_each_sample_and_leaves_its_padding_out(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=DIM, nhead=4, batch_first=batch_first, dropout=0.0)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 8, DIM) if batch_first else torch.randn(8, 3, DIM)
    pad = torch.zeros(3, 8, dtype=torch.bool)
    pad[0, 5:] = True  # sample 0: its last three tokens are padding
    rep = condattn.apply_conditioning(model, "embedded", solver="svd")
    assert rep.counts == {"embedded:torch_encoder": 1}
    seen = []
    h = model.layers[0].self_attn.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        model(x, src_key_padding_mask=pad)
    h.remove()
    xin = (seen[0] if batch_first else seen[0].transpose(0, 1)).double()
    raw = (x if batch_first else x.transpose(0, 1)).double()
    # the padded rows leave exactly as they came, through the same norm (norm_first=False: the input itself)
    torch.testing.assert_close(xin[0, 5:], raw[0, 5:], rtol=0, atol=0)
    for b, rows in ((0, slice(0, 5)), (1, slice(None)), (2, slice(None))):
        s = torch.linalg.svdvals(xin[b, rows])
        assert float(s[0] / s[-1]) <= 2 + 1e-6  # κ ≤ 2 per sample, over its real rows


def _python_blocks(path: Path) -> list[str]:
    text = path.read_text()
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("python\n")]


def _alternatives(block: str) -> list[str]:
    """The block as written, and with each method its comments name in `# or "a", "b"` in place of the call's."""
    out = [block]
    for line in block.splitlines():
        m = re.search(r'"(\w[\w+]*)"(.*)#\s*or\s+(.*)$', line)
        if m:
            for alt in re.findall(r'"([\w+]+)"', m.group(3)):
                call = line.split("#")[0].replace(f'"{m.group(1)}"', f'"{alt}"')
                call = re.sub(r",\s*lam=[\d.]+", "", call) if "spectral" not in alt else call
                out.append(block.replace(line, call))
    return out


@pytest.mark.parametrize("variant", range(3))
def test_the_readmes_first_block_runs_with_each_alternative_its_comment_names(variant):
    block = _python_blocks(REPO / "README.md")[0]
    runs = _alternatives(block)
    assert len(runs) == 3  # as written (SCA), "embedded", "spectral+embedded"
    ns: dict = {}
    exec(compile(runs[variant], "README.md", "exec"), ns)
    assert tuple(ns["y"].shape) == (8, 16, 64) and torch.isfinite(ns["y"]).all()
    method = ["spectral", "embedded", "spectral+embedded"][variant]
    assert ns["report"].method == method


@pytest.mark.slow  # (builds timm's vit_small_patch16_224 three times, as written: seconds)
def test_getting_starteds_first_block_runs_with_each_alternative_its_comment_names():
    pytest.importorskip("timm")
    block = _python_blocks(REPO / "docs" / "getting-started.md")[0]
    runs = _alternatives(block)
    assert len(runs) == 3
    for run in runs:
        ns: dict = {}
        exec(compile(run, "getting-started.md", "exec"), ns)
        assert ns["report"].entries
