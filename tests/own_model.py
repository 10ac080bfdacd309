"""A user's own model for `python -m condattn.diagnose --model own_model:tiny_llama` (tests/test_attention_truth.py):
a callable that returns (model, batch, loss)."""

import torch


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
