"""A cell's step-0 diagnostics (each run's summary.json["diagnostics"]["step0"], measured at initialisation on the fixed
diagnostics batch and after the first backward) as means over its runs, each with the number of runs that recorded it:
a mean over fewer runs than the cell has is said so (table 9's step-0 columns)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..stats import mean_std


def _ratio(a, b):
    return None if a is None or not b else a / b


# the quantities, each a function of a run's step-0 dict (None: not recorded)
QUANTITIES: dict[str, Callable[[Mapping], float | None]] = {
    "entropy_share": lambda d: _ratio(d.get("entropy/mean"), d.get("entropy_uniform/mean")),  # of uniform attention
    "maxprob": lambda d: d.get("maxprob/mean"),
    "self_argmax": lambda d: d.get("self_argmax/mean"),
    "gradnorm_wq": lambda d: d.get("gradnorm_wq/mean"),
    "cls_self": lambda d: d.get("cls_self/mean"),
    "feature_spread": lambda d: d.get("feature_spread"),
    "gradnorm_embed": lambda d: d.get("gradnorm_embed"),
    "gradnorm_wk": lambda d: d.get("gradnorm_wk/mean"),
    "entropy_l0_share": lambda d: _ratio(d.get("entropy/l0"), d.get("entropy_uniform/l0")),
}


@dataclass(frozen=True)
class Step0:
    """One step-0 quantity of a cell: its mean over the runs that recorded a finite value (`n` of the cell's `of`
    finished runs; None when none did)."""

    key: str
    mean: float | None
    n: int
    of: int


def step0(summaries: Sequence[Mapping]) -> tuple[Step0, ...]:
    """Every quantity of QUANTITIES over these runs' step-0 diagnostics."""
    d0 = [(s.get("diagnostics") or {}).get("step0") or {} for s in summaries]
    out = []
    for key, fn in QUANTITIES.items():
        vals = [float(v) for d in d0 if (v := fn(d)) is not None and not math.isnan(float(v))]
        out.append(Step0(key, mean_std(vals)[0] if vals else None, len(vals), len(summaries)))
    return tuple(out)
