"""PatchReport: what `apply_conditioning` patched, so a trainer can assert it against the architecture."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PatchEntry:
    module: str  # dotted module path inside the model
    kind: str  # e.g. "spectral:fused_qkv", "embedded:first_block"
    detail: str = ""


@dataclass
class PatchReport:
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    entries: list[PatchEntry] = field(default_factory=list)
    # attention layers found but left unpatched by an option that selects kinds (DETR's conditioning.detr_attention)
    skipped: list[PatchEntry] = field(default_factory=list)
    # what the method did beyond the entries, in words (e.g. mode=init: the shift now lives in the weights)
    notes: list[str] = field(default_factory=list)
    # what the caller should know was not done (partial=True: attention layers no layout matched)
    warnings: list[str] = field(default_factory=list)
    # the method's part with one entry per attention layer (its MethodSpec.per_layer; set by apply_conditioning),
    # which check() counts; sigma_reparam's scope=all_linear adds `sigma_reparam:linear` entries beside them
    per_layer: str | None = None

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(e.kind for e in self.entries))

    def count(self, prefix: str) -> int:
        """Number of entries whose kind starts with `prefix` ("spectral" counts attention layers)."""
        return sum(1 for e in self.entries if e.kind.startswith(prefix))

    def layers(self, prefix: str) -> int:
        """Number of attention layers with an entry whose kind starts with `prefix` (a layer whose heads are sites
        of their own, `layer#h0`, `layer#h1`, ..., counts once)."""
        return len({e.module.partition("#")[0] for e in self.entries if e.kind.startswith(prefix)})

    def check(self, attention_layers: int | None = None) -> None:
        """Raise if the patch does not cover the architecture: one entry per attention layer (patched or skipped)
        for the per-layer methods, exactly one embedded-token entry for CET."""
        problems = []
        per_layer = self.per_layer
        if per_layer and attention_layers is not None:
            # attention layers, not sites: a layer whose heads are sites of their own (`layer#h0`) counts once
            n = len({e.module.partition("#")[0] for e in self.entries
                     if e.kind.startswith(per_layer) and e.kind != f"{per_layer}:linear"})
            skipped = len({e.module.partition("#")[0] for e in self.skipped})  # left alone by an option, or where
            #                                                                     the method does not apply (why)
            if n + skipped != attention_layers:
                found = f"{n} attention layers" + (f" (+ {skipped} skipped)" if skipped else "")
                problems.append(f"{per_layer} patched {found}, the model config expects {attention_layers}")
        if "embedded" in self.method and self.count("embedded") != 1:
            problems.append(f"embedded patched {self.count('embedded')} token inputs, expected exactly 1")
        if problems:
            raise RuntimeError("conditioning patch does not match the model: " + "; ".join(problems) + f"\n{self}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "options": dict(self.options),
            "counts": self.counts,
            "modules": [f"{e.kind} {e.module} {e.detail}".strip() for e in self.entries],
            **({"skipped": [f"{e.kind} {e.module} {e.detail}".strip() for e in self.skipped]} if self.skipped else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"warnings": list(self.warnings)} if self.warnings else {}),
        }

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        lines = [f"PatchReport(method={self.method}{', ' + opts if opts else ''})"]
        lines += [f"  {k}: {v}" for k, v in sorted(self.counts.items())] or ["  (nothing patched)"]
        if self.skipped:
            lines.append(f"  skipped: {len(self.skipped)}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)
