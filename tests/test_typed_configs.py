"""The typed views of impl / optim / task (condattn/utils/typed_config.py) hold the YAML's defaults, and every key a
recipe sets in those groups is one the views declare."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from condattn.config import compose
from condattn.utils.typed_config import (
    TASK_REQUIRED,
    ImplConfig,
    OptimConfig,
    TaskConfig,
    impl_config,
    optim_config,
    task_config,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TASKS = sorted((CONFIGS / "task").glob("*.yaml"))


def defaults(cls) -> dict:
    out = {}
    for f in fields(cls):
        out[f.name] = f.default_factory() if f.default is MISSING else f.default
    return out


def plain(v):
    return list(v) if isinstance(v, tuple) else v


@pytest.mark.parametrize("cls, path", [(ImplConfig, "impl/default.yaml"), (OptimConfig, "optim/adamw.yaml")])
def test_the_yaml_defaults_are_the_code_defaults(cls, path):
    yaml = OmegaConf.to_container(OmegaConf.load(CONFIGS / path))
    code = defaults(cls)
    assert set(yaml) <= set(code), f"{path} keys the typed view does not declare: {sorted(set(yaml) - set(code))}"
    assert {k: plain(code[k]) for k in yaml} == yaml
    if cls is ImplConfig:  # impl/default.yaml is the whole group
        assert set(yaml) == set(code)


@pytest.mark.slow
def test_the_task_base_is_what_every_recipe_sets_and_recipe_keys_are_declared():
    """Every composed task recipe sets the TASK_REQUIRED keys (the base, no code default); the optim and impl keys any
    recipe sets are keys the typed views declare (so a key read in code has one default, here)."""
    optim, impl = {f.name for f in fields(OptimConfig)}, {f.name for f in fields(ImplConfig)}
    shared = None
    for path in TASKS:
        cfg = OmegaConf.to_container(compose([f"task={path.stem}"]), resolve=False)
        keys = set(cfg["task"])
        shared = keys if shared is None else shared & keys
        assert set(TASK_REQUIRED) <= keys, (path.name, set(TASK_REQUIRED) - keys)
        assert set(cfg["optim"]) <= optim, (path.name, set(cfg["optim"]) - optim)
        assert set(cfg["impl"]) <= impl, (path.name, set(cfg["impl"]) - impl)
    assert shared == set(TASK_REQUIRED)
    assert all(defaults(TaskConfig)[k] is None for k in TASK_REQUIRED)


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_a_composed_recipe_reads_the_same_through_the_views(path):
    cfg = compose([f"task={path.stem}", "scale=smoke"])
    for node, view in ((cfg.impl, impl_config(cfg.impl)), (cfg.optim, optim_config(cfg.optim)),
                       (cfg.task, task_config(cfg.task))):
        for f in fields(view):
            if f.name in node and node[f.name] is not None:  # a value the YAML sets is the value read
                assert getattr(view, f.name) == node[f.name], (path.stem, f.name)


def test_absent_and_null_keys_take_the_default_and_views_read_objects_too():
    from types import SimpleNamespace

    assert optim_config({"gamma": None}).gamma == 0.1 and optim_config({}).anneal == "linear"
    assert task_config(SimpleNamespace(save_best=False)).save_best is False
    assert task_config({}).mlm_probability == 0.25 and impl_config({"flush_denormal": None}).flush_denormal is True
    view = impl_config({"threads": 3})
    assert impl_config(view) is view and view.threads == 3
