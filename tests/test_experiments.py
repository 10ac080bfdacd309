"""Every cell of every experiment at every scale composes, passes the preflight, and builds its model.

As lightning-hydra-template composes each experiment config in its tests: a recipe edit that breaks a table at a
scale nobody ran today (paper scale, on a cluster, after hours in the queue) fails here, in seconds, on a CPU.
Paper-scale data is not here, so the data check may only report missing data, and it must name the path it read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from condattn.engine.preflight import _model_shapes, planned_world, preflight
from condattn.experiment import load
from condattn.launch import compose_cell
from condattn.reproduce import cells

EXPERIMENTS = sorted((Path(__file__).resolve().parent.parent / "experiments").glob("table*.yaml"))
CASES = [(p, scale) for p in EXPERIMENTS for scale in load(p).scales]


@pytest.fixture(scope="module")
def built_models() -> dict[str, int]:
    return {}  # one meta-device build per distinct model config across the whole module


@pytest.mark.parametrize("path, scale", CASES, ids=[f"{p.stem}-{s}" for p, s in CASES])
@pytest.mark.slow
def test_every_cell_composes_and_preflights(path, scale, tmp_path, monkeypatch, built_models):
    monkeypatch.setenv("CONDATTN_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CONDATTN_DATA", str(tmp_path / "no_data"))  # paper data: never this machine's copy
    exp = load(path)
    seeds = list(exp.at(scale).seeds)
    todo = cells(exp, scale, seeds, [])
    assert len({name for name, _ in todo}) == len(todo), "two cells share a run name"
    expected_rows = exp.at(scale).rows or list(exp.rows)
    pretrain = len(exp.methods) if exp.pretrain else 0
    assert len(todo) == pretrain + sum(len(exp.methods_of(r)) * len(exp.row_seeds(scale, r, seeds))
                                       for r in expected_rows)
    # Cells of one row and method differ only in `seed=` and `run.name=`: each distinct rest is composed and checked
    # once, with its first seed; the other seeds' names are checked against what the first one composed to.
    composed: dict[tuple[str, ...], str] = {}
    for name, overrides in todo:
        rest = tuple(o for o in overrides if not o.startswith(("seed=", "run.name=")))
        if rest in composed:
            seed = next(o for o in overrides if o.startswith("seed=")).split("=", 1)[1]
            assert name == composed[rest].rsplit("_s", 1)[0] + f"_s{seed}"
            continue
        composed[rest] = name
        cfg = compose_cell(overrides)
        assert cfg.run.name == name and cfg.scale.name == scale and cfg.run.table == exp.table
        # only missing data may be reported (paper and medium scale: the data is not here), naming where it looked
        for p in preflight(cfg, planned_world(cfg), check_data=True, check_run_dir=False):
            assert p.kind == "data" and scale in ("paper", "medium"), f"{name}: {p.kind}: {p.message}"
            assert str(tmp_path) in p.message or "run" in p.message or "cache" in p.message, p.message
        model = OmegaConf.to_container(cfg.model, resolve=True)
        # earlier runs' weights and DETR's torchvision file: checked by the preflight above
        for weights in ("init_from", "backbone_checkpoint", "backbone_weights"):
            model.pop(weights, None)
        for flag in ("pretrained", "use_pretrained_backbone"):  # timm's cached weights: likewise
            if flag in model:
                model[flag] = False
        key = json.dumps(model, sort_keys=True, default=str)
        if key not in built_models:  # the model builds (on the meta device: no memory, no weights)
            built_models[key] = len(_model_shapes(OmegaConf.create({"model": model})))
            assert built_models[key] > 0


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
@pytest.mark.slow
def test_make_target_runs_reproduce_once(path):
    """`make reproduce-table-N` is one `condattn.reproduce` call on the experiment (its renderer writes the table)."""
    import re
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    n = re.match(r"table(\d+)_", path.name).group(1)
    root = path.parent.parent
    out = subprocess.run(["make", "-n", f"reproduce-table-{n}", "SCALE=smoke"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    calls = [line for line in out.splitlines() if "python" in line]
    assert len(calls) == 1 and f"-m condattn.reproduce experiments/{path.name}" in calls[0], out
