"""`reproduce`: every cell of a table, skipped when finished, rendered beside the papers' numbers."""

import csv
import subprocess
from pathlib import Path

import pytest

from condattn.reporting import load_experiment, render
from condattn.reporting.tables import Cell
from condattn.reproduce import main

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "experiments" / "table4_lra.yaml"


def tiny(tmp: Path) -> list[str]:
    return [
        "logger=none", f"paths.runs={tmp / 'runs'}", f"paths.cache={tmp / 'cache'}", f"paths.results={tmp / 'results'}",
        "data.generate.train=128", "data.generate.val=32", "data.generate.test=32", "data.generate.max_length=120",
        "data.max_length=128", "data.seq_len=128", "task.steps=4", "task.eval_every=2", "task.log_every=1",
        "impl.checkpoint_every=2", "diagnostics.batch_size=2",
    ]


@pytest.mark.slow
def test_reproduce_table4_smoke_end_to_end_and_idempotent(tmp_path, capsys):
    assert main([str(EXP), "--scale", "smoke", "--seeds", "0", *tiny(tmp_path)]) == 0
    out = capsys.readouterr().out
    md = (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()
    assert "| listops | 37.1 | 37.9 | 37.1 | 37.8 |" in md  # the papers' numbers, labelled as such
    assert "paper CET: baseline" in md and "ours: SCA" in md and "(n=1)" in md and "missing" not in md
    assert "offline stand-in data" in md and "seeds [0]" in md
    assert (tmp_path / "results" / "smoke" / "table4_lra.png").stat().st_size > 0
    rows = list(csv.DictReader(open(tmp_path / "results" / "smoke" / "table4_lra.csv")))
    assert {r["method"] for r in rows} == {"none", "spectral", "embedded"} and all(r["n"] == "1" for r in rows)
    assert md in out

    # second run: every cell is skipped, the table is the same
    assert main([str(EXP), "--scale", "smoke", "--seeds", "0", *tiny(tmp_path)]) == 0
    out2 = capsys.readouterr().out
    assert out2.count("finished earlier, skipped") == 3
    md2 = (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()
    strip = lambda t: [ln for ln in t.splitlines() if not ln.startswith("Ours:")]  # noqa: E731
    assert strip(md2) == strip(md)

    # a lost summary makes that cell missing (and a rerun would redo only that cell)
    (tmp_path / "runs" / "smoke" / "table4_lra_listops_spectral_smoke_s0" / "summary.json").unlink()
    assert main([str(EXP), "--scale", "smoke", "--seeds", "0", "--report-only", *tiny(tmp_path)]) == 0
    assert "| missing |" in (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()


def test_reproduce_refuses_bad_input(tmp_path):
    with pytest.raises(SystemExit):
        main([str(EXP), "--scale", "huge"])
    with pytest.raises(SystemExit):
        main([str(EXP), "--launcher", "moon"])
    with pytest.raises(FileNotFoundError, match="known experiments: table4_lra"):
        main([str(REPO / "experiments" / "table99.yaml")])
    with pytest.raises(Exception, match="nope"):  # a bad override fails before any cell runs
        main([str(EXP), "--seeds", "0", "conditioning.nope=1", *tiny(tmp_path)])
    assert not (tmp_path / "runs").exists()


def test_render_golden():
    exp = load_experiment(EXP)
    cells = {}
    for m, vals in {"none": [30.0, 32.0], "spectral": [19.0], "embedded": []}.items():
        c = Cell("listops", m, [0, 1], values=vals, steps=[120] * len(vals), wall=[10.0] * len(vals))
        c.missing = [1] if len(vals) == 1 else ([0, 1] if not vals else [])
        cells[("listops", m)] = c
    md, rows = render(exp, "smoke", cells)
    line = [ln for ln in md.splitlines() if ln.startswith("| listops")][0]
    assert line == (
        "| listops | 37.1 | 37.9 | 37.1 | 37.8 | 31.00 ± 1.41 (n=2) | 19.00 ± 0.00 (n=1), missing seeds [1] "
        "| missing | 120 | 10 s |"
    )
    assert [r["paper_value"] for r in rows] == ["", 37.8, 37.9]
    assert "no finished runs yet" in md


@pytest.mark.slow
def test_make_target_dry_invocation():
    out = subprocess.run(["make", "-n", "reproduce-table-4", "SCALE=small", "SEEDS=0 1"], cwd=REPO,
                         capture_output=True, text=True)
    cmd = " ".join(out.stdout.replace("\\\n", " ").split())
    assert 'condattn.reproduce experiments/table4_lra.yaml --scale small --launcher local --seeds "0 1"' in cmd
