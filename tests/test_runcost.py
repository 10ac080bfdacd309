"""A run's CPU split by cause (condattn/engine/runcost.py): the remainder, the projection to more steps, the table,
and which cause each part's hook is charged to by the loop."""

import time

import pytest

from condattn.engine import runcost
from condattn.engine.loop import StepLoop
from condattn.engine.runcost import CpuLedger


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_split_adds_the_unexplained_remainder_to_other_and_gives_the_training_share():
    s = runcost.split({"train": 9.0, "startup": 0.5}, total=10.0, steps=90, evals=1, checkpoints=1)
    assert s["seconds"]["other"] == 0.5 and s["total_s"] == 10.0 and s["train_share"] == 0.9
    assert set(s["seconds"]) == {"train", *runcost.CAUSES}
    assert runcost.split({}, total=0.0)["train_share"] is None


def test_events_count_every_interval_and_the_last_step():
    assert runcost.events(300, 100) == 3
    assert runcost.events(301, 100) == 4  # and the last step
    assert runcost.events(50, 100) == 1
    assert runcost.events(10, 0) == 1


def test_projection_scales_training_evaluation_and_checkpoints_and_keeps_fixed_costs():
    measured = runcost.split({"train": 30.0, "startup": 8.0, "data": 2.0, "eval": 0.8, "test": 1.0,
                              "checkpoint": 0.2}, total=42.0, steps=300, evals=4, checkpoints=1)
    p = runcost.project(measured, 2000, eval_every=100, checkpoint_every=500)
    assert p["steps"] == 2000 and p["evals"] == 20 and p["checkpoints"] == 4
    assert p["seconds"]["train"] == pytest.approx(200.0)
    assert p["seconds"]["eval"] == pytest.approx(0.2 * 20)
    assert p["seconds"]["checkpoint"] == pytest.approx(0.2 * 4)
    for fixed in ("startup", "data", "test"):
        assert p["seconds"][fixed] == measured["seconds"][fixed]
    assert p["train_share"] == pytest.approx(200.0 / p["total_s"], abs=1e-4)


def test_render_prints_one_row_per_split_with_every_cause():
    s = runcost.split({"train": 9.0, "data": 1.0}, total=10.0, steps=90)
    md = runcost.render([("vit", s)])
    assert "| vit | 90 | 10.0 | 90.0 % | 9.0 | 0.0 | 1.0 |" in md
    assert all(runcost.LABELS[c] in md for c in runcost.CAUSES)


def test_ledger_charges_cpu_time_not_wall_time():
    ledger = CpuLedger(time.process_time())
    with ledger.charge("eval"):
        time.sleep(0.2)  # waiting is no CPU
    with ledger.charge("test"):
        _spin(0.05)
    assert ledger.spent["eval"] < 0.05 <= ledger.spent["test"]
    assert ledger.close()["total_s"] >= 0.05


class Diagnostics:  # named as the loop's parts are: the ledger maps (class name, hook) to a cause
    def after_backward(self, loop):
        _spin(0.02)


class Divergence:
    def after_backward(self, loop):
        _spin(0.02)


class Progress:
    def after_step(self, loop):
        _spin(0.02)


class BestModel:
    def after_step(self, loop):
        _spin(0.02)


def _loop(schedule) -> StepLoop:
    loop = object.__new__(StepLoop)  # the hook dispatch alone, without a run
    loop.schedule, loop.cpu, loop._in_step, loop._cpu_out = schedule, CpuLedger(time.process_time()), False, 0.0
    return loop


def test_hooks_are_charged_to_their_cause_and_kept_out_of_the_step():
    loop = _loop({"after_backward": [Divergence(), Diagnostics()], "after_step": [Progress(), BestModel()]})
    loop._in_step = True
    loop._hooks("after_backward")  # step 0's gradient norms: step-0 diagnostics, not training
    assert loop.cpu.spent["step0"] >= 0.02 and loop._cpu_out == loop.cpu.spent["step0"]
    assert loop.cpu.spent["train"] == 0.0  # the divergence check stays in the step's own CPU (counted by the step)
    loop._in_step = False
    loop._hooks("after_step")
    assert loop.cpu.spent["eval"] >= 0.02 and loop.cpu.spent["other"] >= 0.02


# ---------------------------------------------------------------- compile only past the measured break-even
def test_break_even_is_the_compile_cost_over_what_each_step_saves():
    from condattn.engine.precision import break_even_steps

    assert break_even_steps(150.0, 0.050, 0.040) == pytest.approx(15000)
    assert break_even_steps(150.0, 0.040, 0.040) is None  # a compiled step saves nothing: never
    assert break_even_steps(150.0, 0.040, 0.050) is None


def test_auto_compiles_only_runs_at_or_past_the_break_even_and_says_why():
    from condattn.engine.precision import resolve_execution

    cost = {"compile_s": 100.0, "eager_step_s": 0.05, "compiled_step_s": 0.04}  # break-even: 10,000 steps
    impl = {"cpu_compile": "auto", "compile_cost": {"vit_tiny_32": cost}}
    short = resolve_execution(impl, "cpu", steps=2000, model="vit_tiny_32")
    long = resolve_execution(impl, "cpu", steps=10000, model="vit_tiny_32")
    unmeasured = resolve_execution(impl, "cpu", steps=10**6, model="gpt2_tiny")
    assert not short.compile and "2000 steps < the break-even 10000" in short.compile_reason
    assert long.compile and long.compile_mode == "default" and "compiled" in long.compile_reason
    assert not unmeasured.compile and "no measured compile cost" in unmeasured.compile_reason
    assert "compile_reason" in long.to_dict()  # recorded in summary.json's execution
    forced = resolve_execution({"cpu_compile": True}, "cpu")
    assert forced.compile and forced.compile_reason == "impl.cpu_compile=true"
    assert not resolve_execution({}, "cpu").compile  # the default stays eager


def test_the_compile_cost_bench_reads_steps_from_the_longer_runs_and_the_compile_from_the_fixed_cost():
    """Constructed runs: eager 0.10 s a step, 20 s fixed; compiled 0.08 s a step, 20 + 30 s fixed (its compile)."""
    from condattn.bench import compile_cost_from
    from condattn.engine.precision import break_even_steps

    def run(step_s: float, fixed: float, n: int) -> dict:
        return {"process_tree_s": fixed + step_s * n, "measured": {"seconds": {"train": step_s * n + 1.0}}}

    runs = {("false", 300): run(0.10, 20, 300), ("false", 600): run(0.10, 20, 600),
            ("true", 300): run(0.08, 50, 300), ("true", 600): run(0.08, 50, 600)}
    cost = compile_cost_from(runs, 300)
    assert cost == {"compile_s": 30.0, "eager_step_s": 0.1, "compiled_step_s": 0.08}
    assert break_even_steps(**cost) == pytest.approx(1500)


def test_a_bad_compile_value_is_refused_with_the_choices():
    from condattn.engine.precision import execution_problems

    assert any("choose true, false or auto" in p for p in execution_problems({"cpu_compile": "sometimes"}))


@pytest.mark.slow  # (torch.compile's import: seconds)
def test_compiling_wraps_the_module_leaving_it_eager_and_keeps_the_cache(tmp_path, monkeypatch):
    import os

    import torch

    from condattn.engine.precision import compile_model, resolve_execution

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    model = torch.nn.Linear(2, 2)
    compiled = compile_model(model, resolve_execution({"cpu_compile": True}, "cpu"), tmp_path / "torch_compile")
    assert compiled is not model and compiled._orig_mod is model  # (nothing is compiled before its first call)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "torch_compile")
    assert compile_model(model, resolve_execution({}, "cpu"), tmp_path) is model
    # inductor writes its default into the environment once anything asks for its cache: that is not the user's
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    cache_dir()
    compile_model(model, resolve_execution({"cpu_compile": True}, "cpu"), tmp_path / "here")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "here")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))  # a user's own is kept
    compile_model(model, resolve_execution({"cpu_compile": True}, "cpu"), tmp_path / "here")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users")
    # what the diagnostics read (Run.eager): the module, so they compile no graph of their own; eager runs: itself
    from types import SimpleNamespace

    from condattn.engine.setup import Run

    assert Run.eager.fget(SimpleNamespace(raw=compiled)) is model
    assert Run.eager.fget(SimpleNamespace(raw=model)) is model
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # (process-wide: other tests may have compiled)
    Run.eager.fget(SimpleNamespace(raw=compiled))(torch.ones(1, 2))  # a forward through it compiles nothing
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


# ---------------------------------------------------------------- the dry run's projection: fixed cost per run + steps
def test_a_runs_cost_is_its_fixed_cpu_per_run_and_its_cpu_per_step():
    from condattn.engine.cost import run_cost

    split = runcost.split({"train": 90.0, "eval": 6.0, "checkpoint": 0.0, "startup": 6.0, "data": 1.0, "test": 1.0},
                          total=104.0, steps=2000)
    per_step, fixed = run_cost({"steps": 2000, "wall_time_s": 500.0, "performance": {"cpu_split": split}})
    assert per_step == pytest.approx(96.0 / 2000) and fixed == pytest.approx(8.0)
    assert run_cost({"steps": 100, "wall_time_s": 50.0}) == (0.5, 0.0)  # recorded before the split: wall / steps
    assert run_cost({"steps": 100, "wall_time_s": 50.0, "train_time_s": 40.0}) == (0.4, 10.0)  # its training clock
    assert run_cost({"steps": 0}) is None


def test_the_dry_run_adds_the_measured_fixed_cost_once_per_run(tmp_path, monkeypatch):
    import torch
    from omegaconf import OmegaConf

    from condattn.engine.cost import machine_projection, measured_steps
    from condattn.runs import KeptRecord

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = {"model": {"name": "m"}, "data": {"name": "d"}, "conditioning": {"method": "none"}}
    split = runcost.split({"train": 100.0, "startup": 20.0}, total=120.0, steps=1000)
    KeptRecord.of(tmp_path, "a").write({"summary.json": {
        "status": "finished", "metrics": {}, "steps": 1000, "wall_time_s": 999.0, "config": config,
        "performance": {"cpu_split": split}, "hardware": {"device_type": "cpu"}, "hardware_line": "1 × cpu"}})
    per_step, fixed, _ = measured_steps([tmp_path], "cpu")[("m", "d", "none")]
    assert (per_step, fixed) == (pytest.approx(0.1), pytest.approx(20.0))
    cells = [(n, OmegaConf.create({**config, "task": {"steps": 35800}})) for n in ("x", "y")]
    assert "≈ 2.00 h for 2 of 2 cells" in machine_projection(cells, [tmp_path])  # 2 × (20 s + 35,800 × 0.1 s)
