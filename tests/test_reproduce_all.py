"""`make reproduce-all`: every table of a scale in one resumable command, its projected cost printed first (measured
seconds per step of finished runs of the same recipe; a recipe nobody has measured is counted, never guessed)."""

import shutil

import pytest
import yaml
from test_reproduce import listops_only, tiny

from condattn.reproduce_all import Projection, main, measured, tables


@pytest.mark.unit
def test_every_table_but_detection_defines_the_small_scale_and_the_order_is_the_tables():
    names = [f.name.split("_")[0] for f in tables("small")]
    assert names == ["table1", "table3", "table4", "table5", "table6", "table8", "table9"]
    assert len(tables("smoke")) == 9  # detection (tables 2, 7): smoke and paper only, its tables say why


@pytest.mark.unit
def test_a_projection_says_what_is_measured_and_what_is_not():
    p = Projection("t", cells=5, finished=1, now=[3600.0, None], after_picks=[1800.0] * 2, length=[None])
    assert p.line() == ("  t: 5 cells planned, 1 finished; to train: 2 runs (1.0 h, 1 unmeasured) now + 2 runs (1.0 h) "
                        "after the lr picks + at most 1 runs (0.0 h, 1 unmeasured) for the length check")
    assert p.seconds == 7200.0 and p.unmeasured == 2


@pytest.mark.slow
def test_dry_run_projects_from_the_finished_runs_and_the_real_run_finishes_what_is_missing(tmp_path, capsys):
    from condattn.reproduce import main as reproduce

    exp = listops_only(tmp_path)
    (tmp_path / "exps").mkdir()
    shutil.move(exp, tmp_path / "exps" / exp.name)
    args = ["--scale", "smoke", "--experiments", str(tmp_path / "exps"), *tiny(tmp_path)]
    assert reproduce([str(tmp_path / "exps" / exp.name), "--scale", "smoke", *tiny(tmp_path)]) == 0
    runs = tmp_path / "runs" / "smoke"
    step_s = measured([runs])
    assert {k[2] for k in step_s} == {"none", "spectral", "embedded", "*"}
    assert all(step > 0 and fixed >= 0 for step, fixed in step_s.values())

    shutil.rmtree(runs / "table4_lra_listops_embedded_smoke_s0")
    (tmp_path / "results" / "smoke" / "runs" / "table4_lra_listops_embedded_smoke_s0.json.zst").unlink()
    twin = yaml.safe_load((tmp_path / "exps" / exp.name).read_text())  # another table of the same cells
    (tmp_path / "exps" / "table41_twin.yaml").write_text(yaml.safe_dump({**twin, "table": "table41_twin"}))
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "table4_lra: 3 cells planned, 2 finished; to train: 1 runs (0.0 h) now" in out  # embedded: measured as
    assert "unmeasured" not in out and not (runs / "table4_lra_listops_embedded_smoke_s0").exists()  # its kin
    # the twin table's cells of finished runs are linked, not trained: the projection counts them as finished
    assert "table41_twin: 3 cells planned, 2 finished (2 as another table's twin runs); to train: 1 runs" in out
    (tmp_path / "exps" / "table41_twin.yaml").unlink()

    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("finished earlier, skipped") == 2 and "every table written" in out
    assert (runs / "table4_lra_listops_embedded_smoke_s0" / "summary.json").exists()
