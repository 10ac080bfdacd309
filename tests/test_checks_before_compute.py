"""Every value is checked before any compute (issue 36): `resume`, the runs and results folders, a bad override once
with its cause first, λ far beyond the weights' scale. Unit tier (the guard fails a test that would train), but for
the refusals through `reproduce` that first plan a whole table (slow: each composes and costs every cell)."""

import os
from pathlib import Path

import pytest
from test_reproduce import listops_only, tiny

from condattn.config import ConfigError, compose, compose_cell
from condattn.engine import preflight
from condattn.reproduce import main


def _refusal(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.strip()]


def test_resume_maybe_is_refused_before_any_cell_trains(tmp_path, capsys):
    """Before the plan: nothing printed (no "finished earlier, skipped" per cell), one line on stderr."""
    assert main([str(listops_only(tmp_path)), "--seeds", "0", *tiny(tmp_path), "resume=maybe"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (
        "[reproduce] refused before starting any job: resume='maybe' must be auto (continue from the run dir's last "
        "checkpoint; a finished run is kept) or never (start the run over)")
    assert not (tmp_path / "runs").exists()


def test_resume_is_validated_for_one_run():
    assert any(m.startswith("resume='maybe' must be auto") for m in
               preflight.config_problems(compose(["scale=smoke", "resume=maybe"])))
    assert not [m for m in preflight.config_problems(compose(["scale=smoke", "resume=never"])) if "resume" in m]


def _read_only(path: Path, monkeypatch) -> Path:
    """A read-only folder; as root (who may write anywhere) the check is shown the same folder as unwritable."""
    path.mkdir(parents=True)
    path.chmod(0o555)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path else real(p, mode, **kw))
    return path


def test_a_read_only_results_folder_is_refused_before_any_cell_trains(tmp_path, capsys, monkeypatch):
    results = _read_only(tmp_path / "ro", monkeypatch)
    assert main([str(listops_only(tmp_path)), "--seeds", "0", *tiny(tmp_path), f"paths.results={results}"]) == 2
    err = _refusal(capsys)
    assert len(err) == 1 and err[0].startswith(f"[reproduce] refused before starting any job: paths.results={results}: "
                                               f"{results} is not writable, so the tables cannot be written there"), err
    assert not (tmp_path / "runs").exists()


def test_a_read_only_runs_folder_is_refused_by_the_train_cli(tmp_path, capsys, monkeypatch):
    from condattn.train import cli

    runs = _read_only(tmp_path / "ro", monkeypatch)
    assert cli(["scale=smoke", "logger=none", f"paths.runs={runs / 'sub'}"]) == 2
    err = _refusal(capsys)
    assert err == [f"[condattn] paths.runs={runs / 'sub'}: {runs} is not writable (it would hold {runs / 'sub'}), so "
                   f"the runs cannot be written there; make it writable, or point paths.runs= (or $CONDATTN_RUNS) at a "
                   "writable folder"]


def test_a_spaced_override_is_one_message_with_its_cause_first(tmp_path, capsys):
    assert main([str(listops_only(tmp_path)), "--seeds", "0", *tiny(tmp_path), "conditioning.lam", "=", "2"]) == 2
    err = _refusal(capsys)
    assert len(err) == 1, err
    assert err[0].startswith("[reproduce] refused before starting any job: override 'conditioning.lam' is not "
                             "key=value; write each override as one word key=value, without spaces around '='")
    assert err[0].endswith("[all 3 cells]")
    with pytest.raises(ConfigError, match=r"^override 'conditioning.lam=' has no value \(a space after '='\?\)"):
        compose_cell(["conditioning.lam=", "2"])


def test_lambda_far_beyond_the_weights_scale_is_warned_once(capsys):
    cfg = compose(["scale=smoke", "conditioning=spectral", "conditioning.lam=1e8"])
    w = preflight.lam_warning(cfg)
    assert w.startswith("conditioning.lam=1e+08 (lam_unit=abs) is ") and "fp32 rounds W away entirely" in w
    assert preflight.lam_warning(compose(["scale=smoke", "conditioning=spectral"])) is None  # the paper's λ = 10
    assert preflight.lam_warning(compose(["scale=smoke", "conditioning=none"])) is None
    preflight._WARNED.clear()
    preflight.preflight_checked(cfg, check_data=False, check_run_dir=False)
    preflight.preflight_checked(cfg, check_data=False, check_run_dir=False)
    err = _refusal(capsys)
    assert err == [f"[condattn] warning: {w}"]


@pytest.mark.slow
def test_the_makefile_refuses_a_look_alike_of_its_own_variables():
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    for given, meant in (("ROW=image", "ROWS=image"), ("SEED=1", "SEEDS=1"), ("SCALES=small", "SCALE=small")):
        out = subprocess.run(["make", "-n", "reproduce-table-4", given], cwd=repo, capture_output=True, text=True)
        assert out.returncode != 0 and "condattn.reproduce" not in out.stdout
        assert f"*** {given} is not a variable of this Makefile (it would be ignored); did you mean {meant}?" in \
            out.stderr.splitlines()[0], out.stderr
    out = subprocess.run(["make", "-n", "reproduce-table-4", "ROWS=image", "MY_OWN=1"], cwd=repo, capture_output=True,
                         text=True)
    assert out.returncode == 0 and '--rows "image"' in out.stdout  # an unrelated variable is the user's own


def test_one_seed_prints_no_spread():
    from condattn.reporting.fmt import fmt_values
    from condattn.table.result import Values

    assert fmt_values(Values((0,), (19.333,), ())) == "19.33, n = 1 (no spread)"  # never "19.33 ± 0.00 (n=1)"
    assert fmt_values(Values((0, 1), (30.0, 32.0), ())) == "31.00 ± 1.41 (n=2)"


def test_relative_paths_are_the_project_roots_from_a_subdirectory(tmp_path, monkeypatch):
    """Run from a subdirectory, `--report-only` read runs/ there and wrote an all-missing table there; the paths are
    now the project root's (the CONDATTN_* variables or absolute paths choose others)."""
    from condattn.config import PROJECT_ROOT
    from condattn.experiment import load
    from condattn.reproduce import plan

    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    cfg = compose(["scale=smoke", f"paths.cache={tmp_path / 'cache'}"])
    assert cfg.paths.runs == str(PROJECT_ROOT / "runs") and cfg.paths.results == str(PROJECT_ROOT / "results")
    assert cfg.run.dir == str(PROJECT_ROOT / "runs" / "smoke" / cfg.run.name)
    assert cfg.paths.cache == str(tmp_path / "cache")  # absolute: as given
    p = plan(load(listops_only(tmp_path)), "smoke", [0], [])
    assert p.runs_root == PROJECT_ROOT / "runs" and p.results_root == PROJECT_ROOT / "results"
    monkeypatch.setenv("CONDATTN_RUNS", str(tmp_path / "elsewhere"))
    assert compose(["scale=smoke"]).paths.runs == str(tmp_path / "elsewhere")


def test_each_table_says_at_which_checkpoint_and_smoke_tables_give_chance(tmp_path):
    from condattn.experiment import load
    from condattn.reporting.notes import table_notes

    exp = load(listops_only(tmp_path))
    notes = table_notes(exp, "smoke", ["listops"])
    assert "Checkpoint: `test_acc` (every row) is test acc with the best-validation checkpoint (best_model.pt: the " \
           "evaluation with the best validation acc), as the LRA code reports it." in notes
    assert "Chance (a uniform guess; at smoke scale a row near it has learned nothing yet): 10.00 (10 classes: " \
           "listops)." in notes
    paper = table_notes(exp, "paper", ["listops"])
    assert not [n for n in paper if n.startswith("Chance")] and [n for n in paper if n.startswith("Checkpoint")]
    vit = load(Path(__file__).resolve().parents[1] / "experiments" / "table1_imagenet.yaml")
    assert "Checkpoint: `final_val_acc` (every row) is validation acc with the last step's weights (the final " \
           "checkpoint)." in table_notes(vit, "paper", ["vit_base"])



def test_the_results_folder_is_checked_for_table_cells_only(tmp_path, monkeypatch):
    results = _read_only(tmp_path / "ro", monkeypatch)
    ov = ["scale=smoke", f"paths.runs={tmp_path / 'runs'}", f"paths.results={results}"]
    assert preflight.folder_problems(compose(ov)) == []  # `train` alone writes no table
    assert [m.split(":")[0] for m in preflight.folder_problems(compose([*ov, "run.table=t"]))] == [
        f"paths.results={results}"]


BAD_VALUES = [("optim.lr=-1", "optim.lr=-1 must be a positive number"),
              ("optim.lr=0", "optim.lr=0 must be a positive number"),
              ("optim.weight_decay=-1", "optim.weight_decay=-1 must be a number ≥ 0"),
              ("impl.threads=0", "impl.threads=0 must be a positive integer"),
              ("impl.threads=-1", "impl.threads=-1 must be a positive integer"),
              ("seed=-1", "seed=-1 must be an integer 0 ≤ seed < 2**32 (4,294,967,296)")]


@pytest.mark.parametrize(("override", "says"), BAD_VALUES)
def test_a_bad_number_is_refused_by_reproduce_before_the_plan(tmp_path, capsys, override, says):
    """Table 4's smoke cells have committed records, which a plan restores into the runs folder first: a bad number
    is refused before that, in one line, with nothing printed and no run directory made. impl.threads=0 is refused,
    never read as "unset" (which made it a run variant of its own)."""
    table4 = Path(__file__).resolve().parents[1] / "experiments" / "table4_lra.yaml"
    assert main([str(table4), "--scale", "smoke", f"paths.runs={tmp_path / 'runs'}", override]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"[reproduce] refused before starting any job: {says}"), err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("override", "says"), BAD_VALUES)
def test_a_bad_number_is_refused_by_the_train_cli(tmp_path, capsys, monkeypatch, override, says):
    from condattn.train import cli

    monkeypatch.chdir(tmp_path)
    assert cli(["scale=smoke", "logger=none", f"paths.runs={tmp_path / 'runs'}", override]) == 2
    err = _refusal(capsys)
    assert len(err) == 1 and err[0].startswith(f"[condattn] {says}"), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "proc"])
@pytest.mark.parametrize("key", ["paths.runs", "paths.results"])
def test_a_runs_or_results_folder_that_is_a_file_or_under_proc_is_refused_before_the_plan(tmp_path, capsys, where,
                                                                                           key):
    """A regular file (was NotADirectoryError from the kept records' restore) or /proc, where root passes os.access
    (the report crashed after every cell): one line, before anything is planned or written."""
    bad = tmp_path / "a_file" if where == "file" else Path("/proc/condattn-test")
    if where == "file":
        bad.write_text("")
    assert main([str(listops_only(tmp_path)), "--seeds", "0", *tiny(tmp_path), f"{key}={bad}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    first = bad if where == "file" else Path("/proc")
    why = "is not a directory" if where == "file" else "is not writable"
    assert err.startswith(f"[reproduce] refused before starting any job: {key}={bad}: {first} {why}"), err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("gpus", "says"), [
    ("0", "launcher.gpus_per_node=0 gives the job no GPU"),
    ("-4", "launcher.gpus_per_node=-4 must be an integer ≥ 1")])
def test_slurm_gpu_counts_below_one_are_refused(tmp_path, capsys, gpus, says):
    exp = Path(__file__).resolve().parents[1] / "experiments" / "table4_lra.yaml"
    assert main([str(exp), "--scale", "paper", "--launcher", "slurm", "--dry-run", "--rows", "listops",
                 *tiny(tmp_path), f"launcher.gpus_per_node={gpus}"]) == 2
    err = capsys.readouterr().err
    assert says in err and "max()" not in err and "empty sequence" not in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_slurm_node_count_below_one_is_refused(tmp_path, capsys):
    exp = Path(__file__).resolve().parents[1] / "experiments" / "table4_lra.yaml"
    assert main([str(exp), "--scale", "paper", "--launcher", "slurm", "--dry-run", "--rows", "listops",
                 *tiny(tmp_path), "launcher.nodes=0"]) == 2
    err = capsys.readouterr().err
    assert "launcher.nodes=0 must be an integer ≥ 1" in err and "max()" not in err, err


def test_diagnose_refuses_a_typo_in_one_line_with_did_you_mean(tmp_path, capsys, monkeypatch):
    from condattn.diagnose import main as diagnose

    monkeypatch.chdir(tmp_path)
    assert diagnose(["scale=smoke", "conditioning=spectrall"]) == 2
    err = _refusal(capsys)
    assert len(err) == 1 and err[0].startswith("diagnose: ") and "did you mean" in err[0] and "spectral" in err[0], err
    assert diagnose(["scale=smoke", "impl.threads=0"]) == 2
    assert _refusal(capsys) == ["diagnose: impl.threads=0 must be a positive integer (torch's intra-op threads, e.g. "
                                "impl.threads=1), or null for torch's default"]
    assert list(tmp_path.iterdir()) == []


TABLE4 = Path(__file__).resolve().parents[1] / "experiments" / "table4_lra.yaml"
TABLE_REFUSALS = [
    (["--seeds", "-1"], "--seeds: seed -1 is out of range: each seed is an integer 0 ≤ s < 2**32 (4,294,967,296)"),
    (["--seeds", str(2**32)], f"--seeds: seed {2**32} is out of range"),
    (["--seeds", "0 0"], "--seeds 0 0: seed 0 is given more than once; give each seed once"),  # was about run.name
    (["+foo=1"], "override '+foo=1' adds a key that no config declares and no code reads (it would only rename every "
                 "cell and train it again); '+' may add: data.test_per_class, task.augment.shift_px"),
    (["conditioning=qk_norm"], "override 'conditioning=qk_norm' would train every method column of the table (none, "
                               f"spectral, embedded) as one method: a table's methods are the `methods:` of {TABLE4}; "
                               "train some rows with ROWS="),
    (["scale=small"], "override 'scale=small': the scale is the command's, SCALE= (--scale)"),
    (["impl.precision=bf16"], "impl.precision=bf16 is the precision of a CUDA run, and this machine has no CUDA "
                              "device: its cells would train in impl.cpu_precision (fp32 unless set)"),
]


@pytest.mark.parametrize(("given", "says"), TABLE_REFUSALS)
def test_what_a_table_cannot_take_is_refused_before_the_plan(tmp_path, capsys, monkeypatch, given, says):
    """Through table 4's smoke cells, whose committed records a plan would restore first: seeds out of range or twice,
    a `+key` nothing reads (retrained all 15 cells), a method group (trained one config three times per row under
    three methods' headings), another scale in ARGS (reused the small runs under smoke names), a precision this
    machine does not run (fp32 trained under a bf16 label): one line each, nothing printed before, nothing written."""
    import condattn.checks

    monkeypatch.setattr(condattn.checks, "_has_cuda", lambda: False)  # the same refusal on a GPU machine's CPU test
    assert main([str(TABLE4), "--scale", "smoke", f"paths.runs={tmp_path / 'runs'}", *given]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"[reproduce] refused before starting any job: {says}"), err
    assert not (tmp_path / "runs").exists()


def test_precision_is_refused_only_where_it_would_not_act():
    from condattn.checks import table_override_problems

    assert table_override_problems(["impl.precision=bf16"], "t.yaml", ["none"], "local", cuda=True) == []
    assert table_override_problems(["impl.precision=bf16"], "t.yaml", ["none"], "slurm", cuda=False) == []
    assert table_override_problems(["impl.precision=no", "impl.cpu_precision=bf16"], "t.yaml", ["none"], "local",
                                   cuda=False) == []
    assert table_override_problems(["++foo=1", "+data.test_per_class=5", "~task.augment"], "t.yaml", ["none"]) == []


def test_every_key_a_plus_may_add_is_read_by_the_code_and_the_experiments_add_no_other():
    import re

    from condattn.config import ADDABLE_KEYS

    repo = Path(__file__).resolve().parents[1]
    source = "\n".join(f.read_text() for f in (repo / "condattn").rglob("*.py"))
    for key in ADDABLE_KEYS:
        assert f'"{key.rsplit(".", 1)[-1]}"' in source, key  # read where it is set (a .get of its name)
    added = {m for f in (repo / "experiments").glob("*.yaml") for m in re.findall(r"\+([a-z_.]+)=", f.read_text())}
    assert added and added <= set(ADDABLE_KEYS), added - set(ADDABLE_KEYS)


def test_a_hint_names_only_a_key_of_this_config():
    """data.image_size on a ListOps cell got "did you mean data.vocab_size"; it is a key of the image data only."""
    with pytest.raises(ConfigError) as e:
        compose_cell(["scale=smoke", "data.image_size=8"])
    assert str(e.value) == ("override 'data.image_size=8' names no key of the config; data.image_size is a key of "
                            "data=lra_image, lra_pathfinder only, not of this config's data")
    with pytest.raises(ConfigError, match=r"names no key of the config; did you mean data.vocab_size\?$"):
        compose_cell(["scale=smoke", "data.vocab_sz=8"])  # a typo of a key there


def test_an_override_that_reaches_no_cell_is_said_once(tmp_path):
    """conditioning.norm (QK-norm's option) on table 4, whose methods are none, SCA and CET: no cell reads it, so it
    changes no cell's science config (the MethodSpec's acting options) and the plan says so; λ reaches SCA only."""
    from condattn.experiment import load
    from condattn.table.cells import parts
    from condattn.table.compose import Composer, reached
    from condattn.table.plan import unreached_line

    exp = load(TABLE4)
    comp, extra = Composer(), ["conditioning.norm=rmsnorm", "conditioning.lam=2"]
    by_method = {p.method: p for p in parts(exp, "smoke", [0]) if p.row == "listops"}
    assert reached(comp, by_method["none"], extra) == set()
    assert reached(comp, by_method["spectral"], extra) == {"conditioning.lam=2"}
    assert unreached_line(extra[0], exp) == (
        "conditioning.norm=rmsnorm reaches no cell of table4_lra: none of its methods (none, spectral, embedded) uses "
        "conditioning.norm (an option of qk_norm, qk_norm+spectral, qk_norm+embedded, qk_norm+conditioned_init), or "
        "every cell that does has that value already; the cells, their names and their runs are as without it")
