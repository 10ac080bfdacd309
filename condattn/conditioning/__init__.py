"""The two conditioning methods (SCA: `spectral`, CET: `embedded`) and where they attach.

The method library's lower half: it imports torch (timm / transformers only inside the layout finders) and nothing
else of condattn. `sites.py` holds the sites and the layout registry, `layouts/` one module per architecture family,
`forms.py` how each site's attention logits are formed, `tokens.py` how tokens and padding masks are read.
"""

from . import layouts  # noqa: F401  (registers every family's layouts)
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
from .forms import AttentionForm
from .report import PatchEntry, PatchReport
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
    separate,
    stacked,
    token_layout,
)

__all__ = [
    "ATTENTION_LAYOUTS",
    "EMBEDDED_DEFAULTS",
    "METHODS",
    "ROLES",
    "SPECTRAL_DEFAULTS",
    "TOKEN_LAYOUTS",
    "AttentionForm",
    "AttentionSite",
    "PatchEntry",
    "PatchReport",
    "Projection",
    "TokenSite",
    "apply_conditioning",
    "attention_layout",
    "conditioning_report",
    "find_attention",
    "find_tokens",
    "polar_correction",
    "remove_conditioning",
    "resolve_options",
    "separate",
    "stacked",
    "token_layout",
]
