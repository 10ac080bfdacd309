"""The findings are generated from the committed tables (reporting/findings.py): the README's block and
results/<scale>/findings.md must equal what the committed CSVs give now, and the recomputed tests follow the
correction (a row is 'better' or 'worse' only when its adjusted p < 0.05)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from condattn.reporting import findings

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


def test_a_changed_csv_value_makes_the_readme_disagree(tmp_path):
    """The check can fail: one seed of the committed small ViT baseline moved by 5 points changes the block."""
    src = REPO / "results" / "small" / "table9_readings.csv"
    rows = list(csv.DictReader(src.open(newline="")))
    base = next(r for r in rows if r["row"] == "vit_baseline")
    vals = base["values"].split()
    vals[0] = f"{float(vals[0]) - 5:.4f}"
    base["values"] = " ".join(vals)
    (tmp_path / "small").mkdir()
    with (tmp_path / "small" / "table9_readings.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
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
    import shutil

    (tmp_path / "small").mkdir()
    src = REPO / "results" / "small" / "table9_readings.csv"
    shutil.copy(src, tmp_path / "small" / "table9_readings.csv")
    shutil.copy(src, tmp_path / "small" / "table9_readings.rows-vit_.csv")
    assert {f.table for f in findings.collect("small", tmp_path)} == {"table9_readings"}


def test_a_table_says_when_cet_ran_with_its_causal_leak_accepted():
    from condattn.reporting.notes import patch_notes

    note = "causal_leak=accept: CET on a causal decoder, the SVD over the sequence lets a token see later ones"
    sums = [{"patch": {"notes": [note, "λ = 10"]}}, {"patch": {"notes": [note]}}, {"patch": {}}]
    assert patch_notes(sums) == ["", f"Patch: {note}"] and patch_notes([{}]) == []


def test_a_verdict_that_changes_at_twice_the_steps_is_a_limit(tmp_path):
    """The length check's verdict beside the one at 1× steps: where they differ, the finding says so."""
    src = REPO / "results" / "small" / "table9_readings.csv"
    rows = list(csv.DictReader(src.open(newline="")))
    for r in rows:
        r["verdict_2x"], r["diff_2x"] = "", ""
    cet = next(r for r in rows if r["row"] == "vit_cet")
    cet["verdict_2x"], cet["diff_2x"] = "no difference detected (MDE 0.9)", "-0.1000"
    (tmp_path / "small").mkdir()
    with (tmp_path / "small" / "table9_readings.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    found = {f.row: f for f in findings.collect("small", tmp_path) if f.family == "vit"}
    assert found["vit_cet"].verdict == "worse"
    assert "at 2× steps: no difference detected (MDE 0.9) (Δ -0.10)" in found["vit_cet"].limits
    assert not any(x.startswith("at 2× steps") for x in found["vit_mimetic"].limits)


def test_descriptive_tables_say_what_they_show_and_test_nothing(tmp_path):
    """Table 6 (κ per quantity) and table 8 (the λ sweep) give lines read off their CSVs, never a verdict row; κ
    checks of a method whose runs end at chance are left out of the count, and say so."""
    (tmp_path / "small").mkdir()
    six = tmp_path / "small" / "table6_condition_numbers.csv"
    fields = ["table", "scale", "row", "method", "quantity", "description", "stage", "mean", "values", "chance"]
    rows = [  # vit: CET lowers κ(X) (as claimed); SCA ends at chance. xcit: SCA learned and raises κ(J) (not claimed)
        ("vit", "none", "kappa_x/b0", "80", ""), ("vit", "embedded", "kappa_x/b0", "2", ""),
        ("vit", "none", "kappa_jacobian/l0", "10", ""), ("vit", "spectral", "kappa_jacobian/l0", "1000", ""),
        ("vit", "none", "final_val_acc", "96.3", "10"), ("vit", "spectral", "final_val_acc", "10", "10"),
        ("xcit", "none", "kappa_jacobian/l0", "10", ""), ("xcit", "spectral", "kappa_jacobian/l0", "50", ""),
        ("xcit", "none", "final_val_acc", "97", "10"), ("xcit", "spectral", "final_val_acc", "90", "10"),
    ]
    with six.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows({"table": six.stem, "scale": "small", "row": g, "method": m, "quantity": q, "stage": "final",
                     "description": f"{q} × 100" if q == "final_val_acc" else q, "mean": v, "values": v,
                     "chance": ch} for g, m, q, v, ch in rows)
    eight = tmp_path / "small" / "table8_sca_lambda.csv"
    eight.write_text("table,scale,row,lam,n,top1_mean,top1_std,step0_entropy/mean\n"
                     "table8_sca_lambda,small,lam0,0.0,3,96.0,1.0,2.83\n"
                     "table8_sca_lambda,small,lam1,1.0,1,96.5,,1.45\n"
                     "table8_sca_lambda,small,lam10,10.0,3,70.0,3.0,0.13\n"
                     "table8_sca_lambda,small,lam20,20.0,0,,,\n")
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
    with six.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows({"table": six.stem, "scale": "small", "row": g, "method": m, "quantity": q, "stage": "final",
                     "description": q, "mean": "", "values": "", "chance": ""} for g, m, q, _, _ in rows)
    assert "table6_condition_numbers" not in findings.collect_descriptive("small", tmp_path)


def test_a_table_under_the_protocol_without_tests_is_not_called_old_protocol():
    """Table 3 prints no test (one pretraining unit) but picks its lr on selection seeds: no 'old protocol' limit."""
    found = findings.table_findings(REPO / "results" / "small" / "table3_glue.csv", "small")
    assert found and all(f.verdict == "not tested" for f in found)
    assert not any("old protocol" in x for f in found for x in f.limits)
    assert all(any("one pretraining run per method" in x for x in f.limits) for f in found)
