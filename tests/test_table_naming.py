"""A table is named by what made it: science overrides give it a file of its own and labels that carry them, never
overwriting the default table; a table from fewer runs than the one at its path (a fresh clone) does not replace it
unless forced."""

from __future__ import annotations

import pytest
from test_reproduce import listops_only, tiny

from condattn.reproduce import main
from condattn.table.cells import override_slug


def test_override_slug_names_the_overrides():
    assert override_slug(["conditioning.lam=5"]) == "lam-5"
    assert override_slug(["conditioning.lam=0.5", "+task.steps=50"]) == "lam-0.5+steps-50"


def committed(tmp_path, text: str):
    """Table 4's ListOps row as an experiment file, and a committed table4_lra.md holding `text`."""
    md = tmp_path / "results" / "smoke" / "table4_lra.md"
    md.parent.mkdir(parents=True)
    md.write_text(text)
    return listops_only(tmp_path), md


@pytest.mark.slow  # composes the table's cells
def test_an_override_table_is_written_beside_the_default_one_and_labelled(tmp_path, capsys):
    path, default = committed(tmp_path, "# the committed default table\n")
    assert main([str(path), "--scale", "smoke", "--report-only", "conditioning.lam=5", *tiny(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "conditioning.lam=5 changes spectral: the table is written as table4_lra.lam-5.md" in out
    assert default.read_text() == "# the committed default table\n"
    # exploratory: under results/exploratory/ (ignored by git), nothing new beside the committed tables
    assert [f.name for f in default.parent.iterdir()] == ["table4_lra.md"]
    explore = tmp_path / "results" / "exploratory" / "smoke"
    md = (explore / "table4_lra.lam-5.md").read_text()
    assert "**Made with** `conditioning.lam=5`, which changes SCA" in md and "ours: SCA [conditioning.lam=5]" in md
    assert "ours: baseline |" in md  # λ does not change the baseline
    assert "conditioning.lam=5" in (explore / "table4_lra.lam-5.csv").read_text().splitlines()[1]
    assert "commit them" not in out


@pytest.mark.slow  # composes the table's cells
def test_a_table_with_more_missing_cells_does_not_replace_the_committed_one(tmp_path, capsys):
    path, md = committed(tmp_path, "# a committed table with every cell\n")
    (md.parent / "table4_lra.csv").write_text("table\n")
    other = md.parent / "table4_lra.lam-5.md"  # another table of the same stem's family: never touched
    other.write_text("# λ = 5\n")
    assert main([str(path), "--scale", "smoke", "--report-only", *tiny(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "kept" in err and "more missing runs" in err and "--force" in err
    assert md.read_text() == "# a committed table with every cell\n"
    assert not (md.parent / "table4_lra.png").exists() and (md.parent / "table4_lra.csv").read_text() == "table\n"
    assert other.read_text() == "# λ = 5\n"
    assert main([str(path), "--scale", "smoke", "--report-only", "--force", *tiny(tmp_path)]) == 0
    assert "missing" in md.read_text()
