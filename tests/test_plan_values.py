"""Planning hands back values: a `RunSpec` is frozen (renaming it or adding its preflight gives a new one), the plan's
helpers return what they found instead of filling dicts they are given, and `plan()` changes nothing passed to it."""

from __future__ import annotations

import copy
import dataclasses
from types import MappingProxyType

import pytest
from omegaconf import OmegaConf

from condattn.launch import RunSpec
from condattn.table.cells import Part
from condattn.table.compose import named


def _spec(name: str = "t_r_none_smoke_s0") -> RunSpec:
    cfg = OmegaConf.create({"run": {"name": name, "dir": "runs/smoke/${run.name}"}})
    return RunSpec(name, [f"run.name={name}", "seed=0"], cfg)


def test_a_run_spec_is_frozen_and_renaming_it_gives_a_new_one():
    spec = _spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.checked = object()  # type: ignore[misc]
    assert spec.overrides == ("run.name=t_r_none_smoke_s0", "seed=0")  # a list given is kept as a tuple
    new = spec.renamed("t_r_none_smoke_s0-lr2x")
    assert (new.name, new.cfg.run.name, str(new.run_dir)) == ("t_r_none_smoke_s0-lr2x",) * 2 + (
        "runs/smoke/t_r_none_smoke_s0-lr2x",)
    assert new.overrides == ("run.name=t_r_none_smoke_s0-lr2x", "seed=0")
    # the original is untouched: its name, overrides and config
    assert (spec.name, spec.cfg.run.name, spec.overrides[0]) == ("t_r_none_smoke_s0",) * 2 + (
        "run.name=t_r_none_smoke_s0",)
    checked = object()
    with_check = spec.checked_by(checked)
    assert with_check.checked is checked and spec.checked is None and with_check.cfg is spec.cfg


class _Composer:
    """compose.Composer's `cell` without Hydra: the cell's config holds its run name (and run dir after it)."""

    errors: dict = {}

    def cell(self, name: str, overrides: list[str]) -> RunSpec:
        cfg = OmegaConf.create({"run": {"name": name, "dir": "runs/smoke/${run.name}"},
                                "model": {"init_from": next((o.split("=", 1)[1] for o in overrides
                                                             if o.startswith("model.init_from=")), None)}})
        return RunSpec(name, overrides, cfg)


def test_named_returns_the_variant_and_fills_no_dict_it_is_given():
    part = Part("t_r_none_smoke_s0", ["run.name=t_r_none_smoke_s0", "model.init_from=t_pre"], "r", "none", 0)
    renamed = MappingProxyType({"t_pre": "t_pre-lr2x"})  # read-only: a write would raise
    spec, v = named(_Composer(), part, [], renamed, ("optim.lr=0.002",), "lr2x")
    assert v == "lr2x" and spec.name == spec.cfg.run.name == "t_r_none_smoke_s0-lr2x"
    assert spec.cfg.model.init_from == "t_pre-lr2x"  # the renamed pretraining run is followed
    assert "run.name=t_r_none_smoke_s0-lr2x" in spec.overrides and dict(renamed) == {"t_pre": "t_pre-lr2x"}
    plain, v = named(_Composer(), part, [], renamed)  # no protocol, no extra: the readable name
    assert v == "" and plain.name == part.name


@pytest.mark.slow  # composes 3 configs (about 3 s on a loaded core)
def test_plan_returns_a_frozen_plan_and_changes_nothing_passed_to_it(tmp_path):
    from test_reproduce import listops_only

    from condattn.experiment import load
    from condattn.table.plan import plan

    exp = load(listops_only(tmp_path))
    seeds, extra = [0], [f"paths.runs={tmp_path / 'runs'}", "logger=none"]
    before = copy.deepcopy((exp, seeds, extra))
    p = plan(exp, "smoke", seeds, extra)
    assert (exp, seeds, extra) == before
    assert [c.name for c in p.cells] == [f"table4_lra_listops_{m}_smoke_s0" for m in exp.methods]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cells[0].name = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.stem = "x"  # type: ignore[misc]
    # a second plan of the same inputs: the same cells (nothing carried over from the first)
    assert [c.name for c in plan(exp, "smoke", seeds, extra).cells] == [c.name for c in p.cells]
