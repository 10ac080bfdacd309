"""A run is what its config says: options its readable name does not carry give it a variant name, a run dir that
records another config is never resumed or reused, and one process at a time trains a run dir."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import mini_listops

from condattn.config import compose
from condattn.engine.identity import config_mismatch, science_config, variant
from condattn.engine.preflight import PreflightError
from condattn.engine.trainer import TrainingInterrupted, train
from condattn.runs import RunId, RunLock, RunRecord
from condattn.train import _jobs, _names, check

REPO = Path(__file__).resolve().parents[1]
HEX = re.compile(r"-[0-9a-f]{8}$")




def name_of(overrides: list[str]) -> str:
    assert check(overrides) == []
    return _names[frozenset(overrides)]


@pytest.mark.slow
def test_options_outside_the_name_give_a_variant_name(tmp_path):
    plain = ["scale=smoke", "logger=none", f"paths.runs={tmp_path}", "conditioning=spectral"]
    assert name_of(plain) == "lra_listops_spectral_smoke_s0"
    assert name_of([*plain, "conditioning.lam=10"]) == "lra_listops_spectral_smoke_s0"  # the default: the same run
    lam2 = name_of([*plain, "conditioning.lam=2"])
    assert HEX.search(lam2) and lam2.startswith("lra_listops_spectral_smoke_s0-")
    assert name_of([*plain, "conditioning.lam=2.0"]) == lam2  # the same value, the same run
    assert name_of([*plain, "conditioning.lam=2", "conditioning.identity=per_head"]) not in (lam2, plain)
    assert name_of([*plain, "task.steps=50"]) != name_of(plain)
    assert name_of([*plain, "model=nystromformer_lra_dual"]) != name_of(plain)
    # how a run is run is not what it computes: the same run
    assert name_of([*plain, "impl.threads=1", "impl.checkpoint_every=7", "resume=never"]) == name_of(plain)
    # a name given explicitly is the user's
    assert name_of([*plain, "conditioning.lam=2", "run.name=mine"]) == "mine"
    # a -m sweep over an option: one name per value
    jobs = _jobs([*plain, "conditioning.lam=1,2,10"], multirun=True)
    assert len(jobs) == 3 and len({name_of(j) for j in jobs}) == 3


def test_science_config_ignores_paths_and_options_of_other_methods(tmp_path):
    a = compose(["conditioning=none", f"paths.runs={tmp_path}", "logger=none"])
    b = compose(["conditioning=none", "conditioning.lam=2", "impl.checkpoint_every=7"])
    assert science_config(a) == science_config(b) and variant(b, a) == ""
    # the dry run's cost inputs and how the step is compiled are not what a run computes: an older run dir whose
    # config has other loader rates is still this run
    d = compose(["conditioning=none", "impl.worker_samples_per_s.images=17.3", "impl.compile_mode=max-autotune"])
    assert science_config(d) == science_config(a) and variant(d, a) == ""
    c = compose(["conditioning=spectral", "conditioning.lam=2"])
    assert science_config(c)["conditioning"]["lam"] == 2.0 and "solver" not in science_config(c)["conditioning"]


def test_run_id_names_and_parses_variants():
    run = RunId("table4_lra", "listops", "spectral", "smoke", 0, "0123abcd")
    assert run.name == "table4_lra_listops_spectral_smoke_s0-0123abcd"
    assert RunId.parse(run.name, "table4_lra", ["listops"], ["none", "spectral"], "smoke") == run
    old = RunId.parse("table4_lra_listops_spectral_smoke_s0", "table4_lra", ["listops"], ["spectral"], "smoke")
    assert old == RunId("table4_lra", "listops", "spectral", "smoke", 0)
    assert RunRecord.of("runs", RunId("t", "r", "m", "smoke", 1), {"t_r_m_smoke_s1": "0123abcd"}).dir == \
        Path("runs/smoke/t_r_m_smoke_s1-0123abcd")


@pytest.mark.slow
def test_a_run_dir_of_another_config_is_never_resumed_or_reused(tmp_path):
    """An interrupted λ = 2 run under a given name; the same name with λ = 10 is refused, naming conditioning.lam,
    before anything is written; resume=never starts it over; the finished λ = 10 run is refused to λ = 2 too."""
    first = compose(mini_listops(tmp_path, "conditioning=spectral", "conditioning.lam=2", "run.name=mine",
                         "debug.interrupt_at_step=1"))
    with pytest.raises(TrainingInterrupted):
        train(first)
    run_dir = Path(first.run.dir)
    rows = (run_dir / "metrics.jsonl").read_text()
    other = compose(mini_listops(tmp_path, "conditioning=spectral", "run.name=mine"))
    assert config_mismatch(other, run_dir) is not None
    with pytest.raises(PreflightError, match=r"holds a run of another config: conditioning.lam is 2.0 there and 10.0 "
                                             r"here.*resume=never"):
        train(other)
    assert (run_dir / "metrics.jsonl").read_text() == rows  # untouched
    s = train(compose(mini_listops(tmp_path, "conditioning=spectral", "run.name=mine", "resume=never")))
    assert s["config"]["conditioning"]["lam"] == 10.0
    with pytest.raises(PreflightError, match="conditioning.lam is 10.0 there and 2.0 here"):
        train(compose(mini_listops(tmp_path, "conditioning=spectral", "conditioning.lam=2", "run.name=mine")))


@pytest.mark.slow
def test_cli_lam2_then_lam10_and_a_sweep_give_one_run_per_value(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli(*args, flags=()):
        out = subprocess.run([sys.executable, "-m", "condattn.train", *flags, *mini_listops(tmp_path),
                              "conditioning=spectral", *args],
                             cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout

    cli("conditioning.lam=2,10", flags=["-m"])
    runs = sorted((tmp_path / "runs" / "smoke").glob("lra_listops_spectral_smoke_s0-*"))
    lams = {json.loads((d / "summary.json").read_text())["config"]["conditioning"]["lam"] for d in runs}
    assert len(runs) == 2 and lams == {2.0, 10.0}
    # the plain command (λ = 10 by default) is the λ = 10 run of the sweep, never the λ = 2 one
    out = cli()
    assert "already finished" in out
    done = next(d for d in runs if d.name in out)
    assert json.loads((done / "summary.json").read_text())["config"]["conditioning"]["lam"] == 10.0


def test_run_lock_says_who_holds_it(tmp_path):
    a, b = RunLock(tmp_path / "smoke" / "x"), RunLock(tmp_path / "smoke" / "x")
    assert a.try_acquire()
    assert not b.try_acquire() and f"pid {os.getpid()} on " in b.holder()
    with pytest.raises(TimeoutError, match=r"still locked by pid \d+"):
        b.acquire(timeout_s=0.2)
    a.release()
    assert b.try_acquire()
    b.release()
    assert not (tmp_path / "smoke" / "x").exists()  # the lock lives beside the run dir, which it does not create


@pytest.mark.slow
def test_two_processes_on_one_run_train_it_once(tmp_path):
    """Two processes started together on one run: one trains, the other waits for it (naming it), then finds the
    run finished; every training row is written once."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-m", "condattn.train", *mini_listops(tmp_path, "run.name=shared", "task.steps=8")]
    procs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    waited = [i for i, (out, err) in enumerate(outs) if "already finished; nothing to do" in out]
    assert len(waited) == 1, outs
    other = procs[1 - waited[0]].pid
    assert f"is being trained by pid {other} on " in outs[waited[0]][1]
    steps = [r["step"] for r in RunRecord(tmp_path / "runs" / "smoke" / "shared").metrics_rows("train")]
    assert steps == sorted(set(steps)) and steps[-1] == 8  # every training row once


def test_one_rule_how_a_run_is_run_never_makes_another_run(tmp_path):
    """`identity.answers` is the one rule (a run dir, a twin, a kept record): threads, workers, logging and where runs
    go never make a new name, a twin miss or a refusal; a science key does; the code counts only when asked for
    (--refresh-stale). impl.threads changes the last bits as the CPU's instruction set does: recorded, not identity."""
    from omegaconf import OmegaConf

    from condattn.engine.identity import answers

    base = compose(["scale=smoke", "conditioning=spectral"])
    how, lam = base.copy(), base.copy()
    how.impl.threads, how.impl.num_workers, how.logger, how.paths.runs = 2, 3, "none", str(tmp_path)
    lam.conditioning.lam, lam.impl.threads = 2.0, 2
    assert variant(how, base) == "" and variant(lam, base) != ""
    recorded = OmegaConf.to_container(base, resolve=True)
    assert answers(how, recorded) is None
    assert answers(lam, recorded) == "conditioning.lam is 10.0 there and 2.0 here"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    OmegaConf.save(OmegaConf.create(recorded), run_dir / "config.yaml")  # resolved, as the trainer writes it
    assert config_mismatch(how, run_dir) is None  # was: "impl.threads is 1 there and 2 here", every cell refused
    assert "conditioning.lam is 10.0 there and 2.0 here" in config_mismatch(lam, run_dir)
    code = {"engine": "a" * 10, "conditioning": "b" * 10}
    assert answers(how, recorded, code, dict(code), same={}) is None
    assert answers(how, recorded, code, {**code, "engine": "c" * 10}, same={}) == \
        "made by other code (engine differ from this code's)"
    assert answers(how, recorded, None, {**code, "engine": "c" * 10}) is None  # not asked: any code answers
