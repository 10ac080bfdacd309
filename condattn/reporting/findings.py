"""The findings, generated from the committed tables, never written by hand.

`make findings SCALE=small` (`python -m condattn.reporting.findings --scale small`) reads every
`results/<scale>/<table>.json` (the table's TableResult as its renderer serialised it, reporting/tables.py
`save_outputs`: numbers as numbers, the tests and decisions as the table made them, never recomputed here) and writes
`results/<scale>/findings.md`: for each row a paper gives a number for (beside that paper's own baseline) and each
rival method, our Δ, interval, adjusted p, verdict, n, and the limits that apply (every mark the table prints: a
baseline below its floor, an lr pick at the bound, binding, on a flat grid or weak, a plateau, too few seeds, a
verdict that changes at 2×, a verdict at a budget, runs from several commits), read from the result's typed fields,
never from the printed text. Each family's noise floor (the baseline against itself on a split of its seeds) is
printed under its table. Tables that describe rather than test (table 6's κ over training, table 8's λ sweep) get a
few lines read off their rows instead, never a verdict. It then rewrites the README's findings block (between the
markers `<!-- findings:<scale>:begin -->` and `<!-- findings:<scale>:end -->`) with that file's summary. A table whose
JSON is missing is refused in one line naming the command that writes it.
tests/test_findings.py fails when the README or the findings file disagree with the committed tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..table.result import Arm, Basis, Family, Outcome, RegimeLine, State, TableResult, project_tests
from .fmt import fmt_ci, fmt_num, fmt_p, test_word
from .protocol import pick_marks
from .reach import holm_lines, noise_text, speak_clause, speak_sentence
from .tables import METHOD_LABELS

REPO = Path(__file__).resolve().parents[2]
PRIMARY_SEEDS = 10


@dataclass
class Finding:
    table: str
    family: str
    row: str
    method: str
    what: str  # the reading in words
    hypothesis: str
    claim: str  # the paper's claim (with its Δ) or "rival method"
    values: list[float]
    base: list[float]
    diff: float | None = None
    ci: str = "–"
    p_adj: float | None = None
    correction: str = ""
    verdict: str = "–"
    limits: list[str] = field(default_factory=list)
    p: float | None = None  # the raw Welch p (the project-wide Holm line)
    speaks: str = ""  # the family's lead sentence: which claims its verdicts can speak to
    noise: str = ""  # the family's noise floor line
    outcome: Outcome = Outcome.UNTESTED
    mde: float | None = None  # the MDE a "no difference detected" verdict names
    speaks_short: str = ""  # the same in a clause, for the README's block ("" without a test or a paper's number)
    regime: RegimeLine | None = None  # the row's regime line, when its family is a budget family (experiment regimes)

    @property
    def n(self) -> str:
        return f"{len(self.values)} vs {len(self.base)}"


def _doc(path: Path) -> dict:
    """A table's result file, `results/<scale>/<table>.json` beside `path` (its csv). A missing file is refused in one
    line naming the command that writes it."""
    result = path.with_suffix(".json")
    if not result.is_file():
        raise ValueError(f"{result} is missing: write it with `python -m condattn.reproduce "
                         f"experiments/{path.stem}.yaml --scale {path.parent.name} --report-only`")
    return json.loads(result.read_text())


def _read(path: Path) -> list[dict]:
    return _doc(path)["rows"]


def _claim(a: Arm) -> str:
    """The paper's number for the row (each paper beside its own baseline), or what the row is without one."""
    c = a.claim
    if c is not None:
        said = f"{c.who}: {c.baseline:g} → {c.value:g}, {c.delta:+.1f} (paper)"
        return f"a reading of {c.who} (not the paper's stated method)" if a.hypothesis == "exploratory" else said
    return "rival method" if a.rival else "–"


def _limits(f: Family, a: Arm) -> list[str]:
    """Every mark the table prints for this row, in words."""
    out = list(pick_marks(a.pick))
    if a.hypothesis == "primary" and min(a.at1.n, f.baseline.at1.n) < PRIMARY_SEEDS:
        out.append(f"n < {PRIMARY_SEEDS}")
    if f.floor is not None and not f.floor.beats:
        out.append(f"baseline below its floor ({f.floor.label} {f.floor.value:.{2 if f.higher_is_better else 3}f})")
    if f.plateau is not None:
        out.append("baseline on an early plateau")
    if a.test2 is not None and a.test is not None and Outcome.UNTESTED not in (a.test2.outcome, a.test.outcome) \
            and a.test2.outcome != a.test.outcome:  # a length run not yet trained is 'no run at 2×' below
        out.append(f"at 2× steps: {test_word(a.test2)}"
                   + (f" (Δ {a.test2.diff:+.2f})" if a.test2.diff is not None else ""))
    if a.basis == Basis.BUDGET and a.test is not None:
        out.append("verdict at a budget (the baseline converged; the row's Δ moved from 1× to 2× by its MDE or "
                   "more, or it has no run at 2×)" if f.state == State.CONVERGED else
                   f"verdict at a budget (baseline {f.state.value if f.state else 'not judged'} at 2× its steps)")
        out.append(f"Δ {a.trend.at1:+.3g} at 1× → {a.trend.at2:+.3g} at 2×" if a.trend is not None else "no run at 2×")
    if len(set(a.commits) - {""}) > 1:
        out.append(f"runs from {len(set(a.commits) - {''})} commits")
    return out


def _is_descriptive(rows: list[dict]) -> bool:
    """Table 6 (diagnostics per quantity) and table 8 (a λ sweep) describe; they test nothing against a baseline."""
    return bool(rows) and ("quantity" in rows[0] or "lam" in rows[0])


def descriptive_findings(csv_path: Path, scale: str) -> list[str]:
    """What a descriptive table shows, in a few lines computed from its CSV (no test: directions and levels)."""
    rows = _read(csv_path)
    if not _is_descriptive(rows):
        return []
    if "quantity" in rows[0]:
        return _condition_number_lines(rows)
    return _lambda_sweep_lines(rows)


def _condition_number_lines(rows: list[dict]) -> list[str]:
    from .curves import LABELS, claim_checks

    final = {(r["row"], r["method"], r["quantity"]): r for r in rows  # numbers in the JSON; "" in an older one
             if r["stage"] == "final" and r["mean"] not in (None, "")}
    groups = list(dict.fromkeys(r["row"] for r in rows))
    base = rows[0]["method"]
    acc = {(g, m): r for (g, m, q), r in final.items() if q not in LABELS}  # the task metric's row per cell
    # a method whose runs end at most 1.5 × chance has not learned: its κ values say nothing about the claims
    untrained = {k for k, r in acc.items()
                 if r.get("chance") not in (None, "") and float(r["mean"]) <= 1.5 * float(r["chance"])}
    details, agree, against, skipped = [], 0, [], []
    for method, key, claim in claim_checks():
        parts = []
        for g in groups:
            b, c = final.get((g, base, key)), final.get((g, method, key))
            if b is None or c is None:
                continue
            bv, cv = float(b["mean"]), float(c["mean"])
            got = "lower" if cv < bv else "higher" if cv > bv else "equal"
            parts.append(f"{g} {bv:.3g} → {cv:.3g} ({got}{'' if got == claim else ', not ' + claim}"
                         + (", runs at chance" if (g, method) in untrained else "") + ")")
            if (g, method) in untrained:
                skipped.append((g, method))
            elif got == claim:
                agree += 1
            else:
                against.append(f"{METHOD_LABELS.get(method, method)} {LABELS[key]}, {g} ({bv:.3g} → {cv:.3g})")
        if parts:
            details.append(f"{METHOD_LABELS.get(method, method)}: {LABELS[key]}, claimed {claim}: {'; '.join(parts)}")
    if not details:
        return []
    head = (f"final means move the way the papers claim in {agree} of {agree + len(against)} (row, quantity) checks "
            "on runs that learned" + (f"; not in: {'; '.join(against)}" if against else ""))
    if skipped:
        cells = ", ".join(f"{METHOD_LABELS.get(m, m)} on {g}" for g, m in dict.fromkeys(skipped))
        head += f"; {len(skipped)} checks left out: {cells} ends at chance"
    lines = [head]
    accs = ["; ".join(f"{g} " + ", ".join(f"{METHOD_LABELS.get(m, m)} {float(r['mean']):.1f}"
                                         for (gg, m), r in acc.items() if gg == g)
                      for g in groups if any(gg == g for gg, _ in acc))]
    if accs[0]:
        lines.append(f"{next(iter(acc.values()))['description']} at the end, beside the κ values: {accs[0]}")
    return lines + details


def _lambda_sweep_lines(rows: list[dict]) -> list[str]:
    def has(v) -> bool:  # a number (0.0 included) rather than a blank: the JSON keeps numbers typed
        return v is not None and v != ""

    pts = sorted(((float(r["lam"]), float(r["top1_mean"]), r.get("top1_std") if has(r.get("top1_std")) else "",
                   int(r.get("n") or 0), r.get("step0_entropy/mean")) for r in rows if has(r.get("top1_mean"))),
                 key=lambda t: t[0])
    missing = sorted(float(r["lam"]) for r in rows if not has(r.get("top1_mean")))
    if not pts:
        return []

    def cell(m: float, sd: str | float, n: int) -> str:
        return f"{m:.1f}, n = 1 (no spread)" if n == 1 or sd == "" else f"{m:.1f} ± {float(sd):.1f} (n={n})"

    best = max(pts, key=lambda t: t[1])
    zero = next((t for t in pts if t[0] == 0), pts[0])
    lines = ["top-1 by λ (mean ± std, n seeds): " + "; ".join(f"λ = {lam:g}: {cell(m, sd, n)}"
                                                             for lam, m, sd, n, _ in pts)
             + (f"; no finished run yet at λ = {', '.join(f'{x:g}' for x in missing)}" if missing else ""),
             f"highest mean at λ = {best[0]:g} ({best[1]:.1f})" + (
                 " = no λI at all" if best[0] == 0 else f"; λ = {zero[0]:g} gives {zero[1]:.1f}")
             + " (means read off, not tested" + (", over a partial sweep" if missing else "") + ")"]
    ent = [(lam, float(e)) for lam, _, _, _, e in pts if has(e)]
    if ent:
        lines.append("step-0 attention entropy (nats, mean over layers): "
                     + "; ".join(f"λ = {lam:g}: {e:.3f}" for lam, e in ent))
    return lines


def table_findings(csv_path: Path, scale: str) -> list[Finding]:
    """The findings of one committed table (empty when it has no result or only describes)."""
    doc = _doc(csv_path)
    if _is_descriptive(doc["rows"]) or not doc.get("result"):
        return []
    result = TableResult.from_json(doc["result"])
    regimes = {(r.row, r.method): r for r in result.regimes}
    out = []
    for f in result.families:
        speaks, short = speak_sentence(f"{result.table}, {f.name}", f), speak_clause(f)
        noise = noise_text(f, 3 if result.multiplier == 1 else 2) if not f.untested else ""
        for a in f.arms:
            t = a.test
            limits = _limits(f, a)
            if f.untested:
                limits.append("one pretraining run per method (n = 1 unit): not tested")
            digits = 3 if result.multiplier == 1 else 2
            out.append(Finding(
                result.table, f.name, a.row, a.method, a.reading, a.hypothesis, _claim(a), list(a.at1.values),
                list(f.baseline.at1.values), t.diff if t else None,
                fmt_ci(t.diff, t.low, t.high, digits) if t and not f.untested else "–",
                None if f.untested or t is None else t.p_adj, t.correction if t else "",
                "not tested" if f.untested or t is None or t.outcome == Outcome.UNTESTED else test_word(t), limits,
                None if f.untested or t is None else t.p, speaks, noise,
                t.outcome if t and not f.untested else Outcome.UNTESTED, t.mde_printed if t else None, short,
                regimes.get((a.row, a.method))))
    return out


def _speed_text(r: RegimeLine) -> str:
    """"0.62× [0.50, 0.75]" (the arm's median steps to the baseline's final validation level over the baseline's)."""
    sp = r.speed
    if sp is None:
        return "–"
    if sp.ratio is None:
        return "its median run never reaches the baseline's final level"

    def x(v: float | None) -> str:
        return "unbounded" if v is None else f"{v:.2f}"

    return f"{sp.ratio:.2f}× [{x(sp.low)}, {x(sp.high)}]"


def _verdict_at(outcome: Outcome | None, diff: float | None, low: float | None = None,
                high: float | None = None) -> str:
    if outcome is None:
        return "no converged family yet"
    if diff is None or outcome == Outcome.UNTESTED:
        return outcome.value
    return f"{outcome.value} ({fmt_ci(diff, low, high, 2) if low is not None else f'{diff:+.2f}'})"


def regime_rows(fs: list[Finding]) -> list[str]:
    """The regime table of one table's findings: per row of a budget family, its verdict there beside its verdict in
    the converged family, its speed and the one word (all read off the result's `RegimeLine`)."""
    lines = [r for f in fs if (r := f.regime) is not None]
    if not lines:
        return []
    out = ["**Regimes**: each method's verdict at a budget (a family still learning at 2× its steps) beside its "
           "verdict at convergence (the converged family paired with it), its speed (median steps to the baseline's "
           "final validation level, as a ratio to the baseline's, 95 % bootstrap interval) and the one word they "
           "decide (helps at convergence / only speeds training up / hurts / neither at this MDE).", "",
           "| reading | hypothesis | at a budget | on the converged family | "
           "speed (steps to the baseline's final level) | regime |", "|---|---|---|---|---|---|"]
    for r in lines:
        conv = _verdict_at(r.convergence, r.convergence_diff)
        if r.convergence is not None:
            basis = r.convergence_basis.value if r.convergence_basis else "–"
            conv = f"{r.convergence_family}: {conv}" + ("" if r.convergence_basis == Basis.CONVERGENCE else
                                                       f" ({basis})")
        out.append(f"| {r.label} | {r.hypothesis} | {r.budget_family}: "
                   f"{_verdict_at(r.budget, r.budget_diff, r.budget_low, r.budget_high)} | {conv} | "
                   f"{_speed_text(r)} | **{r.word.value}** |")
    return out + [""]


def regime_summary(fs: list[Finding]) -> str:
    """The README's clause of one table's regime lines: 'SCA: worse at a budget, …, speed 1.2× [1.1, 1.4] → hurts'."""
    said = []
    for r in (f.regime for f in fs if f.regime is not None and f.hypothesis == "primary"):
        if r.convergence is None:
            conv = "no converged family yet"
        elif r.convergence_basis == Basis.CONVERGENCE:
            conv = f"{r.convergence.value} at convergence"
        else:  # the converged family's verdict for this row is itself at a budget there (its Δ moved from 1× to 2×)
            basis = r.convergence_basis.value if r.convergence_basis else "no length check"
            conv = f"{r.convergence.value} on {r.convergence_family} ({basis} there)"
        said.append(f"{r.label}: {r.budget.value} at a budget, {conv}, speed {_speed_text(r)} → {r.word.value}")
    return "; ".join(said)


def _default_tables(scale: str, results: Path) -> list[Path]:
    # the default tables only: `<table>.rows-…` and `<table>.<overrides>` are partial
    # (a table's csv names it; its json holds what findings reads: `_read` refuses a csv without its json)
    found = {p.with_suffix(".csv") for ext in ("csv", "json") for p in (results / scale).glob(f"table*.{ext}")}
    return [p for p in sorted(found) if "." not in p.stem]


def collect(scale: str, results: Path = REPO / "results") -> list[Finding]:
    return [f for path in _default_tables(scale, results) for f in table_findings(path, scale)]


def collect_descriptive(scale: str, results: Path = REPO / "results") -> dict[str, list[str]]:
    """{table: lines} of the tables that describe (κ over training, the λ sweep) rather than test."""
    out = {p.stem: descriptive_findings(p, scale) for p in _default_tables(scale, results)}
    return {t: lines for t, lines in out.items() if lines}


def render(scale: str, found: list[Finding], described: dict[str, list[str]] | None = None) -> str:
    lines = [f"# Findings at scale {scale}", "",
             f"Generated by `make findings SCALE={scale}` from the committed tables in `results/{scale}/`; never "
             "edited by hand. Each comparison is read from the table's result (its JSON, numbers unrounded), with "
             "the tests the tables print: Welch's p, adjusted by Holm over each family's primary rows (the papers' "
             "methods as stated and the rival methods) or a Benjamini–Hochberg q (q) over its exploratory rows. A "
             "verdict ('better', 'worse') needs an adjusted p < 0.05. Limits name what weakens a row's evidence.", ""]
    lines += _head(found)
    for table in dict.fromkeys(f.table for f in found):
        fs = [f for f in found if f.table == table]
        lines += [f"## {table} ([{table}.md]({table}.md))", "",
                  "| family | reading | hypothesis | claim | Δ vs baseline [95% CI] | adjusted p | verdict | n "
                  "| limits |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for f in fs:
            adj = "–" if f.p_adj is None else fmt_p(f.p_adj) + (" (q)" if f.correction == "bh" else "")
            lines.append(f"| {f.family} | {f.what} | {f.hypothesis} | {f.claim} | {f.ci} | {adj} | {f.verdict} | "
                         f"{f.n} | {'; '.join(f.limits) or '–'} |")
        lines.append("")
        lines += [*[f"- {n}" for n in dict.fromkeys(f.noise for f in fs if f.noise)], ""]
        lines += regime_rows(fs)
    for table, said in (described or {}).items():
        lines += [f"## {table} ([{table}.md]({table}.md)): descriptive, no test", "", *[f"- {x}" for x in said], ""]
    lines += ["## Summary", "", summary(scale, found, described)]
    return "\n".join(lines) + "\n"


def _head(found: list[Finding]) -> list[str]:
    """What the scale can speak to (one sentence per task), then the project-wide Holm family as a sensitivity line."""
    said = list(dict.fromkeys(f.speaks for f in found if f.speaks))
    seen, tests = set(), []
    for f in found:  # table 9's paper rows repeat table 1's ViT runs: one test, counted once
        key = (tuple(f.base), tuple(f.values))
        if f.hypothesis == "primary" and f.verdict != "not tested" and key not in seen:
            seen.add(key)
            tests.append((f"{f.table} {f.family} {f.what}", f.p, f.outcome))
    out = ["## What this scale can speak to", "",
           "A claim is a relative fall in error (100 − accuracy; for a loss, in the loss itself) in the papers' own "
           "numbers; a 'no difference detected' speaks to it only when the family's MDE, as a relative fall at our "
           "baseline, is no larger. 'Worse' verdicts speak against a claim's sign, at this scale and budget.", "",
           *[f"- {x}" for x in said], ""]
    if held := holm_lines(project_tests(tests)):
        out += ["## Sensitivity: one Holm family for the whole scale", "", *[f"- {x}" for x in held], ""]
    return out


def summary(scale: str, found: list[Finding], described: dict[str, list[str]] | None = None) -> str:
    """The README's findings block: per table and family, which rows differ from the baseline (adjusted p < 0.05),
    how many do not, and the limits every row of the family shares; then one line per descriptive table."""
    if not found and not described:
        return f"No table at scale {scale} has per-seed values yet."
    out = []
    for table in dict.fromkeys(f.table for f in found):
        for fam in dict.fromkeys(f.family for f in found if f.table == table):
            fs = [f for f in found if f.table == table and f.family == fam]
            said = []
            for word in ("better", "worse"):
                names = [f"{f.what}{' (exploratory)' if f.hypothesis == 'exploratory' else ''} ({f.ci})"
                         for f in fs if f.verdict != "not tested" and f.outcome == word]
                if names:
                    said.append(f"{word} than the baseline: {'; '.join(names)}")
            untested = [f.what for f in fs if f.verdict == "not tested"]
            if untested:
                said.append(f"not tested: {'; '.join(untested)}")
            level = [f for f in fs if f.verdict != "not tested" and f.outcome == "no difference detected"]
            if level:
                mdes = [fmt_num(f.mde) for f in level if f.mde is not None]
                said.append(f"no difference detected: {len(level)} of {len(fs)} rows"
                            + (f" (MDE {mdes[0]})" if len(set(mdes)) == 1 else ""))
            shared = [lim for lim in fs[0].limits if all(lim in f.limits for f in fs)]
            out.append(f"- **{table}, {fam}** ({len(fs[0].base)} baseline seeds): {'; '.join(said) or 'no test'}."
                       + (f" Claims: {fs[0].speaks_short}." if fs[0].speaks_short else "")
                       + (f" Limits: {'; '.join(shared)}." if shared else ""))
        if regimes := regime_summary([f for f in found if f.table == table]):
            out.append(f"- **{table}, regimes** (primary rows; verdict at a budget, on the converged family, speed, "
                       f"the word): {regimes}.")
    for table, said in (described or {}).items():
        out.append(f"- **{table}** (descriptive, no test): {said[0]}"
                   + (f"; {said[1]}" if len(said) > 1 else "") + (f" (+{len(said) - 2} more in findings.md)"
                                                                   if len(said) > 2 else "") + ".")
    return "\n".join(out)


def readme_block(readme: str, scale: str, text: str) -> str:
    """The README with its findings block for `scale` replaced by `text` (ValueError without the markers)."""
    begin, end = f"<!-- findings:{scale}:begin -->", f"<!-- findings:{scale}:end -->"
    if begin not in readme or end not in readme:
        raise ValueError(f"README.md has no {begin} … {end} block; add the two markers where the findings go")
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{text}\n{end}{tail}"


def write(scale: str, results: Path = REPO / "results", readme: Path = REPO / "README.md") -> Path:
    found, described = collect(scale, results), collect_descriptive(scale, results)
    out = results / scale / "findings.md"
    block = readme_block(readme.read_text(), scale, summary(scale, found, described))  # refused: nothing written
    out.write_text(render(scale, found, described))
    readme.write_text(block)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.reporting.findings", description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="small")
    args = p.parse_args(argv)
    if not (REPO / "results" / args.scale).is_dir():
        p.error(f"no results/{args.scale}/ to read (scales with tables: "
                f"{', '.join(sorted(d.name for d in (REPO / 'results').iterdir() if d.is_dir()))})")
    try:
        out = write(args.scale)
    except ValueError as e:
        print(f"[findings] {e}", file=sys.stderr)
        return 2
    print(f"[findings] wrote {out} and the README's findings block for scale {args.scale}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
