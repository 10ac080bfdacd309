"""A family's verdicts: each arm's test against the baseline (Welch's interval and p, an exact permutation p), the
p adjusted for the family (Holm over the primary arms, a Benjamini–Hochberg q over the exploratory ones), the MDE at
α = 0.05 and at the family's corrected α, and the verdict as an enum decided from the adjusted p alone."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .core import ALPHA, DiffCI, benjamini_hochberg, diff_ci, holm, mde, permutation_p, pooled_sd, welch_p


class Outcome(str, Enum):
    BETTER = "better"
    WORSE = "worse"
    NONE = "no difference detected"
    UNTESTED = "not tested"


@dataclass(frozen=True)
class Verdict:
    """One arm's test against its baseline. `mde` at α = 0.05, `mde_corrected` at `alpha_corrected` (0.05/m, m the
    arm's family size: the step Holm's first test uses)."""

    ci: DiffCI | None
    p: float | None
    p_adj: float | None
    p_perm: float | None
    correction: str  # "holm" | "bh"
    mde: float | None
    mde_corrected: float | None
    higher_is_better: bool = True
    alpha_corrected: float = ALPHA

    @property
    def outcome(self) -> Outcome:
        """"better" / "worse" only when the adjusted p < 0.05, else "no difference detected"; "not tested" without an
        interval or an adjusted p."""
        if self.ci is None or self.p_adj is None:
            return Outcome.UNTESTED
        if self.p_adj < ALPHA:
            return Outcome.BETTER if (self.ci.diff > 0) == self.higher_is_better else Outcome.WORSE
        return Outcome.NONE

    @property
    def mde_printed(self) -> float | None:
        """The MDE the verdict names: at the corrected α, else at 0.05."""
        return self.mde_corrected if self.mde_corrected is not None else self.mde


def verdicts(base: Sequence[float], arms: Sequence[tuple[object, Sequence[float], str]], higher_is_better: bool = True,
             pooled: bool = False) -> dict:
    """Each arm's test against the baseline values of its family: `arms` are (key, values, hypothesis). The primary
    arms form one family, Holm-corrected; the exploratory arms get Benjamini–Hochberg q. A declared arm without a test
    counts as p = 1, so the others are never corrected for fewer comparisons than were declared. The MDE uses the
    baseline's std (with `pooled`: the pooled std of the baseline and the arm, for the length check's 5 seeds a side,
    where the baseline's spread alone is poorly measured), n = the smaller arm."""
    base = list(base)
    raw = {k: welch_p(base, v) for k, v, _ in arms}
    base_sd = statistics.stdev(base) if len(base) > 1 else None
    out = {}
    for hyp, correct, name in (("primary", holm, "holm"), ("exploratory", benjamini_hochberg, "bh")):
        fam = [(k, list(v)) for k, v, h in arms if h == hyp]
        adjusted = correct([1.0 if raw[k] is None else raw[k] for k, _ in fam])
        adjusted = [None if raw[k] is None else a for (k, _), a in zip(fam, adjusted)]
        alpha_m = ALPHA / max(len(fam), 1)
        for (k, v), adj in zip(fam, adjusted):
            n = min(len(v), len(base))
            sd = pooled_sd(base, v) if pooled else base_sd
            out[k] = Verdict(diff_ci(base, v), raw[k], adj, permutation_p(base, v), name,
                             mde(sd, n) if sd is not None else None,
                             mde(sd, n, alpha=alpha_m) if sd is not None else None, higher_is_better, alpha_m)
    return out
