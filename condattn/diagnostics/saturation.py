"""Signs of a saturated softmax that attention entropy alone does not show (the SCA λ = 10 failure: one-hot
self-attention, a class token that only attends to itself, a final feature that no longer depends on the input):

- `FeatureProbe`: the spread across the batch of the final pooled feature (the classifier head's input):
  mean over samples of ‖f_b − f̄‖ divided by the mean of ‖f_b‖. 0 means every sample gives the same feature.
- `embed_grad_norm`: ‖∇‖_F over the parameters of the patch / token embedding (the TokenSite's `embed`), read
  after a backward; 0 in fp32 when no gradient reaches the input through the attention layers.
The self-argmax share and the class token's self-attention are measured by AttentionProbe (attention.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ..conditioning.sites import find_tokens

HEAD_NAMES = ("head", "classifier", "score", "lm_head")


def classifier_module(model: nn.Module) -> nn.Module | None:
    """The module whose input is the final pooled feature: timm's `get_classifier()`, else the first of the
    attributes head / classifier / score / lm_head that is a module (searched in the model, then one level down)."""
    get = getattr(model, "get_classifier", None)
    if callable(get):
        try:
            m = get()
        except Exception:  # noqa: BLE001  (a model whose get_classifier needs arguments)
            m = None
        if isinstance(m, nn.Module) and not isinstance(m, nn.Identity):
            return m
    for owner in (model, *model.children()):
        for name in HEAD_NAMES:
            m = getattr(owner, name, None)
            if isinstance(m, nn.Module) and not isinstance(m, nn.Identity):
                return m
    return None


def feature_spread(f: torch.Tensor) -> float:
    """mean_b ‖f_b − f̄‖ / mean_b ‖f_b‖ for features f (B, ...) flattened per sample; nan for B < 2 or f = 0."""
    f = f.detach().float().reshape(f.shape[0], -1)
    if f.shape[0] < 2:
        return float("nan")
    norm = f.norm(dim=1).mean()
    if not norm > 0:
        return float("nan")
    return float((f - f.mean(0, keepdim=True)).norm(dim=1).mean() / norm)


class FeatureProbe:
    """Context manager: records the input of the model's classifier head on every forward; `results()` gives
    {"feature_spread": ..., "feature_module": name} (None when the model has no recognisable head)."""

    def __init__(self, model: nn.Module):
        self.module = classifier_module(model)
        self.name = next((n for n, m in model.named_modules() if m is self.module), None)
        self.features: list[torch.Tensor] = []
        self._handle = None

    def __enter__(self) -> FeatureProbe:
        if self.module is not None:
            def grab(module, args):
                if args and torch.is_tensor(args[0]):
                    self.features.append(args[0].detach())

            self._handle = self.module.register_forward_pre_hook(grab)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def results(self) -> dict:
        if not self.features:
            return {"feature_spread": None, "feature_module": self.name}
        # a two-tower model calls its head once on the joined pair: the last call is the model's final feature
        return {"feature_spread": feature_spread(self.features[-1]), "feature_module": self.name}


def embed_grad_norm(model: nn.Module) -> float | None:
    """‖∇‖_F over the parameters of the patch / token embedding module, or None (no embedding site, or no .grad)."""
    site = find_tokens(model)
    if site is None or site.embed is None:
        return None
    grads = [p.grad.detach().double().flatten() for p in site.embed.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(torch.cat(grads).norm())
