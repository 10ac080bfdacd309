"""The LRA classifiers: transformers' Nyströmformer with the Nyströmformer authors' LRA configuration
(mlpen/Nystromformer, LRA/code/lra_config.py) and a mean-pooled classification head; for Retrieval the
same encoder applied to both documents of a pair (LRA/code/model_wrapper.py, ModelForSCDual).

`pre_norm=True` (the default) arranges the blocks as the authors' LRA model (LRA/code/model.py): no LayerNorm on the
embeddings, x + Drop(Attn(LN(x))) then x + MLP(LN(x)) in each block, and a final LayerNorm before pooling.
transformers' Nyströmformer is post-LN (BERT's arrangement); `pre_norm=False` keeps it."""

from __future__ import annotations

import torch
from torch import nn
from transformers import NystromformerConfig, NystromformerModel
from transformers.models.nystromformer.modeling_nystromformer import NystromformerLayer


class PreNormNystromformerLayer(NystromformerLayer):
    """A transformers Nyströmformer layer run pre-LN with the same modules (so conditioning hooks and checkpoints see
    the same names): attention.output.LayerNorm normalises the block input, output.LayerNorm the MLP input."""

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        a = self.attention
        attn = a.self(a.output.LayerNorm(hidden_states), attention_mask, output_attentions)
        x = hidden_states + a.output.dropout(a.output.dense(attn[0]))
        # the LRA MLP: Linear, GELU, Dropout, Linear, Dropout
        h = self.output.dropout(self.output.dense(self.output.dropout(self.intermediate(self.output.LayerNorm(x)))))
        return (x + h, *attn[1:])


class NystromformerClassifier(nn.Module):
    head_inputs = 1  # pooled encodings the head reads (its input width is head_inputs × hidden_size)

    def __init__(
        self,
        *,
        vocab_size: int,
        num_classes: int,
        seq_len: int,
        hidden_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 2,
        intermediate_size: int = 128,
        num_landmarks: int = 64,
        conv_kernel_size: int | None = 35,
        dropout: float = 0.1,
        head_hidden: int = 128,
        pre_norm: bool = True,
    ):
        super().__init__()
        if seq_len % num_landmarks:
            raise ValueError(
                f"seq_len={seq_len} must be a multiple of num_landmarks={num_landmarks} "
                "(transformers' Nyströmformer segments the sequence into landmarks); pad to a power of two"
            )
        config = NystromformerConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            intermediate_size=intermediate_size,
            hidden_act="gelu",
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
            max_position_embeddings=seq_len,  # learned absolute positions, one per padded position
            segment_means_seq_len=seq_len,
            num_landmarks=num_landmarks,
            conv_kernel_size=35 if conv_kernel_size is None else conv_kernel_size,  # the config wants an int
            type_vocab_size=1,
            pad_token_id=0,
        )
        if conv_kernel_size is None:  # no depthwise conv on V: set after validation, read when the layers are built
            object.__setattr__(config, "conv_kernel_size", None)
        self.backbone = NystromformerModel(config)
        self.pre_norm = bool(pre_norm)
        if self.pre_norm:
            layers = self.backbone.encoder.layer
            for i, old in enumerate(layers):
                new = PreNormNystromformerLayer(config)
                new.load_state_dict(old.state_dict())  # transformers' initialisation, unchanged
                layers[i] = new
            self.backbone.embeddings.LayerNorm = nn.Identity()  # the LRA model adds token + position, no norm
            self.final_norm = nn.LayerNorm(hidden_size)
        # LRA's classifier: Linear -> ReLU -> Linear on the pooled encoding
        self.head = nn.Sequential(
            nn.Linear(hidden_size * self.head_inputs, head_hidden), nn.ReLU(), nn.Linear(head_hidden, num_classes)
        )

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Mean over the non-padded positions (the LRA code averages all positions; padding carries no
        information, so we exclude it)."""
        # transformers 5.x builds an (N × N) 4-D mask from a 2-D one, which its Nyström branch cannot add to the
        # (landmarks × N) scores; an explicit (B, 1, 1, N) additive key mask is passed through unchanged.
        keys = attention_mask[:, None, None, :].to(torch.float32)
        additive = (1.0 - keys) * torch.finfo(torch.float32).min
        hidden = self.backbone(input_ids=input_ids, attention_mask=additive).last_hidden_state
        if self.pre_norm:
            hidden = self.final_norm(hidden)
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(input_ids, attention_mask))


class NystromformerDualEncoder(NystromformerClassifier):
    """LRA Retrieval: one shared Nyströmformer encodes both documents of a pair (two towers, shared weights);
    the mean-pooled encodings u, v enter the LRA head as [u, v, u·v, u − v] (the Nyströmformer code's
    SCHeadDual). The encoder runs once per document, each time with that document's padding mask, so the
    conditioning hooks on the shared encoder (SCA on its 2 attention layers, CET at its first block) see
    each tower's pass separately."""

    head_inputs = 4

    def forward(
        self,
        input_ids_0: torch.Tensor,
        attention_mask_0: torch.Tensor,
        input_ids_1: torch.Tensor,
        attention_mask_1: torch.Tensor,
    ) -> torch.Tensor:
        u = self.encode(input_ids_0, attention_mask_0)
        v = self.encode(input_ids_1, attention_mask_1)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))
