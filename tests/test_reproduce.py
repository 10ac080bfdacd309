"""`reproduce`: every cell of a table, skipped when finished, rendered beside the papers' numbers; a stopped
table finishes only its missing cells; bad input is refused before any cell runs."""

import csv
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import experiment_raw, plan_of, typed

from condattn.experiment import load
from condattn.reporting import render
from condattn.reporting.tables import TableCell
from condattn.reproduce import main
from condattn.table.result import table_result
from condattn.utils.io import read_json, read_jsonl

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "experiments" / "table4_lra.yaml"


def listops_only(tmp: Path, steps: int = 4) -> Path:
    """Table 4 restricted to its ListOps row (the other rows' tiny overrides differ), shrunk to a few steps on tiny
    data (the experiment's own smoke overrides, so its cells keep their names: extra overrides that change a result
    would give them variant names), as a file."""
    exp = experiment_raw(EXP)
    exp["rows"] = {"listops": exp["rows"]["listops"]}
    exp["paper"] = {"listops": exp["paper"]["listops"]}
    exp["scales"]["smoke"]["overrides"] = [
        "data.generate.train=64", "data.generate.val=24", "data.generate.test=16", "data.generate.min_length=20",
        "data.generate.max_length=60", "data.max_length=64", "data.seq_len=64", "task.batch_size=8",
        f"task.steps={steps}", "task.eval_every=2", "diagnostics.batch_size=2",
    ]
    path = tmp / "table4_lra.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def tiny(tmp: Path) -> list[str]:
    """Where the runs go and how they are run (no science: the cells keep their names)."""
    return [
        "logger=none", f"paths.runs={tmp / 'runs'}", f"paths.cache={tmp / 'cache'}", f"paths.results={tmp / 'results'}",
        "task.log_every=1", "impl.checkpoint_every=2",
    ]


def _interrupt_when(path: Path, done: threading.Event) -> threading.Thread:
    """Ctrl-C this process (a real SIGINT) once `path` exists: a user stopping the table half-way. Never
    fires after `done` is set (a SIGINT outside reproduce would stop pytest itself)."""
    def watch():
        while not done.is_set():
            if path.exists():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


@pytest.mark.slow
def test_reproduce_table4_smoke_end_to_end_interrupted_and_idempotent(tmp_path, capsys):
    exp = listops_only(tmp_path, steps=8)
    runs = tmp_path / "runs" / "smoke"
    names = [f"table4_lra_listops_{m}_smoke_s0" for m in ("none", "spectral", "embedded")]
    args = [str(exp), "--scale", "smoke", "--seeds", "0", *tiny(tmp_path)]

    # 1. stopped half-way: Ctrl-C while the second cell trains -> it checkpoints and the table stops
    done = threading.Event()
    watcher = _interrupt_when(runs / names[1] / "checkpoints" / "step_0000002", done)
    try:
        code = main(args)
    finally:
        done.set()
        watcher.join()
    assert code == 3
    out = capsys.readouterr().out
    assert f"stopped at {names[1]}: signal SIGINT at step" in out and "rerun the same command" in out
    assert read_json(runs / names[0] / "summary.json")["status"] == "finished"
    assert not (runs / names[1] / "summary.json").exists() and (runs / names[1] / "checkpoints").is_dir()
    assert not (runs / names[2]).exists()
    first_done = read_json(runs / names[0] / "summary.json")["finished_at"]

    # 2. run again: only the missing cells run; the stopped one resumes from its checkpoint
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{names[0]}: finished earlier, skipped" in out
    assert f"resumed {names[1]} from step_" in out and f"[reproduce] 2/2 {names[2]}" in out
    assert read_json(runs / names[0] / "summary.json")["finished_at"] == first_done
    resumed = read_json(runs / names[1] / "summary.json")
    assert resumed["steps"] == 8 and len(resumed["launch"]["resumed_at_steps"]) == 1
    steps = [r["step"] for r in read_jsonl(runs / names[1] / "metrics.jsonl") if r["split"] == "train"]
    assert steps == list(range(1, 9))  # no step lost or logged twice across the stop
    md = (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()
    assert "| listops | 37.1 | 37.9 | 37.1 | 37.8 |" in md  # the papers' numbers, labelled as such
    assert "paper CET: baseline" in md and "ours: SCA" in md and "n = 1 (no spread)" in md and "missing" not in md
    assert "offline stand-in data" in md and "seeds [0]" in md
    assert (tmp_path / "results" / "smoke" / "table4_lra.png").stat().st_size > 0
    rows = list(csv.DictReader(open(tmp_path / "results" / "smoke" / "table4_lra.csv")))
    assert {r["method"] for r in rows} == {"none", "spectral", "embedded"} and all(r["n"] == "1" for r in rows)
    assert md in out

    # second run: every cell is skipped, the table is the same
    # 3. again: every cell is skipped, the table is the same
    assert main(args) == 0
    out2 = capsys.readouterr().out
    assert out2.count("finished earlier, skipped") == 3
    md2 = (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()
    strip = lambda t: [ln for ln in t.splitlines() if not ln.startswith("Ours:")]  # noqa: E731
    assert strip(md2) == strip(md)

    # 3b. an extra override that changes the SCA cell's result: it trains as a run of its own (a variant name), the
    # baseline and CET cells (λ does not apply to them) are reused, and the table reads the λ = 2 run
    assert main([*args, "conditioning.lam=2"]) == 0
    out = capsys.readouterr().out
    lam2 = [d for d in runs.iterdir() if d.name.startswith(names[1] + "-")]
    assert len(lam2) == 1 and f"[reproduce] 1/1 {lam2[0].name}" in out and out.count("finished earlier, skipped") == 2
    assert read_json(lam2[0] / "summary.json")["config"]["conditioning"]["lam"] == 2.0
    assert read_json(runs / names[1] / "summary.json")["config"]["conditioning"]["lam"] == 10.0
    lam2_acc = 100 * read_json(lam2[0] / "summary.json")["metrics"]["test_acc"]
    spectral = next(r for r in csv.DictReader(open(tmp_path / "results" / "smoke" / "table4_lra.csv"))
                    if r["method"] == "spectral")
    assert abs(float(spectral["mean"]) - lam2_acc) < 1e-3
    assert main([*args, "conditioning.lam=2"]) == 0  # and the λ = 2 table is as idempotent as the default one
    assert capsys.readouterr().out.count("finished earlier, skipped") == 3

    # 4. a corrupt (half-written) summary counts as unfinished: that cell alone runs again (from its last
    # checkpoint, which is the final step: only the final evaluation is redone)
    (runs / names[2] / "summary.json").write_text('{"status": "finished", "metr')
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{names[2]}: summary.json is unreadable (corrupt or half-written); treating the cell as unfinished" in out
    assert out.count("finished earlier, skipped") == 2 and read_json(runs / names[2] / "summary.json")["steps"] == 8

    # 5. a lost summary makes that cell missing: the table from fewer runs does not replace the one there, unless forced
    (runs / names[1] / "summary.json").unlink()
    assert main([*args, "--report-only"]) == 1
    assert "more missing runs" in capsys.readouterr().err
    assert "| missing |" not in (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()
    assert main([*args, "--report-only", "--force"]) == 0
    assert "| missing |" in (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()

    # 6. a fresh clone (no runs, the committed results): the finished runs kept beside the table are restored, the
    # table is whole again and nothing trains
    kept = tmp_path / "results" / "smoke" / "runs"
    assert {d.name for d in kept.iterdir()} == {f"{n}.json.zst" for n in names}  # one file a run
    # (the λ = 2 run made an override table: its record is kept in the ignored exploratory folder, never committed)
    assert [p.name for p in (tmp_path / "results" / "exploratory").rglob(f"{lam2[0].name}.json.zst")]
    shutil.rmtree(tmp_path / "runs")
    assert main([*args, "--dry-run"]) == 0  # a dry run reads the records, writes nothing, says what the run will do
    out = capsys.readouterr().out
    assert "would restore (dry run: nothing written) 3 finished runs" in out and "0 of 3 cells would train" in out
    assert not (tmp_path / "runs").exists()
    assert not any((runs / n / "checkpoints").exists() or (runs / n / "best_model.pt").exists() for n in names)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("finished earlier, skipped") == 3
    assert "| missing |" not in (tmp_path / "results" / "smoke" / "table4_lra.md").read_text()


@pytest.mark.slow
def test_reproduce_refuses_bad_input(tmp_path, capsys):
    exp = str(listops_only(tmp_path))
    with pytest.raises(SystemExit):
        main([exp, "--scale", "huge"])
    with pytest.raises(SystemExit):
        main([exp, "--launcher", "moon"])
    assert main([str(REPO / "experiments" / "table99.yaml")]) == 2
    assert "experiments/table99.yaml not found; known experiments: " in capsys.readouterr().err
    # a bad override fails before any cell runs, named once for all cells, with the likely intended key
    assert main([exp, "--seeds", "0", "conditioning.lamda=1", *tiny(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ("refused before starting any job: override 'conditioning.lamda=1' names no key of the config; "
            "did you mean conditioning.lam?  [all 3 cells]") in err
    assert main([exp, "--seeds", "0", "model=nystromformer", *tiny(tmp_path)]) == 2
    assert "override 'model=nystromformer': there is no configs/model/nystromformer.yaml; did you mean " \
           "model=nystromformer_lra?" in capsys.readouterr().err
    # paper scale without the data: refused, naming the path looked at and how to prepare it
    assert main([exp, "--scale", "paper", "--seeds", "0", f"paths.runs={tmp_path / 'runs'}",
                 f"paths.data_root={tmp_path / 'nodata'}"]) == 2
    err = capsys.readouterr().err
    assert f"paper-scale data missing: ListOps data not found in {tmp_path / 'nodata'}/lra_release/listops-1000" in err
    assert "[all 3 cells]" in err
    # a global batch that does not split over the launcher's GPUs
    assert main([exp, "--seeds", "0", "--launcher", "slurm", "launcher.gpus_per_node=3", *tiny(tmp_path)]) == 2
    assert ("global batch task.batch_size=8 does not split over 3 processes; use a process count that divides it "
            "(1, 2, 4, 8, …) or another global batch  [all 3 cells]") in capsys.readouterr().err
    # an override that would put every cell into one run dir
    assert main([exp, "--seeds", "0", "run.name=mine", *tiny(tmp_path)]) == 2
    assert "3 cells (table4_lra_listops_none_smoke_s0, table4_lra_listops_spectral_smoke_s0, " \
           "table4_lra_listops_embedded_smoke_s0) would share the run dir" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_rows_trains_only_the_matching_rows_and_names_a_pattern_that_matches_none(capsys):
    from condattn.reproduce import cells, select_rows

    exp = load("experiments/table9_readings.yaml")
    vit = select_rows(exp, "smoke", ["vit_cet*", "listops_baseline"])
    assert vit == ["vit_cet", "vit_cet_before", "vit_cet_norm", "listops_baseline"]
    names = [n for n, _ in cells(exp, "smoke", [0, 1], [], only_rows=vit)]
    assert len(names) == 8 and names[0] == "table9_readings_vit_cet_embedded_smoke_s0"
    assert not any("sca" in n for n in names)
    with pytest.raises(SystemExit):  # small trains the ViT half only: a ListOps pattern matches none of its rows
        main(["experiments/table9_readings.yaml", "--scale", "small", "--rows", "vit_*,listops_*", "--dry-run"])
    err = capsys.readouterr().err
    assert "--rows 'listops_*' matches no row of table9_readings at scale small; its rows are: vit_baseline," in err


@pytest.mark.slow
def test_corrupt_summary_is_reported_as_unfinished(tmp_path, capsys):
    exp = str(listops_only(tmp_path))
    run = tmp_path / "runs" / "smoke" / "table4_lra_listops_none_smoke_s0"
    run.mkdir(parents=True)
    (run / "summary.json").write_bytes(b"\x00\x00garbage")
    assert main([exp, "--seeds", "0", "--dry-run", *tiny(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("table4_lra_listops_none_smoke_s0: summary.json is unreadable (corrupt or half-written); treating the "
            "cell as unfinished") in out
    assert "dry run: 3 of 3 cells would train here" in out


def test_render_golden():
    exp = experiment_raw(EXP)
    exp["rows"] = {"listops": exp["rows"]["listops"]}
    cells = {}
    for m, vals in {"none": [30.0, 32.0], "spectral": [19.0], "embedded": []}.items():
        c = TableCell("listops", m, [0, 1], values=vals, steps=[120] * len(vals), wall=[10.0] * len(vals))
        c.missing = [1] if len(vals) == 1 else ([0, 1] if not vals else [])
        cells[("listops", m)] = c
    plan = plan_of(exp, "smoke", ".", ".")
    md, rows = render(plan, table_result(plan, cells=cells)[0], cells)
    line = [ln for ln in md.splitlines() if ln.startswith("| listops")][0]
    assert line == (
        "| listops | 37.1 | 37.9 | 37.1 | 37.8 | 31.00 ± 1.41 (n=2) | 19.00, n = 1 (no spread), missing seeds [1] "
        "| missing | 120 | 10 s |"
    )
    assert [r["paper_value"] for r in rows] == [None, 37.8, 37.9]  # each beside its own paper's baseline:
    assert [r["paper_baseline"] for r in rows] == [None, 37.1, 37.1]
    assert "no finished runs yet" in md


@pytest.mark.slow
def test_make_target_dry_invocation():
    out = subprocess.run(["make", "-n", "reproduce-table-4", "SCALE=small", "SEEDS=0 1"], cwd=REPO,
                         capture_output=True, text=True)
    cmd = " ".join(out.stdout.replace("\\\n", " ").split())
    assert 'condattn.reproduce experiments/table4_lra.yaml --scale small --launcher local --seeds "0 1"' in cmd
    out = subprocess.run(["make", "-n", "reproduce-table-4", "SCALE=paper", "LAUNCHER=slurm", "DRY_RUN=1"], cwd=REPO,
                         capture_output=True, text=True)
    cmd = " ".join(out.stdout.replace("\\\n", " ").split())
    assert "condattn.reproduce experiments/table4_lra.yaml --scale paper --launcher slurm --dry-run" in cmd
    out = subprocess.run(["make", "-n", "reproduce-table-9", "SCALE=small", "ROWS=vit_*"], cwd=REPO,
                         capture_output=True, text=True)
    assert '--scale small --launcher local --rows "vit_*"' in " ".join(out.stdout.replace("\\\n", " ").split())


def test_row_overrides_per_scale_fill_in_the_method():
    """Table 2 at paper scale: each method's XCiT-M backbone starts from table 1's run of the same method; the other
    row and the offline scales get no such override."""
    from condattn.reproduce import cells

    exp = load("experiments/table2_coco.yaml")
    paper = dict(cells(exp, "paper", [0], []))
    assert "model.backbone_checkpoint=table1_imagenet_xcit_medium_spectral_paper_s0" in \
        paper["table2_coco_xcit_medium_24_p16_spectral_paper_s0"]
    assert "model.backbone_checkpoint=table1_imagenet_xcit_medium_none_paper_s0" in \
        paper["table2_coco_xcit_medium_24_p16_none_paper_s0"]
    small = paper["table2_coco_xcit_small_12_p16_none_paper_s0"]
    assert not any(o.startswith("model.backbone_checkpoint") for o in small)
    assert not any(o.startswith("model.backbone_checkpoint") for ov in dict(cells(exp, "smoke", [0], [])).values()
                   for o in ov)


@pytest.mark.slow
def test_a_rows_run_writes_beside_the_table_and_results_follow_condattn_results(tmp_path, monkeypatch):
    """ROWS=text writes table4_lra.rows-text.md beside the full table (never over it); paths.results, and so every
    table, follows $CONDATTN_RESULTS."""
    from condattn.config import compose
    from condattn.reproduce import rows_slug

    monkeypatch.setenv("CONDATTN_RESULTS", str(tmp_path / "res"))
    assert compose(["scale=smoke"]).paths.results == str(tmp_path / "res")
    assert rows_slug("vit_*,listops_cet*") == "vit_+listops_cet" and rows_slug("vit_[ab]") == "vit_ab"
    common = ["experiments/table4_lra.yaml", "--scale", "smoke", "--report-only", f"paths.runs={tmp_path / 'runs'}"]
    assert main([*common, "--rows", "text"]) == 0
    assert (tmp_path / "res" / "smoke" / "table4_lra.rows-text.md").is_file()
    assert (tmp_path / "res" / "smoke" / "table4_lra.rows-text.csv").is_file()
    assert not (tmp_path / "res" / "smoke" / "table4_lra.md").exists()
    assert main(common) == 0
    assert (tmp_path / "res" / "smoke" / "table4_lra.md").is_file()


def test_restore_kept_never_restores_weights_a_cell_still_needs_nor_a_run_set_aside(tmp_path):
    """Records carry no weights: a pretraining run is restored only once every fine-tuning cell that starts from it is
    finished; a run --refresh-stale set aside (its `.stale-N`) is being retrained and stays absent."""
    from omegaconf import OmegaConf

    from condattn.launch import RunSpec
    from condattn.reproduce import restore_kept
    from condattn.runs import KeptRecord, RunRecord

    exp = typed({"table": "t3", "metric": "acc", "rows": {"sst2": {}}, "methods": ["none"], "pretrain": {"seed": 0},
                 "scales": {"small": {"seeds": [0, 1]}}})
    names = ["t3_pretrain_none_small_s0", "t3_sst2_none_small_s0", "t3_sst2_none_small_s1"]
    runs, kept = tmp_path / "runs" / "small", tmp_path / "results" / "small" / "runs"
    cells = [RunSpec(n, [], OmegaConf.create({"run": {"dir": str(runs / n)}})) for n in names]
    plan = plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", cells=tuple(cells))

    def keep(name: str) -> None:
        KeptRecord.of(kept, name).write({"summary.json": {"status": "finished", "metrics": {"acc": 1.0},
                                                          "run_dir": "elsewhere"}})

    keep(names[0])
    keep(names[1])
    assert len(restore_kept(plan)) == 1  # the fine-tune s0; s1 will train from the pretraining run's weights
    assert RunRecord(runs / names[1]).finished and not (runs / names[0]).exists()
    keep(names[2])
    assert len(restore_kept(plan)) == 2  # s1, then the pretraining run nothing needs any more
    assert RunRecord(runs / names[0]).finished

    s2 = "t3_sst2_none_small_s2"
    other = RunSpec(s2, [], OmegaConf.create({"run": {"dir": str(runs / s2)}}))
    keep(other.name)
    (runs / f"{other.name}.stale-1").mkdir()
    assert len(restore_kept(plan_of(exp, "small", tmp_path / "runs", tmp_path / "results", cells=(other,)))) == 0
