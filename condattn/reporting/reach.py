"""The experiment file's paper numbers and a family's cells turned into evidence.py's typed inputs, and its lines for
the renderers (tables 1, 3, 4, 5 through protocol_lines; table 9 through readings) and the findings: what a family's
MDE rules out beside the papers' claims, and the convergence line judged against the effect the table tests."""

from __future__ import annotations

from ..experiment import Experiment
from .evidence import (
    Arm,
    Claim,
    PrimaryTest,
    Reach,
    Scale,
    converged,
    convergence_text,
    delta_trend,
    paired_gain,
    project_holm,
    reach,
    reach_text,
    room_text,
    speaks_to,
)

# which paper's claim a method answers, and the keys of its number and its baseline in an experiment's `paper:`
CLAIMS = {"spectral": ("SCA", "sca", "sca_baseline"), "embedded": ("CET", "cet", "cet_baseline"),
          "conditioned_init": ("conditioned init", "ci_conditioned", "ci_baseline"),
          "mimetic_init": ("mimetic init (as the conditioned-init paper ran it)", "ci_mimetic", "ci_baseline")}
EFFECT_CLAIMS = ("spectral", "embedded", "conditioned_init")  # the papers' claimed effects (mimetic is their control)


def scale_of(exp: Experiment, row: str) -> Scale:
    """An accuracy in % (multiplier 100: error = 100 − value), else a loss above 0 (no irreducible loss is known)."""
    higher = exp.higher_is_better_for(row)
    return Scale(higher, 100.0) if exp.multiplier == 100 and higher else Scale(higher)


def claim_for(exp: Experiment, row: str, method: str) -> Claim | None:
    """The paper's claim for a primary row × method with both numbers in the experiment's `paper:` (its row, or the
    row's `paper_row`), else None."""
    if method not in EFFECT_CLAIMS or exp.hypothesis(row) != "primary":
        return None
    who, key, base_key = CLAIMS[method]
    paper = exp.paper.get(exp.paper_row(row)) or {}
    if not isinstance(paper, dict) or paper.get(key) is None or paper.get(base_key) is None:
        return None
    return Claim(who, float(paper[base_key]), float(paper[key]), scale_of(exp, row))


def family_reach(exp: Experiment, family: str, base_row: str, base: list[float],
                 arms: list[tuple[str, str, str, list[float]]], mde: float | None) -> Reach | None:
    """`arms`: (label, row, method, values) of the family's other rows; None without an MDE or baseline values."""
    if mde is None or len(base) < 2:
        return None
    return reach(family, base, mde, [Arm(lab, vals, claim_for(exp, row, m)) for lab, row, m, vals in arms],
                 scale_of(exp, base_row))


def _by_seed(cell) -> dict[int, float]:
    return dict(zip([sd for sd in cell.seeds if sd not in cell.missing], cell.values))


def convergence_line(r: Reach | None, family: str, base_cell, long_base, arms: list[tuple[str, object, object]],
                     higher: bool, unit: str = "points", digits: int = 2, facts: dict | None = None) -> str:
    """The convergence line of a family: the baseline's 2× gain with its interval against the smallest claimed effect
    here; `arms`: (label, cell at 1×, cell at 2× or None). Without runs at 2×: not tested yet. `facts` (a dict) gets
    `converged_2x`: the test's outcome (None: not judged)."""
    facts = {} if facts is None else facts
    facts["converged_2x"] = None
    if base_cell is None or long_base is None:
        return (f"Convergence ({family}): not tested yet: the baseline has no run at 2× its steps (the length check "
                "runs once the baseline and the primary rows have finished).")
    one, two = _by_seed(base_cell), _by_seed(long_base)
    gain = paired_gain(one, two, higher)
    effect = r.smallest if r is not None else None
    facts["converged_2x"] = converged(gain, effect)
    why = ""
    if r is not None and effect is not None:
        a = min(r.rows, key=lambda t: t[1])[0]
        room = "error" if r.scale.higher_is_better else "loss"
        why = (f"the smallest claimed relative fall in {room}, {a.label}'s {100 * a.claim.relative:.2g} %, at this "  # type: ignore[union-attr]
               f"baseline's {room_text(r.scale, r.baseline, digits)}")
    trends = [t for lab, c1, c2 in arms if c2 is not None and getattr(c2, "values", None)
              and (t := delta_trend(lab, one, two, _by_seed(c1), _by_seed(c2))) is not None]
    return convergence_text(family, gain, len(set(one) & set(two)), effect, why, trends, unit, digits)


def family_lines(exp: Experiment, family: str, base_row: str, base_cell, long_base,
                 arms: list[tuple[str, str, str, object, object]], mde: float | None, length_check: bool,
                 unit: str = "points", digits: int = 2, facts: dict | None = None) -> list[str]:
    """The reach line and (with a length check) the convergence line of one family. `arms`: (label, row, method, cell
    at 1×, cell at 2× or None) of its other rows; `mde`: the family's MDE at its corrected α."""
    r = family_reach(exp, family, base_row, base_cell.values,
                     [(lab, row, m, c.values) for lab, row, m, c, _ in arms], mde)
    out = [reach_text(r, digits) if r is not None else
           f"Reach ({family}): no test (fewer than 2 seeds or no MDE): this family rules out no effect size."]
    if length_check:
        out.append(convergence_line(r, family, base_cell, long_base, [(lab, c, lc) for lab, _, _, c, lc in arms],
                                    exp.higher_is_better_for(base_row), unit, digits, facts))
    return out


def table_evidence(exp: Experiment, scale: str, row: str, methods: list[str], cells: dict, tests: dict,
                   long: dict | None, labels: dict[str, str], digits: int, facts: dict | None = None) -> list[str]:
    """protocol_lines' hook (tables 1, 3, 4, 5): one family per row, the baseline its first method (`facts`:
    convergence_line's)."""
    if exp.pretrain:
        return [f"Reach ({row}): not tested (one pretraining run per method): this table rules out no effect size "
                "and its rows print no interval."]
    long = long or {}
    mde = next((t.mde_corrected for t in tests.values() if t is not None and t.mde_corrected), None)
    arms = [(labels.get(m, m), row, m, cells[(row, m)], long.get((row, m))) for m in methods[1:]]
    unit = "points" if exp.multiplier == 100 else ""
    return family_lines(exp, row, row, cells[(row, methods[0])], long.get((row, methods[0])), arms, mde,
                        bool(exp.at(scale).length_check), unit, digits, facts)


def readings_evidence(exp: Experiment, rows: list[dict], task: str, labels: dict[str, str],
                      facts: dict | None = None) -> list[str]:
    """readings' hook (table 9): one family per task; a row's label is its method's when it is primary (the paper's
    stated method or a rival), else its reading."""
    fam = [x for x in rows if x["task"] == task]
    base = next((x for x in fam if x["is_baseline"]), None)
    if base is None:
        return []
    mde = next((x["test"].mde_corrected for x in fam if x["test"] and x["test"].mde_corrected), None)
    arms = [(labels.get(x["method"], x["method"]) if x["hypothesis"] == "primary" else x["reading"], x["row"],
             x["method"], x["cell"], x["long_cell"]) for x in fam if not x["is_baseline"]]
    return family_lines(exp, task, base["row"], base["cell"], base["long_cell"], arms, mde, True, facts=facts)


def speak_sentence(where: str, r: Reach | None, words: dict[str, str], at_budget: bool, untested: bool) -> str:
    """The findings' lead sentence for one task: which papers' claims its verdicts can speak to and which not."""
    if untested:
        return f"**{where}**: not tested (one pretraining run per method): it speaks to no claim."
    room = "error" if r is None or r.scale.higher_is_better else "loss"
    if r is None or not r.rows:
        return (f"**{where}**: no paper's number for its rows; its MDE "
                + (f"{r.mde:.3g} is a {100 * r.relative_mde:.2g} % relative fall in {room}." if r is not None
                   else "is not defined."))
    can, cannot = speaks_to(r, words)
    budget = " at a budget (the baseline is still learning at 2× its steps)" if at_budget else ""
    need = ", ".join(f"{a.label} {'–' if n is None else f'{n:,}'}" for a, _, n in r.rows)
    nots = f"cannot speak to {', '.join(cannot)}" if cannot else "no claim of its rows is out of its reach"
    return (f"**{where}**: can speak to {', '.join(can) or 'no claim'}{budget}; {nots}. "
            f"Its MDE {r.mde:.3g} is a {100 * r.relative_mde:.2g} % relative "
            f"fall in {room} against the claims' "
            f"{', '.join(f'{100 * a.claim.relative:.2g} %' for a, _, _ in r.rows)}; seeds per arm a paper-sized "  # type: ignore[union-attr]
            f"effect would need: {need}.")


def holm_lines(tests: list[PrimaryTest]) -> list[str]:
    """The findings' sensitivity lines: Holm over every primary test of the scale, and the verdicts it changes."""
    if not tests:
        return []
    done = project_holm(tests)
    flips = [f"{t.name} ({t.word.split(' (')[0]} in its table's family; project-wide Holm p {adj:.3g})"
             for t, adj, flip in done if flip]
    return [f"Holm over all {len(tests)} primary tests of this scale (the same comparison counted once where two "
            "tables share its runs), beside the per-table families the verdicts use: "
            + ("every verdict holds under both families." if not flips else
               f"{len(flips)} verdicts depend on the family chosen: {'; '.join(flips)}."),
            "Project-wide adjusted p per test: " + "; ".join(f"{t.name} {'–' if adj is None else f'{adj:.3g}'}"
                                                            for t, adj, _ in done) + "."]
