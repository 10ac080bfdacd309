"""How numbers are printed: a table cell's mean ± std, an interval, a p-value, a quantity with three significant
digits, a verdict. Formatting only: every number comes from a TableResult (condattn/table/result.py)."""

from __future__ import annotations

from ..table.result import Outcome


def fmt_cell(mean: float | None, std: float | None, n: int, digits: int = 2, missing: tuple[int, ...] = ()) -> str:
    """"31.00 ± 1.41 (n=2)"; a single seed has no spread to show, so "19.00, n = 1 (no spread)"; "missing" without
    values."""
    if not n or mean is None:
        return "missing"
    text = f"{mean:.{digits}f}, n = 1 (no spread)" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f} (n={n})"
    return text + (f", missing seeds {list(missing)}" if missing else "")


def fmt_values(v, digits: int = 2) -> str:
    """A `Values` (table/result.py) as a cell."""
    return "missing" if v is None else fmt_cell(v.mean, v.std, v.n, digits, v.missing)


def fmt_ci(diff: float | None, low: float | None, high: float | None, digits: int = 2) -> str:
    if diff is None or low is None or high is None:
        return "–"
    return f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def fmt_p(p: float | None) -> str:
    """A p-value with enough digits to read it against 0.05 and its corrections: 0.027, 0.0079, 3.1e-06."""
    if p is None:
        return "–"
    if p >= 0.01:
        return f"{p:.3f}"
    return f"{p:.4f}" if p >= 0.001 else f"{p:.1e}"


def fmt_num(x: float | None) -> str:
    """A quantity with three significant digits (never "0.01" for 0.0147)."""
    return "–" if x is None else f"{x:.3g}"


def verdict_text(outcome: Outcome | str, mde: float | None) -> str:
    """"better", "worse", "no difference detected (MDE x)" or "–" (not tested)."""
    outcome = Outcome(outcome)
    if outcome == Outcome.UNTESTED:
        return "–"
    if outcome == Outcome.NONE:
        return outcome.value + (f" (MDE {fmt_num(mde)})" if mde is not None else "")
    return outcome.value


def test_word(t) -> str:
    """A `Test`'s verdict as printed ("–" without one)."""
    return "–" if t is None else verdict_text(t.outcome, t.mde_printed)


MDE_FORMULA = ("MDE = (t_{1−α/2,df} + t_{0.8,df}) · s_baseline · √(2/n), df = 2n − 2 (two-sided, 80% power), "
               "at α = 0.05 and at the family's corrected α = 0.05/m")
