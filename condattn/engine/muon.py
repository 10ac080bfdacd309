"""`optim=muon`: torch.optim.Muon on the 2-D weight matrices of the hidden layers, AdamW on everything else, as one
optimizer (the trainer, its schedule, accelerate and checkpoints see one).

The split follows Muon's reference (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", and
torch's docs): Muon orthogonalises the update of a matrix, so it takes the hidden layers' 2-D weights only; the input
embeddings (nn.Embedding, and parameters named *embed*: patch, position, token embeddings), the output head
(`get_classifier()` / `get_output_embeddings()`, else the last nn.Linear), norms, biases and every parameter that
is not 2-D go to AdamW. Both keep the parameter groups of engine/optim.py (weight decay and lr multipliers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

ADJUST_LR = ("match_rms_adamw", "original")


def muon_available() -> str:
    """'' when torch has torch.optim.Muon, else why optim=muon cannot run."""
    if hasattr(torch.optim, "Muon"):
        return ""
    return f"optim=muon needs torch.optim.Muon (torch ≥ 2.9); this torch is {torch.__version__}: use optim=adamw"


def head_module(model: nn.Module) -> nn.Module | None:
    """The output layer: the model's own answer (timm's get_classifier, transformers' get_output_embeddings) on it or
    on the first submodule that has one, else the last nn.Linear in module order."""
    for m in model.modules():
        for getter in ("get_classifier", "get_output_embeddings"):
            fn = getattr(m, getter, None)
            if callable(fn):
                try:
                    head = fn()
                except (NotImplementedError, AttributeError, TypeError):
                    continue
                if isinstance(head, nn.Module):
                    return head
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def muon_ids(model: nn.Module) -> set[int]:
    """id() of the parameters Muon takes: 2-D, trainable, not an embedding, not the output head."""
    head = head_module(model)
    away = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    away |= {id(p) for p in head.parameters()} if head is not None else set()
    return {id(p) for name, p in model.named_parameters()
            if p.requires_grad and p.ndim == 2 and "embed" not in name.lower() and id(p) not in away}


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon and torch.optim.AdamW behind one Optimizer: `param_groups` are the two's own group dicts (a
    schedule that sets a group's lr reaches the optimizer that steps it); state_dict holds both."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], muon: dict[str, Any],
                 adamw: dict[str, Any]):
        self.muon = torch.optim.Muon(muon_groups, **muon) if muon_groups else None
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw) if adamw_groups else None
        # AdamW's betas as the defaults, and in Muon's groups too (unread there): a schedule that cycles beta1
        # (OneCycleLR) finds them in every group and cycles AdamW's; Muon keeps its momentum
        for g in self.muon.param_groups if self.muon else []:
            g.setdefault("betas", adamw["betas"])
        super().__init__([g for o in self._parts() for g in o.param_groups], defaults={"betas": adamw["betas"]})

    def _parts(self) -> Iterable[torch.optim.Optimizer]:
        return [o for o in (self.muon, self.adamw) if o is not None]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self._parts():
            o.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict() if self.muon else None,
                "adamw": self.adamw.state_dict() if self.adamw else None}

    def load_state_dict(self, state_dict: dict) -> None:
        for key, o in (("muon", self.muon), ("adamw", self.adamw)):
            if o is not None:
                o.load_state_dict(state_dict[key])


def build_muon(groups: list[dict], model: nn.Module, lr: float, o: Any) -> MuonWithAdamW:
    """Split each parameter group of engine/optim.py into its Muon part and its AdamW part (same lr, weight decay)."""
    why = muon_available()
    if why:
        raise ValueError(why)
    if o.muon_adjust_lr not in ADJUST_LR:
        raise ValueError(f"optim.muon_adjust_lr={o.muon_adjust_lr!r}: choose one of {list(ADJUST_LR)}")
    ids = muon_ids(model)
    muon_groups, adamw_groups = [], []
    for g in groups:
        rest = {k: v for k, v in g.items() if k != "params"}
        mine = [p for p in g["params"] if id(p) in ids]
        other = [p for p in g["params"] if id(p) not in ids]
        muon_groups += [{"params": mine, **rest}] if mine else []
        adamw_groups += [{"params": other, **rest}] if other else []
    muon = dict(lr=lr, momentum=float(o.muon_momentum), nesterov=bool(o.muon_nesterov),
                ns_steps=int(o.muon_ns_steps), adjust_lr_fn=str(o.muon_adjust_lr))
    return MuonWithAdamW(muon_groups, adamw_groups, muon, dict(lr=lr, betas=tuple(o.betas), eps=o.eps))
