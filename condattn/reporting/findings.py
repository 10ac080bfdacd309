"""The findings, generated from the committed tables, never written by hand.

`make findings SCALE=small` (`python -m condattn.reporting.findings --scale small`) reads every
`results/<scale>/<table>.json` (the table's rows as its renderer wrote them, reporting/tables.py `save_outputs`) that
carries per-seed values, recomputes each comparison with the tests the tables use (reporting/protocol.py `verdicts`:
Welch, Holm over each family's primary rows, a Benjamini–Hochberg q over its exploratory rows, an exact permutation p)
and writes `results/<scale>/findings.md`: for each claim of each paper (the experiment files' paper numbers) and each
rival method, our Δ, interval, adjusted p, verdict, n, scale, and the limits that apply (a baseline below its floor,
an lr pick at the bound, on a flat grid or made by the old one-seed protocol, a plateau, too few seeds, runs from
several commits). The limits come from the rows' typed fields (`lr_at_bound`, `lr_flat`, `lr_weak_pick`,
`lr_selection_seeds`, `outcome_2x`, `mde_2x`, `plateau`, `converged_2x`, `n_commits`), never from the printed text,
so a renderer's wording cannot change a finding. Tables that describe rather than test (table 6's κ over training,
table 8's λ sweep) get a few lines read off their rows instead (claimed directions, final accuracy, the sweep), never
a verdict. It then rewrites the README's findings block (between the markers `<!-- findings:<scale>:begin -->` and
`<!-- findings:<scale>:end -->`) with that file's summary. A table whose JSON is missing is refused in one line naming
the command that writes it.
tests/test_findings.py fails when the README or the findings file disagree with the committed tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..experiment import Experiment
from ..experiment import load as load_experiment
from .floors import load as load_floors
from .protocol import verdicts
from .reach import CLAIMS, PrimaryTest, family_reach, holm_lines, speak_sentence
from .stats import fmt_num, fmt_p, verdict_text
from .tables import METHOD_LABELS

REPO = Path(__file__).resolve().parents[2]
RIVALS = ("qk_norm", "sigma_reparam", "mimetic_init", "ns_attention", "conditioned_init")
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
    outcome: str = "not tested"  # the test's verdict as a word (Verdict.outcome)
    mde: float | None = None  # the MDE a "no difference detected" verdict names

    @property
    def n(self) -> str:
        return f"{len(self.values)} vs {len(self.base)}"


def _read(path: Path) -> list[dict]:
    """The rows of a table's result, `results/<scale>/<table>.json` beside `path` (its csv): typed fields, never
    the rendered md. A missing file is refused in one line naming the command that writes it."""
    result = path.with_suffix(".json")
    if not result.is_file():
        raise ValueError(f"{result} is missing: write it with `python -m condattn.reproduce "
                         f"experiments/{path.stem}.yaml --scale {path.parent.name} --report-only`")
    return json.loads(result.read_text())["rows"]


def _values(rec: dict) -> list[float]:
    return [float(v) for v in (rec.get("values") or "").split()]


def _paper_claim(exp: Experiment, row: str, method: str) -> str:
    if method not in CLAIMS:
        return "rival method" if method in RIVALS else "–"
    who, key, base_key = CLAIMS[method]
    if exp.hypothesis(row) == "exploratory":
        return f"a reading of {who} (not the paper's stated method)"
    paper = exp.paper.get(exp.paper_row(row)) or {}
    if paper.get(key) is not None and paper.get(base_key) is not None:
        return f"{who}: {paper[key] - paper[base_key]:+.{exp.paper_digits}f} (paper)"
    if method in RIVALS:
        return "rival method"
    return f"{who}: gains claimed (paper)"


def _limits(exp: Experiment, scale: str, fam: str, t, base_rec: dict, rec: dict, floors: dict) -> list[str]:
    out = []
    if "p_adjusted" not in rec and not rec.get("lr_selection_seeds"):
        # the protocol's rows carry adjusted p's, or (untested tables) the grid scores per selection seed
        out.append("old protocol (lr picked by one reported seed, ×0.5–×2)")
    picked = rec.get("lr_multiplier") is not None
    if picked and rec.get("lr_at_bound") and not rec.get("lr_flat"):
        out.append("lr pick at the bound")
    if picked and rec.get("lr_flat"):
        out.append("lr grid flat (the same score at every lr)")
    n_base = len(_values(base_rec))
    if exp.hypothesis(rec["row"]) == "primary" and min(len(_values(rec)), n_base) < PRIMARY_SEEDS:
        out.append(f"n < {PRIMARY_SEEDS}")
    entry = floors.get(fam) or {}
    best = [f for f in entry.get("floors", []) if f.get("value") is not None]
    if best and n_base:
        mean = statistics.fmean(_values(base_rec))
        higher = exp.higher_is_better_for(rec["row"])
        top = (max if higher else min)(best, key=lambda f: f["value"])
        value = exp.multiplier * float(top["value"])
        if (mean <= value) if higher else (mean >= value):
            label = top["label"].removeprefix("floor: ")
            out.append(f"baseline below its floor ({label} {value:.{2 if higher else 3}f})")
    if base_rec.get("plateau"):
        out.append("baseline on an early plateau")
    if (at2 := rec.get("outcome_2x")) and at2 != t.outcome:
        said = verdict_text(at2, rec.get("mde_2x"))
        out.append(f"at 2× steps: {said} (Δ {float(rec['diff_2x']):+.2f})" if rec.get("diff_2x") else
                   f"at 2× steps: {said}")
    if _at_budget(base_rec):
        out.append("baseline not converged (its 2× gain is not under the paper-sized effect): verdict at a budget")
    if picked and rec.get("lr_weak_pick"):
        out.append("weak lr pick (its lead over its neighbour is under one standard error)")
    if (n := int(rec.get("n_commits") or 0)) > 1:
        out.append(f"runs from {n} commits")
    return out


def _at_budget(base_rec: dict) -> bool:
    """The family's convergence test (its baseline's row, `converged_2x`) says NOT converged."""
    return base_rec.get("converged_2x") is False


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

    final = {(r["row"], r["method"], r["quantity"]): r for r in rows if r["stage"] == "final" and r["mean"]}
    groups = list(dict.fromkeys(r["row"] for r in rows))
    base = rows[0]["method"]
    acc = {(g, m): r for (g, m, q), r in final.items() if q not in LABELS}  # the task metric's row per cell
    # a method whose runs end at most 1.5 × chance has not learned: its κ values say nothing about the claims
    untrained = {k for k, r in acc.items() if r.get("chance") and float(r["mean"]) <= 1.5 * float(r["chance"])}
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


def table_findings(csv_path: Path, scale: str, experiments: Path = REPO / "experiments") -> list[Finding]:
    """The findings of one committed table CSV (empty when it has no per-seed values or only describes)."""
    if _is_descriptive(_read(csv_path)):
        return []
    rows = [{**r, "row": r.get("row") or r.get("column")} for r in _read(csv_path) if r.get("values")]
    if not rows:
        return []
    exp = load_experiment(experiments / f"{csv_path.stem}.yaml")
    by_key = {(r["row"], r["method"]): r for r in rows}
    floors = load_floors(csv_path.parents[1], scale, exp.table)
    out = []
    for fam, members in exp.families(scale).items():
        present = [m for m in members if m in by_key]
        if not present or present[0] != members[0]:
            continue
        base_rec = by_key[members[0]]
        base = _values(base_rec)
        arms = [(m, _values(by_key[m]), exp.hypothesis(m[0])) for m in present[1:]]
        tests = verdicts(base, arms, exp.higher_is_better_for(members[0][0]))
        mde = next((t.mde_corrected for t in tests.values() if t.mde_corrected), None)
        label = {m: METHOD_LABELS.get(m[1], m[1]) for m, _, _ in arms}
        r = family_reach(exp, fam, members[0][0], base, [(label[m], m[0], m[1], v) for m, v, _ in arms], mde)
        speaks = speak_sentence(f"{exp.table}, {fam}", r, {label[m]: tests[m].word for m, _, _ in arms},
                                _at_budget(base_rec), bool(exp.pretrain))
        for m, vals, hyp in arms:
            t, rec = tests[m], by_key[m]
            limits = _limits(exp, scale, fam, t, base_rec, rec, floors)
            if exp.pretrain:  # one pretraining run per method: one unit, no test over fine-tuning seeds
                t = replace(t, p=None, p_adj=None)
                limits.append("one pretraining run per method (n = 1 unit): not tested")
            out.append(Finding(
                exp.table, fam, m[0], m[1], rec.get("reading") or METHOD_LABELS.get(m[1], m[1]), hyp,
                _paper_claim(exp, *m), vals, base, t.ci.diff if t.ci else None,
                t.ci.text(3 if exp.multiplier == 1 else 2) if t.ci and not exp.pretrain else "–", t.p_adj,
                t.correction, "not tested" if exp.pretrain else t.word, limits, t.p, speaks,
                t.outcome, t.mde_printed))
    return out


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
             "edited by hand. Each comparison is recomputed from the per-seed values in the table's CSV with the "
             "tests the tables print: Welch's p, adjusted by Holm over each family's primary rows (the papers' "
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
            tests.append(PrimaryTest(f"{f.table} {f.family} {f.what}", f.p, f.verdict))
    out = ["## What this scale can speak to", "",
           "A claim is a relative fall in error (100 − accuracy; for a loss, in the loss itself) in the papers' own "
           "numbers; a 'no difference detected' speaks to it only when the family's MDE, as a relative fall at our "
           "baseline, is no larger. 'Worse' verdicts speak against a claim's sign, at this scale and budget.", "",
           *[f"- {x}" for x in said], ""]
    if held := holm_lines(tests):
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
                       + (f" Limits: {'; '.join(shared)}." if shared else ""))
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
