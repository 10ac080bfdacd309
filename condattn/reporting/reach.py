"""The evidence lines of a family, formatted from its `TableResult` family (condattn/table/result.py): what its MDE
rules out beside the papers' claims (reach), its convergence test, its noise floor, and the findings' lead sentence
and project-wide Holm lines. Nothing here computes a statistic or decides."""

from __future__ import annotations

from ..table.result import Family, Outcome, Speaks, State


def _pct(x: float) -> str:
    return f"{100 * x:.2g} %" if abs(x) < 0.1 else f"{100 * x:.0f} %"


def _room_word(scale) -> str:
    return "error" if scale.higher_is_better else ("loss" if scale.floor == 0 else f"loss above {scale.floor:g}")


def room_text(scale, at: float, digits: int = 2) -> str:
    """"3.23 % error" (an accuracy), "loss 4.428" (a loss above 0)."""
    room = scale.top - at if scale.higher_is_better else at - scale.floor
    if scale.higher_is_better:
        return f"{room:.{digits}f} % error"
    return f"loss {room:.{digits + 1}f}" if scale.floor == 0 else f"{_room_word(scale)} {room:.{digits + 1}f}"


def _relative_mde(r) -> float:
    room = r.scale.top - r.baseline if r.scale.higher_is_better else r.baseline - r.scale.floor
    return r.mde / room


def reach_text(f: Family, digits: int = 2) -> str:
    """One line: the MDE's relative effect, each claim's, how many times the claim 'no difference' rules out, the
    paper-sized effect here and the seeds per arm it needs (at the baseline's σ and the family's α, both named)."""
    r = f.reach
    if r is None:
        return f"Reach ({f.name}): no test (fewer than 2 seeds or no MDE): this family rules out no effect size."
    room, rel = _room_word(r.scale), _relative_mde(r)
    head = (f"Reach ({f.name}): the MDE {r.mde:.{digits + 1}g} is a {_pct(rel)} relative fall in {room} at this "
            f"baseline's {room_text(r.scale, r.baseline, digits)}")
    if not r.rows:
        return head + "; no row of this family has a paper's number to set beside it."
    claims = "; ".join(f"{c.label} {_pct(c.claim.relative)} ({c.claim.baseline:g} → {c.claim.conditioned:g}; "
                       f"MDE {rel / c.claim.relative:.1f}× it)" for c in r.rows)
    need = "; ".join(f"{c.label} {c.here:.{digits}g} → {'–' if c.seeds is None else f'{c.seeds:,}'} seeds"
                     for c in r.rows)
    return (f"{head}; the papers claim (relative fall in {room}, their numbers, each beside its own paper's "
            f"baseline): {claims}. 'No difference detected' here rules out only effects of at least the MDE's size. "
            f"A paper-sized effect here, and the seeds per arm it would need (two-sided, power 0.8, at the baseline's "
            f"σ = {r.sd:.{digits + 1}g} and the family's α = {r.alpha:.3g}): {need}.")


def convergence_text(f: Family, unit: str = "points", digits: int = 2) -> str:
    """The family's convergence line: the equivalence test of the baseline's 2× gain against the paper-sized effect,
    with its power; then each row's basis and Δ from 1× to 2×."""
    c = f.convergence
    if c is None:
        return (f"Convergence ({f.name}): not tested yet: the baseline has no run at 2× its steps (or fewer than 2 "
                "seeds finished at both lengths).")
    units = f" {unit}" if unit else ""
    said = (f"Convergence ({f.name}): at 2× its steps the baseline gains {c.gain:+.{digits}f}{units} "
            f"[{c.low:+.{digits}f}, {c.high:+.{digits}f}] ({100 * (1 - 2 * c.alpha):.0f} % paired interval, the same "
            f"{c.n} seeds at 1×)")
    if c.margin is None:
        return said + "; no paper's number sets a margin to judge it against: convergence not judged."
    rel = f"{_pct(f.margin_relative)} " if f.margin_relative is not None else ""
    why = (f"{f.margin_claim}'s claimed {rel}relative fall at this baseline" if f.margin_own else
           f"no row of this family has a paper's number: the table's smallest claim, {f.margin_claim}'s {rel}"
           "relative fall, at this baseline")
    state = {State.CONVERGED: "converged (its upper bound is under the margin)",
             State.LEARNING: "still learning (its lower bound is above 0)",
             State.UNDETERMINED: "not shown converged (the interval holds both 0 and the margin)"}[c.state]
    said += (f"; equivalence test against the paper-sized effect here, {c.margin:.{digits}g}{units} ({why}): {state}. "
             f"Its power at this spread (sd of the paired gains {c.sd:.{digits + 1}g}, n = {c.n}): "
             f"{100 * (c.power or 0):.0f} % that a baseline which stopped gaining passes; "
             f"{'–' if c.seeds_for_power is None else f'{c.seeds_for_power:,}'} paired seeds at 2× give 80 %.")
    parts = [f"{a.label} {a.trend.at1:+.{digits}f} → {a.trend.at2:+.{digits}f} ({a.basis.value})"
             for a in f.arms if a.trend is not None]
    rest = [a.label for a in f.arms if a.trend is None and a.test is not None]
    tail = (f" Δ from 1× to 2× on the same seeds, and each verdict's basis (at convergence only when the baseline "
            f"converged and Δ moved by less than the row's MDE): {'; '.join(parts)}." if parts else "")
    if rest:
        tail += f" Without runs at 2× (verdicts at a budget): {', '.join(rest)}."
    return said + tail


def noise_text(f: Family, digits: int = 2) -> str:
    """The A/A line: the baseline against itself on a split of its reported seeds, through the family's tests."""
    n = f.noise
    if n is None:
        return f"Noise floor ({f.name}): fewer than 4 baseline seeds: no A/A test."
    return (f"Noise floor ({f.name}): the baseline against itself on a split of its reported seeds (no new runs), "
            f"seeds {list(n.seeds_a)} against {list(n.seeds_b)}: Δ {n.diff:+.{digits}f} [{n.low:+.{digits}f}, "
            f"{n.high:+.{digits}f}], Holm p {n.p_adj:.3g} as one more arm beside the family's {n.m - 1} primary "
            f"arm{'' if n.m == 2 else 's'} (Holm over {n.m}, each arm with its own p): {n.outcome.value}; over all "
            f"{n.splits} splits of its seeds into two halves the protocol, so corrected, calls it different from "
            f"itself {n.called_different} time{'' if n.called_different == 1 else 's'} ({100 * n.rate:.1f} %).")


def _can_cannot(f: Family) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(label, note) of the claims a family's verdicts can speak to (the note: its outcome), and of those it cannot
    (the note: why)."""
    r, by_label = f.reach, {a.label: a for a in f.arms}
    can, cannot = [], []
    for label, kind in f.speaks:
        a, c = by_label.get(label), next(x for x in r.rows if x.label == label)
        if kind == Speaks.VERDICT:
            can.append((label, a.test.outcome.value))
        elif kind == Speaks.WITHIN:
            can.append((label, "no difference, MDE within the claim"))
        elif kind == Speaks.TOO_WIDE:
            cannot.append((label, f"MDE {_relative_mde(r) / c.claim.relative:.1f}× its claim"))
        else:
            cannot.append((label, "not tested"))
    return can, cannot


def _notes(said: list[tuple[str, str]]) -> str:
    return ", ".join(f"{label} ({note})" for label, note in said)


def speak_clause(f: Family) -> str:
    """The README's short form of `speak_sentence`: which papers' claims the family's verdicts speak to, and its MDE
    as a relative fall beside the claims' ("" for a family with no test or no paper's number)."""
    r = f.reach
    if f.untested or r is None or not r.rows:
        return ""
    can, cannot = _can_cannot(f)
    room = "error" if r.scale.higher_is_better else "loss"
    claims = sorted(100 * c.claim.relative for c in r.rows)
    span = f"{claims[0]:.2g} %" if f"{claims[0]:.2g}" == f"{claims[-1]:.2g}" else \
        f"{claims[0]:.2g}-{claims[-1]:.2g} %"
    said = (f"the MDE is {100 * _relative_mde(r):.2g} % of the baseline's {room}, the papers' claims {span}: speaks to "
            f"{', '.join(label for label, _ in can) or 'no claim'}")
    return said + (f"; not to {_notes(cannot)}" if cannot else "")


def speak_sentence(where: str, f: Family) -> str:
    """The findings' lead sentence for one family: which papers' claims its verdicts can speak to and which not."""
    if f.untested:
        return f"**{where}**: not tested (one pretraining run per method): it speaks to no claim."
    r = f.reach
    room = "error" if r is None or r.scale.higher_is_better else "loss"
    if r is None or not r.rows:
        return (f"**{where}**: no paper's number for its rows; its MDE "
                + (f"{r.mde:.3g} is a relative fall of {100 * _relative_mde(r):.2g} % in {room}." if r is not None
                   else "is not defined."))
    rel = _relative_mde(r)
    can, cannot = _can_cannot(f)
    budget = "" if f.state in (None, State.CONVERGED) else \
        f" at a budget (the baseline is {f.state.value} at 2× its steps)"
    need = ", ".join(f"{c.label} {'–' if c.seeds is None else f'{c.seeds:,}'}" for c in r.rows)
    nots = f"cannot speak to {_notes(cannot)}" if cannot else "no claim of its rows is out of its reach"
    return (f"**{where}**: can speak to {_notes(can) or 'no claim'}{budget}; {nots}. Its MDE {r.mde:.3g} is a "
            f"relative fall of {100 * rel:.2g} % in {room} against the claims' "
            f"{', '.join(f'{100 * c.claim.relative:.2g} %' for c in r.rows)}; seeds per arm a paper-sized effect "
            f"would need (at the baseline's σ {r.sd:.3g} and α {r.alpha:.3g}): {need}.")


def holm_lines(tests) -> list[str]:
    """The findings' sensitivity lines from `ProjectTest`s (Holm over every primary test of the scale, unrounded p)."""
    if not tests:
        return []
    flips = [f"{t.name} ({Outcome(t.outcome).value} in its table's family; project-wide Holm p {t.p_project:.3g})"
             for t in tests if t.flips]
    return [f"Holm over all {len(tests)} primary tests of this scale (the same comparison counted once where two "
            "tables share its runs; from the unrounded p of each table's result), beside the per-table families the "
            "verdicts use: " + ("every verdict holds under both families." if not flips else
                                f"{len(flips)} verdicts depend on the family chosen: {'; '.join(flips)}."),
            "Project-wide adjusted p per test: " + "; ".join(
                f"{t.name} {'–' if t.p_project is None else f'{t.p_project:.3g}'}" for t in tests) + "."]
