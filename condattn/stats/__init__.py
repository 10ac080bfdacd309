"""The statistics of every table, pure functions on numbers (no file, no text): the tests behind a verdict and their
corrections (core, verdict), and what a verdict can rule out, convergence, lr-pick strength, the noise floor and the
project-wide family (evidence). The table wing (condattn/table/) and `compare` import it; the views never do."""

from .core import (
    ALPHA,
    DiffCI,
    benjamini_hochberg,
    diff_ci,
    finite,
    holm,
    last_quarter_change,
    mde,
    mean_std,
    median_steps,
    permutation_p,
    pooled_sd,
    steps_to_target,
    welch_ci,
    welch_p,
)
from .evidence import (
    Basis,
    Claim,
    ClaimHere,
    Convergence,
    Mark,
    NoiseFloor,
    PickStrength,
    ProjectTest,
    Reach,
    Scale,
    Speaks,
    Speed,
    State,
    Trend,
    Word,
    convergence,
    delta_trend,
    equivalence_power,
    noise_floor,
    paired_gain,
    pick_strength,
    project_holm,
    reach,
    regime_word,
    seeds_needed,
    speaks_to,
    speed_ratio,
    verdict_basis,
)
from .verdict import Outcome, Verdict, verdicts

__all__ = ["ALPHA", "Basis", "Claim", "ClaimHere", "Convergence", "DiffCI", "Mark", "NoiseFloor", "Outcome",
           "PickStrength", "ProjectTest", "Reach", "Scale", "Speaks", "Speed", "State", "Trend", "Verdict", "Word",
           "benjamini_hochberg", "convergence", "delta_trend", "diff_ci", "equivalence_power", "finite", "holm",
           "last_quarter_change", "mde", "mean_std", "median_steps", "noise_floor", "paired_gain", "permutation_p",
           "pick_strength", "pooled_sd", "project_holm", "reach", "regime_word", "seeds_needed", "speaks_to",
           "speed_ratio", "steps_to_target", "verdict_basis", "verdicts", "welch_ci", "welch_p"]
