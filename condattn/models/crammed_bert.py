"""crammed BERT (Geiping & Goldstein, "Cramming", ICML 2023): our own module for cramming's `crammed-bert` architecture.

What it follows (cramming `cramming/config/arch/crammed-bert.yaml` and `architectures/crammed_bert.py`, read at the
JonasGeiping/cramming):
- embedding: word embedding (normal(0, 0.02), the padding row zero) + scaled-sinusoidal positions (a fixed sinusoid
  table times one learned scalar, initialised to 1/√D; FLASH's "scaled sinusoidal"), then LayerNorm, then dropout;
- `num_layers` pre-LN blocks: x + drop(attn(LN(x))), then x + drop(ffn(LN(x))); a final LayerNorm after the last;
- attention: 12 heads, softmax(q kᵀ/√d) v through `F.scaled_dot_product_attention`, attention dropout, an output
  projection `dense`;
- FFN: `dense_in` D → intermediate (3072), GELU-GLU (the 3072 outputs are halved into (x, gate): GELU(gate) · x, 1536
  wide), `dense_out` 1536 → D;
- no bias in any Linear (cramming `use_bias: False`, `qkv_bias: False`, `decoder_bias: False`);
- no prediction-head transform (cramming `skip_head_transform: True`); the decoder is the word embedding itself
  (tied: logits = final hidden @ Eᵀ, no separate decoder parameter, so the state_dict holds the matrix once);
- sparse prediction: with `labels`, the decoder only runs on the positions whose label is not -100 (the masked
  tokens), which is where MLM's loss lives; without labels it returns dense logits.

Our choices where cramming's code differs or is open:
- LayerNorm bias: a summary of the recipe says "no biases"; cramming's code builds its norms with
  torch's default LayerNorm, which HAS a bias (its `use_bias: False` only reaches the Linears). `norm_bias` (default
  false) selects; the configs say so.
- Fused qkv layout: cramming's `SeqFirstSelfAttention.query_key_value` interleaves its 3·D output columns PER HEAD
  (Megatron/NeoX: the output is viewed as (…, heads, 3·head_dim) and split), and runs sequence-first. Ours is a
  block-stacked [Q; K; V] `qkv` Linear (output viewed as (…, 3, heads, head_dim), as timm's ViT), batch-first. The two
  are the same function family: a fixed permutation of the output rows maps one weight onto the other, so this is an
  equivalent reparametrisation (a weight loaded from cramming must have its rows permuted). Block-stacking is what
  SCA's `full` identity placement means for a fused projection (λI_D on each of the three D×D blocks), and it is the
  layout `conditioning.sites.stacked` reads.
- Sparse prediction selects exactly the masked positions (boolean indexing); cramming instead takes a fixed count
  round(p·B·N) of positions (an argsort trick that keeps shapes static for torch.compile, padding the selection with
  unmasked positions whose label is ignored). Same loss; ours has a data-dependent shape (recompiles under compile).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def _layer_norm(dim: int, eps: float, bias: bool) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=eps, bias=bias)


class ScaledSinusoidal(nn.Module):
    """Sinusoidal positions (Vaswani et al.) times one learned scale, initialised to 1/√D (cramming's
    `ScaledSinosoidal`). The table is a non-persistent buffer: not in the state_dict, rebuilt at construction."""

    def __init__(self, dim: int, max_len: int):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
        pe = torch.zeros(max_len, dim)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)
        self.scale_factor = nn.Parameter(torch.tensor([1.0 / math.sqrt(dim)]))

    def forward(self, n: int) -> torch.Tensor:
        if n > self.pe.shape[0]:
            raise ValueError(f"sequence of {n} tokens exceeds the {self.pe.shape[0]} positions of the model (seq_len)")
        return self.scale_factor * self.pe[:n]


class CrammedEmbedding(nn.Module):
    """word embedding + scaled-sinusoidal positions -> LayerNorm -> dropout (the first block's input X)."""

    def __init__(self, vocab_size: int, dim: int, max_len: int, pad_token_id: int | None, dropout: float,
                 norm_eps: float, norm_bias: bool):
        super().__init__()
        self.word_embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_token_id)
        self.pos_embedding = ScaledSinusoidal(dim, max_len)
        self.norm = _layer_norm(dim, norm_eps, norm_bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embedding(input_ids) + self.pos_embedding(input_ids.shape[1])
        return self.dropout(self.norm(x))


class CrammedSelfAttention(nn.Module):
    """Multi-head self-attention with ONE fused, bias-free `qkv` Linear whose output columns are block-stacked
    [Q; K; V] (each D = heads × head_dim wide, head-major inside), SDPA, and a bias-free output projection `dense`.

    cramming interleaves the fused columns per head ([q_h, k_h, v_h] for each head h); block-stacking is an
    equivalent reparametrisation (a fixed row permutation of the same weight), chosen because SCA's λI then sits on
    three contiguous D × D blocks (condattn.conditioning.layouts.crammed_bert)."""

    def __init__(self, dim: int, num_heads: int, dropout: float):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden_size={dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5  # read by the diagnostics' entropy probe
        self.dropout = float(dropout)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.dense = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, D); attn_mask None or bool (B, 1, 1, N), True = a key that may be attended to."""
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0, scale=self.scale)
        return self.dense(out.transpose(1, 2).reshape(b, n, d))


class GLU(nn.Module):
    """GELU-GLU: the input's last dim is halved into (x, gate); returns GELU(gate) · x (cramming's `GLU`, which
    follows Megatron: `x, gate = inputs.chunk(2, dim=-1)`)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x, gate = inputs.chunk(2, dim=-1)
        return F.gelu(gate) * x


class CrammedFFN(nn.Module):
    def __init__(self, dim: int, intermediate: int):
        super().__init__()
        if intermediate % 2:
            raise ValueError(f"intermediate_size={intermediate} must be even (GELU-GLU halves it)")
        self.dense_in = nn.Linear(dim, intermediate, bias=False)
        self.nonlin = GLU()
        self.dense_out = nn.Linear(intermediate // 2, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_out(self.nonlin(self.dense_in(x)))


class CrammedLayer(nn.Module):
    """Pre-LN block: x + drop(attn(norm1(x))), then x + drop(ffn(norm2(x)))."""

    def __init__(self, dim: int, num_heads: int, intermediate: int, dropout: float, attention_dropout: float,
                 norm_eps: float, norm_bias: bool):
        super().__init__()
        self.norm1 = _layer_norm(dim, norm_eps, norm_bias)
        self.attn = CrammedSelfAttention(dim, num_heads, attention_dropout)
        self.norm2 = _layer_norm(dim, norm_eps, norm_bias)
        self.ffn = CrammedFFN(dim, intermediate)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), attn_mask))
        return x + self.dropout(self.ffn(self.norm2(x)))


def _key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, N) padding mask (1 = token) -> SDPA's bool (B, 1, 1, N) key mask; None when nothing is padded (then
    SDPA may pick its fused kernels)."""
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    if bool(keep.all()):
        return None
    return keep[:, None, None, :]


class CrammedBertEncoder(nn.Module):
    """Embedding, the pre-LN blocks, the final LayerNorm. Its forward receives the padding mask (CET's
    `mask_owner`, condattn.conditioning.layouts.crammed_bert)."""

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int,
                 max_len: int, pad_token_id: int | None, dropout: float, attention_dropout: float, norm_eps: float,
                 norm_bias: bool):
        super().__init__()
        self.embedding = CrammedEmbedding(vocab_size, hidden_size, max_len, pad_token_id, dropout, norm_eps,
                                          norm_bias)
        self.layers = nn.ModuleList([
            CrammedLayer(hidden_size, num_heads, intermediate_size, dropout, attention_dropout, norm_eps, norm_bias)
            for _ in range(num_layers)
        ])
        self.final_norm = _layer_norm(hidden_size, norm_eps, norm_bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = _key_mask(attention_mask)
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x)


class CrammedBertForMLM(nn.Module):
    """The crammed-BERT encoder with its tied MLM decoder (cramming's `ScriptableLMForPreTraining` with
    `skip_head_transform: True`, `decoder_bias: False`).

    forward(input_ids (B, N), attention_mask (B, N) 1 = token, labels (B, N) or None):
      - labels given and `sparse_prediction`: logits (M, V) of the M positions whose label is not -100, in row-major
        (sample, position) order, i.e. `labels[labels != -100]` are their targets;
      - otherwise: dense logits (B, N, V).
    """

    def __init__(self, *, vocab_size: int, seq_len: int = 128, hidden_size: int = 768, num_layers: int = 16,
                 num_heads: int = 12, intermediate_size: int = 3072, dropout: float = 0.1,
                 attention_dropout: float | None = None, norm_eps: float = 1e-12, norm_bias: bool = False,
                 pad_token_id: int | None = 0, init_std: float = 0.02, sparse_prediction: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_size = int(vocab_size), int(hidden_size)
        self.sparse_prediction = bool(sparse_prediction)
        self.encoder = CrammedBertEncoder(
            int(vocab_size), int(hidden_size), int(num_layers), int(num_heads), int(intermediate_size), int(seq_len),
            pad_token_id, float(dropout), float(dropout if attention_dropout is None else attention_dropout),
            float(norm_eps), bool(norm_bias),
        )
        self._init(float(init_std))

    @torch.no_grad()
    def _init(self, std: float) -> None:
        """cramming's `init: {type: normal, std: 0.02}`: every Linear and the embedding ~ N(0, std²), the padding
        row zero, LayerNorms weight 1 (bias 0 when present); the position scale keeps its 1/√D."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, std)
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, std)
                if m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                if m.bias is not None:
                    m.bias.zero_()

    @property
    def decoder_weight(self) -> torch.Tensor:
        """The output embedding: the input word embedding itself (tied)."""
        return self.encoder.embedding.word_embedding.weight

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.decoder_weight)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(input_ids, attention_mask)
        if labels is not None and self.sparse_prediction:
            return self.decode(hidden[labels != IGNORE_INDEX])  # (M, D) -> (M, V): only the masked positions
        return self.decode(hidden)


class CrammedBertForSequenceClassification(nn.Module):
    """The crammed-BERT encoder with cramming's downstream head (`classification_head` of crammed-bert.yaml as
    GLUE_sane sets it): the first token's final hidden state ([CLS]; `pooler: zero_index`) -> Linear(D, head_dim)
    -> Tanh -> dropout -> Linear(head_dim, num_labels). num_labels 1 = regression (STS-B).

    The head is new (normal(0, init_std), biases zero; cramming's head Linears keep torch's default bias); the encoder
    comes from a pretraining checkpoint (`load_encoder`). forward(input_ids, attention_mask) -> logits (B, num_labels).
    """

    def __init__(self, *, vocab_size: int, num_labels: int, seq_len: int = 128, hidden_size: int = 768,
                 num_layers: int = 16, num_heads: int = 12, intermediate_size: int = 3072, dropout: float = 0.1,
                 attention_dropout: float | None = None, norm_eps: float = 1e-12, norm_bias: bool = False,
                 pad_token_id: int | None = 0, init_std: float = 0.02, head_dim: int = 1024,
                 classifier_dropout: float = 0.1):
        super().__init__()
        self.num_labels = int(num_labels)
        self.encoder = CrammedBertEncoder(
            int(vocab_size), int(hidden_size), int(num_layers), int(num_heads), int(intermediate_size), int(seq_len),
            pad_token_id, float(dropout), float(dropout if attention_dropout is None else attention_dropout),
            float(norm_eps), bool(norm_bias),
        )
        self.pooler = nn.Linear(int(hidden_size), int(head_dim))
        self.head_dropout = nn.Dropout(float(classifier_dropout))
        self.head = nn.Linear(int(head_dim), self.num_labels)
        CrammedBertForMLM._init(self, float(init_std))
        for lin in (self.pooler, self.head):
            nn.init.zeros_(lin.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(input_ids, attention_mask)
        return self.head(self.head_dropout(torch.tanh(self.pooler(hidden[:, 0]))))

    def load_encoder(self, state: dict[str, torch.Tensor], source: str) -> None:
        """The `encoder.*` weights of a pretraining state_dict (a CrammedBertForMLM's); the MLM decoder is the tied
        embedding, so nothing else is dropped. Raises naming the first mismatches."""
        enc = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        if not enc:
            raise ValueError(f"{source} holds no crammed-BERT encoder weights (no 'encoder.*' keys)")
        own = self.encoder.state_dict()
        bad = [f"{k}: {tuple(v.shape)} there, {tuple(own[k].shape)} here" for k, v in enc.items()
               if k in own and v.shape != own[k].shape]
        missing, extra = sorted(set(own) - set(enc)), sorted(set(enc) - set(own))
        if bad or missing or extra:
            why = bad[:2] + [f"{k} missing there" for k in missing[:2]] + [f"{k} not in this model" for k in extra[:2]]
            raise ValueError(f"{source} is not this crammed-BERT architecture ({'; '.join(why)}): give the fine-tuning "
                             "model the pretraining model's sizes (hidden_size, num_layers, num_heads, "
                             "intermediate_size, vocab_size)")
        self.encoder.load_state_dict(enc)
