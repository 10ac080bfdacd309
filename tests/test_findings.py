"""The findings are generated from the committed tables (reporting/findings.py): the README's block and
results/<scale>/findings.md must equal what the committed tables' JSON gives now, the recomputed tests follow the
correction (a row is 'better' or 'worse' only when its adjusted p < 0.05), and a renderer's wording never changes a
finding (findings reads typed fields, never the printed text)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from condattn.reporting import findings
from condattn.reporting.reach import speak_clause
from condattn.table.result import Speaks, TableResult

REPO = Path(__file__).resolve().parents[1]
SCALES = [d.name for d in sorted((REPO / "results").iterdir()) if (d / "findings.md").exists()]


@pytest.mark.parametrize("scale", SCALES)
def test_readme_block_and_findings_file_agree_with_the_committed_csvs(scale):
    found, described = findings.collect(scale), findings.collect_descriptive(scale)
    readme = (REPO / "README.md").read_text()
    want = findings.readme_block(readme, scale, findings.summary(scale, found, described))
    assert readme == want, f"README's findings block is stale: run `make findings SCALE={scale}` and commit"
    assert (REPO / "results" / scale / "findings.md").read_text() == findings.render(scale, found, described), \
        f"results/{scale}/findings.md is stale: run `make findings SCALE={scale}` and commit"


def _doc(stem: str) -> dict:
    return json.loads((REPO / "results" / "small" / f"{stem}.json").read_text())


def _committed(stem: str) -> list[dict]:
    return _doc(stem)["rows"]


def _write(results: Path, stem: str, doc: dict | list) -> Path:
    """A table's JSON as its renderer writes it (save_outputs'), under `results`/small: a whole document, or the rows
    of a descriptive table (no result)."""
    (results / "small").mkdir(parents=True, exist_ok=True)
    path = results / "small" / f"{stem}.json"
    doc = doc if isinstance(doc, dict) else {"table": stem.split(".")[0], "scale": "small", "rows": doc}
    path.write_text(json.dumps({**doc, "stem": stem}))
    return path


def _arm(doc: dict, row: str) -> dict:
    return next(a for f in doc["result"]["families"] for a in f["arms"] if a["row"] == row)


def test_a_changed_value_makes_the_readme_disagree(tmp_path):
    """The check can fail: the committed small ViT CET's Δ moved by 5 points in the table's result changes the
    block (findings reads the result, never recomputes it)."""
    src = REPO / "results" / "small" / "table9_readings.csv"
    doc = _doc("table9_readings")
    _arm(doc, "vit_cet")["test"]["diff"] -= 5
    _write(tmp_path, "table9_readings", doc)
    changed = findings.summary("small", findings.collect("small", tmp_path))
    assert changed != findings.summary("small", findings.table_findings(src, "small"))


def test_verdicts_follow_the_adjusted_p_and_limits_are_named():
    found = findings.table_findings(REPO / "results" / "small" / "table9_readings.csv", "small")
    assert found, "table 9's committed CSV has per-seed values"
    for f in found:
        assert (f.verdict in ("better", "worse")) == (f.p_adj is not None and f.p_adj < 0.05), f
        assert f.correction == ("holm" if f.hypothesis == "primary" else "bh")
    sca = next(f for f in found if f.family == "vit" and f.row == "vit_sca10")
    assert sca.verdict == "worse" and sca.hypothesis == "primary"
    assert not any("n < 10" in x or "old protocol" in x for x in sca.limits)  # made under the protocol, 10 seeds
    qk = next(f for f in found if f.family == "vit" and f.row == "vit_qk_norm")  # worse at 1×, not at 2× steps
    assert qk.verdict == "worse" and any(x.startswith("at 2× steps: no difference detected") for x in qk.limits)


def test_readme_block_needs_its_markers():
    with pytest.raises(ValueError, match="findings:small:begin"):
        findings.readme_block("# no markers", "small", "x")


def test_write_refused_for_a_readme_without_the_block_writes_nothing(tmp_path):
    """A scale the README has no findings block for (smoke) leaves no findings.md behind: the test above would
    then compare it against a block that is not there."""
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    with pytest.raises(ValueError, match="findings:smoke:begin"):
        findings.write("smoke", results=tmp_path / "results", readme=readme)
    assert not (tmp_path / "results" / "smoke" / "findings.md").exists()
    assert readme.read_text() == "# no markers\n"


def test_partial_tables_are_not_findings(tmp_path):
    """A `--rows` or override table beside the default one (table9_readings.rows-vit_.csv) is left out."""
    doc = _doc("table9_readings")
    _write(tmp_path, "table9_readings", doc)
    _write(tmp_path, "table9_readings.rows-vit_", doc)
    assert {f.table for f in findings.collect("small", tmp_path)} == {"table9_readings"}


def test_a_table_says_when_cet_ran_with_its_causal_leak_accepted():
    from condattn.reporting.notes import patch_notes

    note = "causal_leak=accept: CET on a causal decoder, the SVD over the sequence lets a token see later ones"
    sums = [{"patch": {"notes": [note, "λ = 10"]}}, {"patch": {"notes": [note]}}, {"patch": {}}]
    assert patch_notes(sums) == ["", f"Patch: {note}"] and patch_notes([{}]) == []


def test_a_verdict_that_changes_at_twice_the_steps_is_a_limit(tmp_path):
    """The length check's verdict beside the one at 1× steps: where they differ, the finding says so."""
    doc = _doc("table9_readings")
    for f in doc["result"]["families"]:
        for a in f["arms"]:
            a["test2"] = None
    cet = _arm(doc, "vit_cet")
    cet["test2"] = {**cet["test"], "outcome": "no difference detected", "mde_corrected": 0.9, "diff": -0.1}
    _write(tmp_path, "table9_readings", doc)
    found = {f.row: f for f in findings.collect("small", tmp_path) if f.family == "vit"}
    assert found["vit_cet"].verdict == "worse"
    assert "at 2× steps: no difference detected (MDE 0.9) (Δ -0.10)" in found["vit_cet"].limits
    assert not any(x.startswith("at 2× steps") for x in found["vit_mimetic"].limits)
    # a 2× test whose runs are still to train is no verdict at 2×: no "at 2× steps: –" limit
    cet["test2"] = {**cet["test"], "outcome": "not tested"}
    _write(tmp_path, "table9_readings", doc)
    found = {f.row: f for f in findings.collect("small", tmp_path) if f.family == "vit"}
    assert not any(x.startswith("at 2× steps") for x in found["vit_cet"].limits)


def test_descriptive_tables_say_what_they_show_and_test_nothing(tmp_path):
    """Table 6 (κ per quantity) and table 8 (the λ sweep) give lines read off their CSVs, never a verdict row; κ
    checks of a method whose runs end at chance are left out of the count, and say so."""
    six = "table6_condition_numbers"
    rows = [  # vit: CET lowers κ(X) (as claimed); SCA ends at chance. xcit: SCA learned and raises κ(J) (not claimed)
        ("vit", "none", "kappa_x/b0", "80", ""), ("vit", "embedded", "kappa_x/b0", "2", ""),
        ("vit", "none", "kappa_jacobian/l0", "10", ""), ("vit", "spectral", "kappa_jacobian/l0", "1000", ""),
        ("vit", "none", "final_val_acc", "96.3", "10"), ("vit", "spectral", "final_val_acc", "10", "10"),
        ("xcit", "none", "kappa_jacobian/l0", "10", ""), ("xcit", "spectral", "kappa_jacobian/l0", "50", ""),
        ("xcit", "none", "final_val_acc", "97", "10"), ("xcit", "spectral", "final_val_acc", "90", "10"),
    ]
    _write(tmp_path, six, [{"table": six, "scale": "small", "row": g, "method": m, "quantity": q, "stage": "final",
                            "description": f"{q} × 100" if q == "final_val_acc" else q, "mean": v, "values": v,
                            "chance": ch} for g, m, q, v, ch in rows])
    sweep = [("lam0", 0.0, 3, "96.0", "1.0", "2.83"), ("lam1", 1.0, 1, "96.5", "", "1.45"),
             ("lam10", 10.0, 3, "70.0", "3.0", "0.13"), ("lam20", 20.0, 0, "", "", "")]
    _write(tmp_path, "table8_sca_lambda", [
        {"table": "table8_sca_lambda", "scale": "small", "row": r, "lam": lam, "n": n, "top1_mean": m,
         "top1_std": sd, "step0_entropy/mean": e} for r, lam, n, m, sd, e in sweep])
    assert findings.collect("small", tmp_path) == []
    said = findings.collect_descriptive("small", tmp_path)
    kappa = said["table6_condition_numbers"]
    assert kappa[0].startswith("final means move the way the papers claim in 1 of 2 (row, quantity) checks on runs "
                               "that learned; not in: SCA κ(J)"), kappa[0]
    assert "xcit (10 → 50)" in kappa[0] and "1 checks left out: SCA on vit ends at chance" in kappa[0]
    assert "vit baseline 96.3, SCA 10.0; xcit baseline 97.0, SCA 90.0" in kappa[1]
    assert any("vit 10 → 1e+03 (higher, not lower, runs at chance)" in x for x in kappa)
    sweep = said["table8_sca_lambda"]
    assert "λ = 10: 70.0 ± 3.0 (n=3)" in sweep[0] and "λ = 1: 96.5, n = 1 (no spread)" in sweep[0]
    assert sweep[0].endswith("no finished run yet at λ = 20")
    assert sweep[1].startswith("highest mean at λ = 1 (96.5); λ = 0 gives") and "over a partial sweep" in sweep[1]
    assert "λ = 10: 0.130" in sweep[2]
    block = findings.summary("small", [], said)
    assert "**table6_condition_numbers** (descriptive, no test)" in block and "**table8_sca_lambda**" in block
    # a table 6 CSV without finished runs says nothing (no "0 of 0 checks")
    _write(tmp_path, six, [{"table": six, "scale": "small", "row": g, "method": m, "quantity": q, "stage": "final",
                            "description": q, "mean": "", "values": "", "chance": ""} for g, m, q, _, _ in rows])
    assert "table6_condition_numbers" not in findings.collect_descriptive("small", tmp_path)


def test_a_table_under_the_protocol_without_tests_is_not_called_old_protocol():
    """Table 3 prints no test (one pretraining unit) but picks its lr on selection seeds: no 'old protocol' limit."""
    found = findings.table_findings(REPO / "results" / "small" / "table3_glue.csv", "small")
    assert found and all(f.verdict == "not tested" for f in found)
    assert not any("old protocol" in x for f in found for x in f.limits)
    assert all(any("one pretraining run per method" in x for x in f.limits) for f in found)


STEP0 = {"entropy/mean": 2.0, "entropy_uniform/mean": 2.5, "maxprob/mean": 0.2, "self_argmax/mean": 0.1,
         "gradnorm_wq/mean": 1e-2, "cls_self/mean": 0.3, "feature_spread": 0.5}


def _synthetic_table9(tmp_path: Path, results: Path):
    """Table 9 rendered by its real renderer from synthetic run summaries (3 seeds, three ViT rows) and a synthetic lr
    grid whose SCA pick sits at the bound; returns the findings read from the JSON it wrote."""
    from helpers import experiment_raw, plan_of, typed

    from condattn.reporting.readings import write_table
    from condattn.table.lr_grid import LrPick

    raw = experiment_raw("table9_readings")
    raw["scales"]["small"]["rows"] = ["vit_baseline", "vit_sca10", "vit_cet"]
    exp = typed(raw)
    runs = tmp_path / "runs"
    for row in exp.rows_at("small"):
        (method,) = exp.methods_of(row)
        for seed in (0, 1, 2):
            d = runs / "small" / f"{exp.table}_{row}_{method}_small_s{seed}"
            d.mkdir(parents=True, exist_ok=True)
            acc = (0.4 if row == "vit_sca10" else 0.8) + 0.01 * seed
            summary = {"status": "finished", "run_dir": str(d), "metrics": {exp.row_metric("small", row): acc},
                       "steps": 10, "wall_time_s": 3.0, "diagnostics": {"step0": STEP0}}
            (d / "summary.json").write_text(json.dumps(summary))
    scores = {1.0: {100: 0.50, 101: 0.52}, 2.0: {100: 0.60, 101: 0.61}, 4.0: {100: 0.70, 101: 0.71}}
    pick = LrPick("vit_sca10", "val_acc", 1e-3, {m: 1e-3 * m for m in scores}, [100, 101], (0.125, 4.0), scores, 4.0)
    assert pick.at_bound and not pick.flat()
    md = write_table(plan_of(exp, "small", runs, results, [0, 1, 2], picks={"vit_sca10": pick}))[1]
    return md, findings.collect("small", results)


def test_a_renderers_wording_does_not_change_the_findings(tmp_path, monkeypatch):
    """The lr column printed in other words (and the convergence and plateau lines too) leaves every finding as it
    was: findings reads the JSON's TableResult (its picks, plateau, convergence, ...), not the text."""
    from condattn.reporting import protocol, readings

    md, found = _synthetic_table9(tmp_path / "a", tmp_path / "a" / "results")
    sca = next(f for f in found if f.row == "vit_sca10")
    assert any(x.startswith("lr pick at the bound") for x in sca.limits) and sca.verdict == "worse"
    assert "×4 (4e-03, bound binding)" in md
    monkeypatch.setattr(readings, "lr_text", lambda pick: "picked at the edge we allow")
    monkeypatch.setattr(protocol, "plateau_text", lambda family: "Levels off: early.")
    monkeypatch.setattr(protocol, "convergence_text", lambda family, *a, **k: f"Still moving ({family.name}).")
    md2, found2 = _synthetic_table9(tmp_path / "b", tmp_path / "b" / "results")
    assert "picked at the edge we allow" in md2 and "×4 (4e-03, bound binding)" not in md2
    assert found2 == found
    assert findings.render("small", found2) == findings.render("small", found)


def test_a_missing_table_json_is_refused_in_one_line_naming_the_command(tmp_path):
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "table4_lra.csv").write_text("table,row\n")
    with pytest.raises(ValueError) as e:
        findings.collect("small", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "table4_lra.json is missing" in msg
    assert "python -m condattn.reproduce experiments/table4_lra.yaml --scale small --report-only" in msg


def test_every_small_table_has_its_json_and_findings_verdicts_are_the_tables():
    """Each committed small table has its results/small/<table>.json, and every verdict findings prints is the one
    the table's result holds (`outcome` in its rows; table 3's rows are untested, one pretraining unit), its numbers
    numbers, not strings."""
    csvs = sorted((REPO / "results" / "small").glob("table*.csv"))
    assert csvs and all(p.with_suffix(".json").is_file() for p in csvs), "run the tables with --report-only"
    found = findings.collect("small")
    assert found
    for f in found:
        row = next(r for r in _committed(f.table) if (r.get("row") or r.get("column")) == f.row
                   and r["method"] == f.method)
        if f.verdict == "not tested":
            assert "outcome" not in row or row["outcome"] in ("", "not tested"), (f.table, f.row)
        else:
            assert row["outcome"] == f.outcome and f.verdict.startswith(row["outcome"]), (f.table, f.row)
            assert isinstance(row["p_adjusted"], float) and isinstance(row["values"][0], float)


def test_the_readme_clause_says_which_claims_a_family_speaks_to():
    """The README's "Claims:" clause, on a committed family with its `speaks` replaced by constructed values: every
    claim a verdict speaks to is named; one whose MDE is too wide is named with its ratio; no test, no clause."""
    fam = next(f for f in TableResult.from_json(_doc("table1_imagenet")["result"]).families if f.name == "vit_base")
    labels = [c.label for c in fam.reach.rows]
    assert len(labels) >= 2
    rel = fam.reach.mde / (100 - fam.reach.baseline)
    every = speak_clause(replace(fam, speaks=tuple((label, Speaks.VERDICT) for label in labels)))
    assert every.startswith(f"the MDE is {100 * rel:.2g} % of the baseline's error")
    assert every.endswith(f"speaks to {', '.join(labels)}") and "not to" not in every
    wide = speak_clause(replace(fam, speaks=((labels[0], Speaks.TOO_WIDE),)
                                + tuple((label, Speaks.WITHIN) for label in labels[1:])))
    ratio = rel / fam.reach.rows[0].claim.relative
    assert wide.endswith(f"speaks to {', '.join(labels[1:])}; not to {labels[0]} (MDE {ratio:.1f}× its claim)")
    assert speak_clause(replace(fam, untested=True)) == "" and speak_clause(replace(fam, reach=None)) == ""


def test_findings_print_each_methods_regime_line_from_the_typed_result():
    """The regime line (budget verdict, convergence verdict, speed, the word) is read off the result's RegimeLine;
    findings.md prints it per reading, the README block per primary row."""
    from condattn.stats import Basis, Outcome, Speed, Word
    from condattn.table.result import RegimeLine

    line = RegimeLine("vit_hard_cond_init", "conditioned_init", "conditioned init", "primary", "vit_hard",
                      Outcome.BETTER, 2.33, 1.13, 3.52, 1.7, "", None, None, None, None,
                      Speed(0.81, 0.7, 0.93, 1700, 2100, 10, 10), Word.NO_FAMILY)
    f = findings.Finding("table1_imagenet", "vit_hard", "vit_hard", "conditioned_init", "conditioned init", "primary",
                         "–", [1.0], [1.0], regime=line)
    rows = findings.regime_rows([f])
    assert rows[-2] == ("| conditioned init | primary | vit_hard: better (+2.33 [+1.13, +3.52]) | no converged family "
                        "yet | 0.81× [0.70, 0.93] | **no converged family yet** |")
    assert findings.regime_summary([f]) == ("conditioned init: better at a budget, no converged family yet, speed "
                                           "0.81× [0.70, 0.93] → no converged family yet")
    conv = RegimeLine(*[*line.__dict__.values()][:10], "vit_conv", Outcome.NONE, 0.1, 1.2, Basis.CONVERGENCE,
                      line.speed, Word.SPEEDS)
    f.regime = conv
    assert "| vit_conv: no difference detected (+0.10) | 0.81× [0.70, 0.93] | **only speeds training up** |" in \
        findings.regime_rows([f])[-2]
    assert "only speeds training up" in findings.summary("small", [f])
    assert findings.regime_summary([f]) == ("conditioned init: better at a budget, no difference detected at "
                                           "convergence, speed 0.81× [0.70, 0.93] → only speeds training up")
    moved = RegimeLine(*[*conv.__dict__.values()][:10], "vit_conv", Outcome.BETTER, 1.1, 1.2, Basis.BUDGET,
                       line.speed, Word.NOT_AT_CONVERGENCE)
    f.regime = moved  # better on the converged family, but its Δ still moves there: never called "at convergence"
    assert findings.regime_summary([f]) == ("conditioned init: better at a budget, better on vit_conv (at a budget "
                                           "there), speed 0.81× [0.70, 0.93] → not decided: its verdict there is not "
                                           "at convergence")
