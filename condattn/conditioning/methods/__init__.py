"""The field's attention-conditioning methods beside the papers' SCA and CET, one module each, all applied through
`apply_conditioning(model, NAME, **options)` (each module registers its MethodSpec, spec.py):

| module        | method          | what it does                                                   | attaches         |
|---------------|-----------------|----------------------------------------------------------------|------------------|
| qk_norm       | `qk_norm`       | per-head norm on q and k, the model's own class and eps (timm)  | norms (new keys) |
| sigma_reparam | `sigma_reparam` | Ŵ = γ/σ(W)·W, one σ per stored weight, power step per forward  | γ, v (keys)      |
| mimetic       | `mimetic_init`  | W_Q W_Kᵀ ≈ αZ + βI per head, W_V W_O ≈ αZ − βI, once at init    | nothing          |
| ns_attention  | `ns_attention`  | Newton–Schulz step on each head's normalised output before W_O | hooks only       |
"""

from . import mimetic, ns_attention, qk_norm, sigma_reparam  # noqa: E402  (each registers its MethodSpec)

__all__ = ["mimetic", "ns_attention", "qk_norm", "sigma_reparam"]
