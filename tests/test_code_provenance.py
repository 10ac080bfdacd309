"""Code provenance per run: each run records a fingerprint of the code that can change its result; a table lists its
runs' commits and names the readings whose runs ran different code; STALE=1 (--refresh-stale) retrains exactly the
cells made by other code, keeping the old run beside them."""

from __future__ import annotations

import json

import pytest
from test_reproduce import listops_only, tiny

from condattn.engine import provenance
from condattn.runs import RunRecord


def test_the_fingerprint_covers_the_result_code_and_names_what_differs(tmp_path, monkeypatch):
    now = provenance.code_fingerprint()
    assert set(now) == {"conditioning", "model", "task", "engine", "diagnostics"}
    assert all(len(v) == 10 for v in now.values())
    assert now == provenance.code_fingerprint()  # deterministic
    assert provenance.stale_parts(now, now) == []
    assert provenance.stale_parts({**now, "model": "0" * 10}, now) == ["model"]
    assert provenance.stale_parts(None, now) == list(provenance.STALE_PARTS)  # a run from before fingerprints
    assert provenance.stale_parts({**now, "diagnostics": "0" * 10}, now) == []  # readings: named, never retrained
    # an edit to a file that only records or reports changes nothing; an edit to the library does
    files = {f.relative_to(provenance.REPO).as_posix() for f in provenance._files(provenance.CODE_PARTS["engine"])}
    assert "condattn/engine/summary.py" not in files and "condattn/engine/loop.py" in files
    fake = tmp_path / "condattn" / "conditioning"
    fake.mkdir(parents=True)
    (fake / "spectral.py").write_text("x = 1\n")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    before = provenance.code_fingerprint()["conditioning"]
    (fake / "spectral.py").write_text("x = 2\n")
    assert provenance.code_fingerprint()["conditioning"] != before


def test_a_run_is_fingerprinted_by_the_code_it_executed_not_by_docstrings_or_other_methods(tmp_path, monkeypatch):
    lib = tmp_path / "condattn" / "conditioning"
    (lib / "methods").mkdir(parents=True)
    (lib / "api.py").write_text('"""Shared."""\nx = 1\n')
    (lib / "spectral.py").write_text("lam = 10\n")
    (lib / "methods" / "sigma_reparam.py").write_text("steps = 1\n")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    before = {m: provenance.code_fingerprint(m)["conditioning"] for m in ("none", "spectral", "sigma_reparam")}
    (lib / "methods" / "sigma_reparam.py").write_text("steps = 2\n")
    after = {m: provenance.code_fingerprint(m)["conditioning"] for m in before}
    assert after["sigma_reparam"] != before["sigma_reparam"]
    assert after["spectral"] == before["spectral"] and after["none"] == before["none"]  # other methods: untouched
    (lib / "api.py").write_text('"""Shared, reworded."""\n# a comment\nx  =  1\n')
    assert provenance.code_fingerprint("spectral")["conditioning"] == before["spectral"]  # docs and layout only
    (lib / "api.py").write_text("x = 2\n")
    assert provenance.code_fingerprint("spectral")["conditioning"] != before["spectral"]  # shared code: every method


@pytest.mark.slow  # git
def test_a_commits_fingerprint_is_read_from_the_history(tmp_path, monkeypatch):
    import subprocess

    lib = tmp_path / "condattn" / "models"
    lib.mkdir(parents=True)
    (lib / "vit.py").write_text("depth = 12\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    assert provenance.files_at("HEAD") == provenance.source_files()
    (lib / "vit.py").write_text("depth = 6\n")
    assert provenance.fingerprint(provenance.files_at("HEAD"), "none") != provenance.code_fingerprint("none")
    assert provenance.files_at("0123456789") is None  # not in the history


def test_the_code_line_names_readings_whose_runs_differ():
    from helpers import experiment_raw, plan_of

    from condattn.reporting.readings import code_line
    from condattn.table.observed import TableCell
    from condattn.table.provenance import provenance

    plan = plan_of(experiment_raw("table9_readings"), "small", "runs", "results")
    base, sca = list(plan.exp.rows)[:2]

    def row(name, reading, codes, commits):
        sums = [{"code": c, "commit": k} for c, k in zip(codes, commits)]
        cell = TableCell(name, "none", list(range(len(sums))), summaries=sums)
        return {"row": name, "method": "none", "task": "vit", "reading": reading, "cell": cell}

    def line(*rows):
        cells = {(r["row"], r["method"]): r["cell"] for r in rows}
        return code_line(provenance(plan, cells, done=[]), list(rows))

    a, b = {"conditioning": "a" * 10, "engine": "e" * 10}, {"conditioning": "b" * 10, "engine": "e" * 10}
    text = line(row(base, "baseline", [a, a], ["c1", "c1"]), row(sca, "SCA", [a, b], ["c1", "c2"]))
    assert "commits c1 (3 runs), c2 (1 runs)" in text and "vit: SCA (conditioning)" in text
    assert "Within every reading" in line(row(base, "baseline", [a, a], ["c1", "c1"]))


def test_fingerprints_shown_to_compute_the_same_are_not_called_different_code(monkeypatch):
    from condattn.engine import provenance as engine_provenance
    from condattn.reporting.readings import code_line
    from condattn.table import provenance as table_provenance

    a, b = {"conditioning": "a" * 10, "engine": "e" * 10}, {"conditioning": "b" * 10, "engine": "e" * 10}
    c = {"conditioning": "c" * 10, "engine": "e" * 10}
    same = engine_provenance.equivalent_hashes([{"from_commit": "c1", "to_commit": "c2", "from_code": a,
                                                 "to_code": b, "equal": True}])
    assert table_provenance._mixed([{"code": a}, {"code": b}], {}) == ("conditioning",)
    assert table_provenance._mixed([{"code": a}, {"code": b}], same) == ()
    assert table_provenance._mixed([{"code": a}, {"code": b}, {"code": c}], same) == ("conditioning",)
    assert table_provenance._mixed([{"code": a}, {}], same) == ("conditioning", "engine", "unrecorded")
    # the view: a reading whose fingerprints differ only by a recorded equivalence is named as such, not as mixed
    cell = table_provenance.CellCode("r", "m", ("conditioning=aaa", "conditioning=bbb"), ())
    prov = type("P", (), {"runs": 2, "code": (cell,), "commits": (("c1", 1), ("c2", 1)), "other_code_runs": 0,
                          "code_checked": 2})()
    text = code_line(prov, [{"row": "r", "method": "m", "task": "vit", "reading": "gate"}])
    assert "ran different code" not in text and "shown to compute the same" in text and "vit: gate." in text
    assert text.endswith("every one of the 2 runs it trained (selection, reported and length runs) is current; "
                         "STALE=1 retrains none.")
    monkeypatch.setattr(engine_provenance, "EQUIVALENCE", engine_provenance.EQUIVALENCE.parent / "absent.json")
    assert engine_provenance.equivalent_hashes() == {}


@pytest.mark.slow  # trains two 4-step cells
def test_refresh_stale_retrains_exactly_the_cells_made_by_other_code(tmp_path, capsys):
    import yaml

    from condattn.reproduce import main

    path = listops_only(tmp_path)
    exp = yaml.safe_load(path.read_text())
    exp["methods"] = ["none", "spectral"]
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    args = [str(path), "--scale", "smoke", *tiny(tmp_path)]
    assert main(args) == 0
    runs = tmp_path / "runs" / "smoke"
    stale = RunRecord(runs / "table4_lra_listops_spectral_smoke_s0")
    summary = stale.summary
    summary["code"] = {**summary["code"], "conditioning": "0" * 10}  # made by other conditioning code
    (stale.dir / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert main([*args, "--refresh-stale"]) == 0
    out = capsys.readouterr().out
    assert "table4_lra_listops_spectral_smoke_s0: made by other code (conditioning differ from this code's)" in out
    assert "table4_lra_listops_none_smoke_s0: finished earlier, skipped" in out
    assert (runs / "table4_lra_listops_spectral_smoke_s0.stale-1" / "summary.json").exists()
    assert RunRecord(runs / "table4_lra_listops_spectral_smoke_s0").summary["code"] == \
        provenance.code_fingerprint("spectral")


def test_one_rule_for_same_code_the_planners_stale_check_and_the_tables_code_line(tmp_path, monkeypatch):
    """A run the table calls current is never 'would be retrained', and one it calls other code always is: both read
    engine/provenance.other_code (the fingerprints and results/code_equivalence.json)."""
    from types import SimpleNamespace

    from helpers import experiment_raw, plan_of
    from omegaconf import OmegaConf

    from condattn.reporting.readings import code_line
    from condattn.reproduce import _kept_other_code, _other_code
    from condattn.table.observed import TableCell

    now = provenance.code_fingerprint("none")
    old = {**now, "conditioning": "0" * 10, "task": "1" * 10}  # an older commit's code
    shown = {**now, "task": "2" * 10}  # other code, shown to compute the same as this code's
    record = tmp_path / "code_equivalence.json"
    record.write_text(json.dumps([{"method": "none", "cell": "c", "from_commit": "c1", "to_commit": "c2",
                                   "from_code": shown, "to_code": now, "equal": True}]))
    monkeypatch.setattr(provenance, "EQUIVALENCE", record)
    codes = {"current": now, "old": old, "shown": shown, "unrecorded": None}
    runs = tmp_path / "runs" / "small"
    sums = {}
    for name, code in codes.items():
        rec = RunRecord(runs / name)
        rec.dir.mkdir(parents=True)
        rec.write_summary({"status": "finished", "run_dir": str(rec.dir), "metrics": {}, "steps": 1, "method": "none",
                           "wall_time_s": 1.0, **({"code": code} if code else {})})
        sums[name] = rec.summary
    files, same = provenance.source_files(), provenance.equivalent_hashes()
    plan = plan_of(experiment_raw("table9_readings"), "small", tmp_path / "runs", tmp_path / "results")
    cells = {(name, "none"): TableCell(name, "none", [0], summaries=[s]) for name, s in sums.items()}
    from condattn.table.provenance import provenance as table_provenance  # (`provenance` here: the engine's module)

    table = table_provenance(plan, cells, done=list(sums.values()))
    called = {cc.row: cc.other_runs == 0 for cc in table.code}
    assert called == {"current": True, "old": False, "shown": True, "unrecorded": False}
    assert (table.other_code_runs, table.code_checked) == (2, 4)
    cfg = OmegaConf.create({"conditioning": {"method": "none"}})
    for name in codes:
        cell = SimpleNamespace(name=name, run_dir=runs / name, cfg=cfg)
        retrained = _other_code(cell, files, same) is not None
        assert retrained == (not called[name]), name  # the planner's STALE check, on the live run
    # a dry run in a fresh clone judges the kept record the same way (nothing restored)
    monkeypatch.setattr("condattn.table.store.Records.of", lambda self, name, cfg, run_dir: RunRecord(run_dir))
    for name in codes:
        cell = SimpleNamespace(name=name, run_dir=runs / name, cfg=cfg)
        assert (_kept_other_code(plan, cell, files, same) is not None) == (not called[name]), name
    rows = [{"row": n, "method": "none", "task": "vit", "reading": n} for n in codes]
    text = code_line(table, rows)
    assert "2 of the 4 runs it trained" in text and "vit: old (conditioning, task; 1 runs shown)" in text
    assert "vit: current" not in text.split("made by other code")[-1] and "vit: shown (" not in text
    # every reading made by other code: one clause naming the parts, not every reading again
    stale = {k: c for k, c in cells.items() if k[0] in ("old", "unrecorded")}
    text = code_line(table_provenance(plan, stale, done=[sums["old"], sums["unrecorded"]]),
                     [r for r in rows if r["row"] in ("old", "unrecorded")])
    assert "2 of the 2 runs it trained" in text and "every reading's runs shown were (conditioning, engine, " in text
