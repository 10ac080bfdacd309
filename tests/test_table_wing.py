"""The table wing's promises to a user: nothing typed overwrites a committed table, a switch is 1 or 0, and a
re-render that changes no value leaves the files as they are."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import plan_of

from condattn.reporting.tables import save_outputs
from condattn.reproduce import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_switches_are_one_or_zero_and_refuse_anything_else():
    def dry(*given: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "-n", "reproduce-table-4", "SCALE=smoke", *given], cwd=REPO,
                              capture_output=True, text=True)

    for off in ("FORCE=0", "FORCE=", "STALE=0", "DRY_RUN=0"):
        out = dry(off)
        assert out.returncode == 0, out.stderr
        assert not any(f in out.stdout for f in ("--force", "--refresh-stale", "--dry-run")), (off, out.stdout)
    out = dry("FORCE=1", "STALE=1", "DRY_RUN=1")
    assert all(f in out.stdout for f in ("--force", "--refresh-stale", "--dry-run"))
    for bad in ("FORCE=maybe", "STALE=false", "DRY_RUN=yes"):
        out = dry(bad)
        key, value = bad.split("=")
        assert out.returncode != 0 and f"{key}={value} is not a switch" in out.stderr, out.stderr
        assert len([line for line in out.stderr.splitlines() if line.strip()]) == 1


def _write(tmp: Path, md: str, value: str):
    exp = {"table": "tableX_demo", "metric": "loss", "scales": {"smoke": {"seeds": [0]}}, "rows": {"a": {}},
           "methods": ["none"]}
    return save_outputs(plan_of(exp, "smoke", tmp / "runs", tmp), md, [{"row": "a", "ours": value}], lambda png: None,
                        "curves", floors=False)


def test_a_rerender_with_the_same_values_leaves_the_files_untouched(tmp_path):
    md_path, _ = _write(tmp_path, "# t\n\n| a | 1 |\n\nOurs: written 2026-01-01 10:00 UTC.\n", "1")
    files = sorted(md_path.parent.iterdir())
    assert [f.suffix for f in files] == [".csv", ".json", ".md"]
    stamps = {f: f.stat().st_mtime_ns for f in files}
    os.utime(md_path, ns=(1, 1))
    stamps[md_path] = 1
    _, text = _write(tmp_path, "# t\n\n| a | 1 |\n\nOurs: written 2026-02-02 11:11 UTC.\n", "1")
    assert {f: f.stat().st_mtime_ns for f in files} == stamps and "2026-01-01 10:00" in text
    _, text = _write(tmp_path, "# t\n\n| a | 2 |\n\nOurs: written 2026-02-02 11:11 UTC.\n", "2")
    assert md_path.stat().st_mtime_ns != 1 and "2026-02-02 11:11" in md_path.read_text()
    assert '"ours": "2"' in (tmp_path / "smoke" / "tableX_demo.json").read_text()


@pytest.mark.slow
def test_other_seeds_write_a_table_named_by_them_never_the_default_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CONDATTN_RESULTS", str(tmp_path / "res"))
    common = ["experiments/table4_lra.yaml", "--scale", "smoke", "--report-only", f"paths.runs={tmp_path / 'runs'}"]
    main([*common, "--seeds", "7 8"])
    out = tmp_path / "res" / "smoke"
    assert (out / "table4_lra.seeds-7+8.md").is_file() and not (out / "table4_lra.md").exists()
    assert "seeds 7 8 are not the experiment's" in capsys.readouterr().out


def _committed_records():
    from condattn.runs import kept_records

    return {scale.name: kept_records(scale / "runs") for scale in sorted((REPO / "results").iterdir())
            if (scale / "runs").is_dir()}


@pytest.mark.slow  # reads every committed record
def test_the_run_store_holds_each_run_once_and_names_only_commits_of_the_history():
    import collections

    from condattn.engine.identity import config_hash, science_config

    commits = set()
    for scale, records in _committed_records().items():
        assert records, scale
        seen = collections.defaultdict(list)
        for rec in records:
            s = rec.summary
            assert s is not None, f"{rec.path}: not a finished run's record"
            seen[(config_hash(science_config(s["config"])), tuple(sorted(s["code"].items())))].append(rec.name)
            commits.add(s["commit"].split("+")[0])
        twice = [names for names in seen.values() if len(names) > 1]
        assert not twice, f"{scale}: one run (science config and code, readings' included) stored twice: {twice[:3]}"
    if subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                      text=True).stdout.strip() != "false":
        pytest.skip("needs a git checkout with its whole history")
    missing = [c for c in sorted(commits) if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=REPO,
                                                             capture_output=True).returncode != 0]
    assert not missing, f"run records name commits that are not in the history: {missing}"


def test_table8_reads_lambda_from_its_runs():
    from condattn.reporting.ablation import recorded_lam

    run = {"config": {"conditioning": {"lam": 5.0}}}
    assert recorded_lam([run, run], 10.0) == 5.0  # what ran, not what the file says
    assert recorded_lam([], 10.0) == 10.0  # no run yet: the declared value
    with pytest.raises(ValueError, match="one row, one λ"):
        recorded_lam([run, {"config": {"conditioning": {"lam": 2.0}}}], 5.0)


@pytest.mark.parametrize("bad, says", [
    ({"lr_grid": [1, 3]}, "lr_grid=[1, 3]"),
    ({"lr_grid": [1, 2], "selection_seeds": [0, 101]}, "selection_seeds=[0, 101]"),  # a reported seed
    ({"lr_grid": [1, 2], "selection_seeds": [100, 101], "lr_bound": [1, 1.5]}, "lr_bound=[1, 1.5]"),
    ({"length_check": {"factor": 1}}, "length_check="),
])
def test_the_lr_protocol_is_checked_when_the_experiment_file_is_parsed(tmp_path, bad, says):
    import yaml

    from condattn.experiment import ExperimentError, load

    raw = yaml.safe_load((REPO / "experiments" / "table4_lra.yaml").read_text())
    raw["scales"]["smoke"] = {**raw["scales"]["smoke"], "seeds": [0], **bad}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExperimentError, match="scales.smoke." + says.split("=")[0]) as e:
        load(path)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_reproduced_fingerprint_is_not_stale_but_an_unreproduced_one_is():
    from condattn.engine.provenance import equivalent_hashes, stale_parts

    def entry(method, cond, equal, shared="e1"):
        return {"method": method, "cell": f"c_{method}", "from_commit": "a", "to_commit": "b", "equal": equal,
                "from_code": {"conditioning": cond[0], "engine": shared, "model": "m", "task": "t"},
                "to_code": {"conditioning": cond[1], "engine": "e2", "model": "m", "task": "t"}}

    same = equivalent_hashes([entry("spectral", ("s1", "s2"), True), entry("embedded", ("c1", "c2"), True)])
    now = {"conditioning": "s2", "engine": "e2", "model": "m", "task": "t", "diagnostics": "d9"}
    assert stale_parts({**now, "conditioning": "s1", "engine": "e1"}, now, same) == []
    assert stale_parts({**now, "conditioning": "s0"}, now, same) == ["conditioning"]  # never reproduced
    # one cell of the batch differs: its method stays stale, and so does the shared code for every method
    same = equivalent_hashes([entry("spectral", ("s1", "s2"), True), entry("embedded", ("c1", "c2"), False)])
    assert stale_parts({**now, "conditioning": "s1", "engine": "e1"}, now, same) == ["engine"]
    assert stale_parts({**now, "conditioning": "c1"}, {**now, "conditioning": "c2"}, same) == ["conditioning"]



def test_an_override_table_is_exploratory_its_output_ignored_and_never_to_be_committed(tmp_path):
    """A table made with science overrides writes its files and keeps its runs' records under results/exploratory/
    (which .gitignore names), and says there is nothing to commit; the default table's say 'commit them'."""
    from helpers import REPO, experiment_raw, plan_of

    from condattn.table.planned import MadeWith
    from condattn.table.report import exploratory, kept_line, kept_root, out_dir

    plan = plan_of(experiment_raw("table4_lra"), "smoke", tmp_path / "runs", tmp_path / "results")
    made = plan_of(experiment_raw("table4_lra"), "smoke", tmp_path / "runs", tmp_path / "results",
                   made_with=MadeWith(("conditioning.lam=5",), ("spectral",)), stem="table4_lra.lam-5")
    assert not exploratory(plan) and exploratory(made)
    assert out_dir(plan) == tmp_path / "results" / "smoke" and kept_root(plan) == tmp_path / "results/smoke/runs"
    assert out_dir(made) == tmp_path / "results" / "exploratory" / "smoke"
    assert kept_root(made) == tmp_path / "results" / "exploratory" / "smoke" / "runs"
    assert "commit them with the table" in kept_line(plan, 3)
    assert "commit them" not in kept_line(made, 3) and "ignored" in kept_line(made, 3)
    # git ignores the folder (.gitignore names it, anchored at the root): an override run leaves `git status` clean
    assert "/results/exploratory/" in (REPO / ".gitignore").read_text().splitlines()
