"""A learnable attention sink per head (transformers' GPT-OSS `sinks`): each head's softmax gets one more logit, a
parameter of its own, whose probability is dropped after the softmax, so a head can attend to "nothing":

    p = softmax([q·kᵀ·scale + mask, s_h])[..., :-1]      (GPT-OSS's eager_attention_forward)

One parameter per query head, `condattn_sinks` on each attention module (new state_dict keys), initialised at 0
(GPT-OSS draws its sinks from N(0, initializer_range²), about 0; a sink of 0 is softmax with "+1" in the
denominator). The fused kernel has no sink, so at every patched layer F.scaled_dot_product_attention is replaced by
the explicit computation (methods/logits.py), and each PatchReport entry says so. Refused where the logits are not
q·kᵀ over the tokens, where the module forms its softmax itself, and on a layer that has sinks already.
"""

from __future__ import annotations

import torch
from torch import nn

from ..report import PatchEntry, PatchReport
from ..spec import MethodSpec, register_method
from .common import Undo
from .logits import patchable, rule_of

SINKS = "condattn_sinks"


def _drop(m: nn.Module) -> None:
    m._parameters.pop(SINKS, None)


def _no_sink(m: nn.Module) -> None:
    rule = m.__dict__.get("_condattn_logits")
    if rule is not None:
        rule.sink = False


def apply_attention_sink(model: nn.Module, report: PatchReport, partial: bool = False) -> list:
    """A sink logit per head at every attention layer that can take it; returns the handles that undo it."""
    handles: list = []
    added = 0
    for site, how, words in patchable(model, report, "attention_sink", partial):
        m = site.module
        w = next(m.parameters())
        m.register_parameter(SINKS, nn.Parameter(torch.zeros(site.num_heads, dtype=w.dtype, device=w.device)))
        handles.append(Undo(_drop, m))
        rule_of(site, how, handles).sink = True
        handles.append(Undo(_no_sink, m))
        added += site.num_heads
        report.entries.append(PatchEntry(site.name, f"attention_sink:{site.layout}",
                                         f"{words}: explicit softmax([q·kᵀ·scale + mask, sink])·V, "
                                         f"{site.num_heads} sinks"))
    report.notes.append(f"attention_sink adds {added} learnable sink logits (init 0; state_dict keys *.{SINKS}) and "
                        "replaces the fused attention kernel of each patched layer by an explicit computation")
    return handles


def _apply(model: nn.Module, spec, report: PatchReport, partial: bool = False) -> list:
    return apply_attention_sink(model, report, partial=partial)


register_method(MethodSpec("attention_sink", {}, label="attention_sink (a learnable sink per head)", apply=_apply,
                           per_layer=True, short="attention sink", rival=True, adds_keys=True,
                           bench_arms={"sink": {}}, sources=("methods/attention_sink.py", "methods/logits.py"),
                           cost="explicit attention (no fused kernel) with one more logit column per head"))
