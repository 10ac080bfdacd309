"""Compatibility re-export: the layouts moved to `conditioning/sites.py` (sites and the registry) and
`conditioning/layouts/` (one module per architecture family)."""

from .layouts.detr import DETR_ATTENTION
from .sites import (
    ATTENTION_LAYOUTS,
    ROLES,
    TOKEN_LAYOUTS,
    AttentionSite,
    Projection,
    TokenSite,
    attention_layout,
    find_attention,
    find_tokens,
    token_layout,
)

__all__ = ["ATTENTION_LAYOUTS", "DETR_ATTENTION", "ROLES", "TOKEN_LAYOUTS", "AttentionSite", "Projection", "TokenSite",
           "attention_layout", "find_attention", "find_tokens", "token_layout"]
