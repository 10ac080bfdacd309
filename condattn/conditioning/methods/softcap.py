"""Logit soft-capping (Gemma 2; transformers' `attn_logit_softcapping`): each attention logit s = q·kᵀ·scale becomes
cap·tanh(s / cap) before the mask and the softmax, so no logit exceeds ±cap. Parameter-free.

The fused kernel never forms s, so at every patched layer F.scaled_dot_product_attention is replaced by the explicit
computation (methods/logits.py), and each PatchReport entry says so: memory grows with the N × N logits per head.
Gemma 2's default cap is 50 (`softcap_cap`). Refused where the logits are not q·kᵀ over the tokens, where the module
forms its softmax itself, and on a transformers layer that already soft-caps its logits.
"""

from __future__ import annotations

from torch import nn

from ..report import PatchEntry, PatchReport
from ..spec import MethodSpec, finite_number, register_method
from .logits import patchable, rule_of

GEMMA2_CAP = 50.0  # transformers Gemma2Config.attn_logit_softcapping


def apply_softcap(model: nn.Module, report: PatchReport, cap: float = GEMMA2_CAP, partial: bool = False) -> list:
    """cap·tanh(logits / cap) at every attention layer that can take it; returns the handles that undo it."""
    handles: list = []
    for site, how, words in patchable(model, report, "softcap", partial, heads=False):
        rule_of(site, how, handles).cap = float(cap)
        report.entries.append(PatchEntry(site.name, f"softcap:{site.layout}",
                                         f"{words}: explicit softmax({cap:g}·tanh(q·kᵀ·scale/{cap:g}) + mask)·V"))
    report.notes.append("softcap replaces the fused attention kernel (F.scaled_dot_product_attention) of each patched "
                        "layer by an explicit computation of its logits: more memory and time per step")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_softcap(model, report, cap=spec["softcap_cap"], partial=partial)


register_method(MethodSpec("softcap", {"softcap_cap": GEMMA2_CAP}, label="softcap (logit soft-capping)",
                           validators={"softcap_cap": finite_number(1e-6, " (Gemma 2's cap is 50)")}, apply=_apply,
                           per_layer=True, short="soft-cap", rival=True,
                           bench_arms={"soft-cap": {}}, sources=("methods/softcap.py", "methods/logits.py"),
                           cost="explicit attention (no fused kernel) with a tanh over the N × N logits per layer"))
