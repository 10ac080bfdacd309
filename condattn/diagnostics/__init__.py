"""Measurements of the papers' figures: κ of W_Q/W_K/W_V, κ(X) per block,
κ of attention outputs, attention entropy, W_Q/W_K/W_V gradient norms, and κ(J) of one attention head.

The method library's upper half: it imports torch and condattn.conditioning (the sites it measures), nothing else."""

from .attention import AttentionProbe, attention_entropy, softmax_entropy
from .collect import cheap_diagnostics, compare_conditioning, flat_metrics, grad_diagnostics
from .grads import qkv_grad_norms
from .jacobian import (
    attention_head,
    attention_jacobian,
    jacobian_condition_number,
    jacobian_condition_number_matfree,
    jacobian_singular_values,
    lanczos_extremes,
    xca_head,
)
from .layer_jacobian import EXACT_MAX_ENTRIES, head_inputs, jacobian_diagnostics, jacobian_kappa
from .linalg import batch_condition_numbers, condition_number, sigma_max, sigma_min, singular_values
from .saturation import FeatureProbe, classifier_module, embed_grad_norm, feature_spread
from .tokens import TokenProbe, token_conditioning
from .weights import weight_conditioning

__all__ = [
    "EXACT_MAX_ENTRIES",
    "AttentionProbe",
    "FeatureProbe",
    "TokenProbe",
    "attention_entropy",
    "attention_head",
    "attention_jacobian",
    "batch_condition_numbers",
    "cheap_diagnostics",
    "classifier_module",
    "compare_conditioning",
    "embed_grad_norm",
    "feature_spread",
    "condition_number",
    "flat_metrics",
    "grad_diagnostics",
    "head_inputs",
    "jacobian_condition_number",
    "jacobian_diagnostics",
    "jacobian_kappa",
    "jacobian_condition_number_matfree",
    "jacobian_singular_values",
    "lanczos_extremes",
    "qkv_grad_norms",
    "sigma_max",
    "sigma_min",
    "singular_values",
    "softmax_entropy",
    "token_conditioning",
    "weight_conditioning",
    "xca_head",
]
