"""A user's own models, each a callable that returns (model, batch, loss): for `python -m condattn.diagnose --model
own_model:tiny_llama` (tests/test_attention_truth.py) and for the method library without timm or transformers
(tests/test_torch_alone.py). Everything but tiny_llama is plain torch, written as users write attention:

- separate_qkv: q_proj / k_proj / v_proj Linears, `num_heads`, an `o_proj` (a pre-norm encoder over embeddings);
- fused_qkv: one `qkv` Linear [Q; K; V] and `proj`, as in timm's ViT but a class of one's own;
- nanogpt: nanoGPT's `CausalSelfAttention` (`c_attn` Linear [Q; K; V], `c_proj`, `n_head`, `is_causal`);
- torch_encoder: the README's nn.TransformerEncoder (nn.MultiheadAttention inside) over embeddings;
- meta_style: Meta's `wq/wk/wv/wo`, the head count in `self.h`, causal only in its SDPA call.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LAYERS, TOKENS = 37, 32, 4, 2, 12


class SeparateAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.o_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class FusedAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class CausalSelfAttention(nn.Module):
    """nanoGPT's (karpathy/nanoGPT model.py), dropout left out."""

    is_causal = True

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MetaAttention(nn.Module):
    """Meta-style (`wq/wk/wv/wo`), the head count in `self.h`, which no finder knows (found by recomputation), and
    causal only in its kernel call (read from a traced call)."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.h = n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (w(x).view(b, n, self.h, d // self.h).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, attention: nn.Module, dim: int):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), attention, nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyLM(nn.Module):
    """Token and position embeddings, `blocks`, a final norm and a head: logits (B, T, VOCAB)."""

    def __init__(self, attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(TOKENS, DIM)
        self.blocks = nn.ModuleList(Block(attention(DIM, HEADS), DIM) for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


class EncoderLM(nn.Module):
    """The README's nn.TransformerEncoder (batch first) between an embedding and a head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(DIM, HEADS, 2 * DIM, batch_first=True),
                                             LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def _batch() -> dict:
    return {"ids": torch.randint(0, VOCAB, (4, TOKENS), generator=torch.Generator().manual_seed(1))}


def _loss(m, b):
    """Next-token cross-entropy."""
    logits = m(b["ids"])
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), b["ids"][:, 1:].reshape(-1))


def _own(build):
    torch.manual_seed(0)
    return build(), _batch(), _loss


def separate_qkv():
    return _own(lambda: TinyLM(SeparateAttention))


def fused_qkv():
    return _own(lambda: TinyLM(FusedAttention))


def nanogpt():
    return _own(lambda: TinyLM(CausalSelfAttention))


def torch_encoder():
    return _own(EncoderLM)


def meta_style():
    return _own(lambda: TinyLM(MetaAttention))


HOME_MADE = {"separate_qkv": separate_qkv, "fused_qkv": fused_qkv, "nanogpt": nanogpt, "torch_encoder": torch_encoder,
             "meta_style": meta_style}


def tiny_llama():
    """A 2-layer Llama with grouped-query attention (4 query heads, 2 key/value heads), random init, and a padded
    batch; the loss is the next-token cross-entropy."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64))
    ids = torch.randint(1, 61, (2, 32), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 24:] = 0
    return model.eval(), {"input_ids": ids, "attention_mask": mask}, lambda m, b: m(**b, labels=b["input_ids"]).loss


def not_a_model():
    return 3
