"""The two conditioning methods (SCA: `spectral`, CET: `embedded`) and where they attach."""

from .api import (
    EMBEDDED_DEFAULTS,
    METHODS,
    SPECTRAL_DEFAULTS,
    apply_conditioning,
    conditioning_report,
    remove_conditioning,
    resolve_options,
)
from .embedded import polar_correction
from .report import PatchEntry, PatchReport
from .targets import ATTENTION_LAYOUTS, TOKEN_LAYOUTS, AttentionSite, TokenSite, find_attention, find_tokens

__all__ = [
    "ATTENTION_LAYOUTS",
    "EMBEDDED_DEFAULTS",
    "METHODS",
    "SPECTRAL_DEFAULTS",
    "TOKEN_LAYOUTS",
    "AttentionSite",
    "PatchEntry",
    "PatchReport",
    "TokenSite",
    "apply_conditioning",
    "conditioning_report",
    "find_attention",
    "find_tokens",
    "polar_correction",
    "remove_conditioning",
    "resolve_options",
]
