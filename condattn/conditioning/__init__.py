"""The method library: every conditioning method (the papers' SCA `spectral` and CET `embedded`, the follow-up's
`conditioned_init`, and the field's `qk_norm`, `sigma_reparam`, `mimetic_init`, `ns_attention`) and where they attach.

The method library's lower half: it imports torch (timm / transformers only inside the layout finders) and nothing
else of condattn. `spec.py` holds every method's MethodSpec (options, checks, which act, how it is planned and
applied, and its facts: per layer, init-only, label, cost, added keys) and the registry; `paper.py` the papers'
methods, `methods/` the field's; `sites.py` the sites and the layout registry, `layouts/` one module per architecture
family, `forms.py` how each site's attention logits are formed, `tokens.py` how tokens and padding masks are read.
"""

from . import (
    layouts,  # noqa: F401  (registers every family's layouts)
    methods,  # noqa: F401  (registers the field's methods and the qk_norm composites: methods/)
    verify,  # noqa: F401  (registers the probe of sites matched by structure alone: sites.SITE_CHECKS)
)
from .api import (
    EMBEDDED_DEFAULTS,
    METHODS,
    SPECTRAL_DEFAULTS,
    MethodWeightsMissing,
    after_optimizer_step,
    apply_conditioning,
    conditioning_report,
    from_pretrained,
    remove_conditioning,
)
from .embedded import polar_correction
from .forms import AttentionForm
from .report import PatchEntry, PatchReport
from .sites import (
    ATTENTION_LAYOUTS,
    ROLES,
    TOKEN_LAYOUTS,
    AttentionSite,
    OutputProjection,
    Projection,
    TokenSite,
    attention_layout,
    find_attention,
    find_tokens,
    separate,
    stacked,
    token_layout,
)
from .spec import ConditioningSpec, MethodSpec, composite, conditioning_spec, method_spec, register_method

__all__ = [
    "ATTENTION_LAYOUTS",
    "EMBEDDED_DEFAULTS",
    "METHODS",
    "MethodWeightsMissing",
    "ROLES",
    "SPECTRAL_DEFAULTS",
    "TOKEN_LAYOUTS",
    "AttentionForm",
    "AttentionSite",
    "ConditioningSpec",
    "MethodSpec",
    "OutputProjection",
    "PatchEntry",
    "PatchReport",
    "Projection",
    "TokenSite",
    "after_optimizer_step",
    "apply_conditioning",
    "attention_layout",
    "composite",
    "conditioning_spec",
    "conditioning_report",
    "find_attention",
    "find_tokens",
    "from_pretrained",
    "method_spec",
    "polar_correction",
    "register_method",
    "remove_conditioning",
    "separate",
    "stacked",
    "token_layout",
]
