"""The field's attention-conditioning methods beside the papers' SCA and CET, one module each, all applied through
`apply_conditioning(model, NAME, **options)` (each module registers its MethodSpec, spec.py):

| module          | method            | what it does                                               | attaches      |
|-----------------|-------------------|------------------------------------------------------------|---------------|
| qk_norm         | `qk_norm`         | per-head norm on q and k, the model's own class and eps    | norms (keys)  |
| sigma_reparam   | `sigma_reparam`   | Ŵ = γ/σ(W)·W, one σ per weight, a power step per forward   | γ, v (keys)   |
| mimetic         | `mimetic_init`    | W_Q W_Kᵀ ≈ αZ + βI per head, W_V W_O ≈ αZ − βI, at init    | nothing       |
| ns_attention    | `ns_attention`    | Newton–Schulz step on each head's output before W_O        | hooks only    |
| gated_attention | `gated_attention` | sigmoid gate of the query stream on the heads' output      | gate (keys)   |
| softcap         | `softcap`         | cap·tanh(logits / cap) (Gemma 2), explicit attention       | logits rule   |
| attention_sink  | `attention_sink`  | a learnable sink logit per head (GPT-OSS), explicit        | sinks (keys)  |
| qk_clip         | `qk_clip`         | after a step, W_Q / W_K of heads with max logit > τ shrink | logits reader |

`logits.py` holds what softcap, attention_sink and qk_clip share (how a layer's logits are reached). The composites of
QK-norm with the papers' methods are registered here, once both parts are: `qk_norm+spectral` (SCA's λI lands on
W_Q / W_K before the norm), `qk_norm+embedded`, `qk_norm+conditioned_init`.
"""

from ..spec import composite, register_method
from . import (  # noqa: E402  (each registers its MethodSpec)
    attention_sink,
    gated_attention,
    mimetic,
    ns_attention,
    qk_clip,
    qk_norm,
    sigma_reparam,
    softcap,
)

# the paper's part first: SCA shifts the plain projections (ShiftedLinear), then QK-norm normalises their output
register_method(composite("qk_norm+spectral", "spectral", "qk_norm", label="qk_norm+spectral (SCA on a QK-norm model)",
                          short="QK-norm+SCA"))
register_method(composite("qk_norm+embedded", "qk_norm", "embedded", label="qk_norm+embedded (CET on a QK-norm model)",
                          short="QK-norm+CET"))
register_method(composite("qk_norm+conditioned_init", "conditioned_init", "qk_norm",
                          label="qk_norm+conditioned_init (conditioned init on a QK-norm model)",
                          short="QK-norm+conditioned init"))

__all__ = ["attention_sink", "gated_attention", "logits", "mimetic", "ns_attention", "qk_clip", "qk_norm",
           "sigma_reparam", "softcap"]
