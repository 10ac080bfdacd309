"""Run names: the protocol's variants say what they are in words (`-lr2x` for an lr-grid multiplier, `-steps2x` for
the length check), and a run with overrides the words do not say (ARGS=) appends `-<8 hex>` of its science config;
every name parses back to its RunId, and `compare` tags the seed with its variant."""

from __future__ import annotations

from pathlib import Path

import pytest

from condattn.compare import _seed_tag
from condattn.engine.identity import config_hash, science_config
from condattn.runs import RunId, RunSummary, variant_of

REPO = Path(__file__).resolve().parents[1]


def test_variant_words():
    assert variant_of() == ""
    assert [variant_of(m) for m in (2, 0.5, 0.25, 8, 0.125)] == ["lr2x", "lr0.5x", "lr0.25x", "lr8x", "lr0.125x"]
    assert variant_of(steps=2) == "steps2x" and variant_of(2, 2) == "lr2x-steps2x"
    assert variant_of(0.5, 2, "1a2b3c4d") == "lr0.5x-steps2x-1a2b3c4d" and variant_of(digest="1a2b3c4d") == "1a2b3c4d"


@pytest.mark.parametrize("variant", ["", "lr2x", "lr0.125x", "steps2x", "lr0.5x-steps2x", "1a2b3c4d",
                                     "lr2x-1a2b3c4d", "lr2x-steps2x-1a2b3c4d"])
def test_every_variant_parses_back(variant):
    run = RunId("table1_imagenet", "vit_base", "spectral+embedded", "small", 100, variant)
    assert run.name == "table1_imagenet_vit_base_spectral+embedded_small_s100" + (f"-{variant}" if variant else "")
    assert RunId.parse(run.name, run.table, ["vit_base"], ["embedded", "spectral+embedded"], "small") == run
    summary = {"table": run.table, "row": run.row, "method": run.method, "scale": "small", "seed": 100,
               "run_name": run.name}
    assert RunSummary.from_dict(summary).run_id == run
    assert _seed_tag(Path("runs/small") / run.name) == "s100" + (f"-{variant}" if variant else "")


def test_names_that_are_no_variant_do_not_parse():
    for tail in ("-lr2", "-2x", "-steps2x-lr2x", "-1a2b3c4", "-lr2x-"):
        assert RunId.parse(f"t_r_m_small_s0{tail}", "t", ["r"], ["m"], "small") is None


@pytest.mark.slow  # composes 5 configs
def test_grid_length_and_ad_hoc_cells_are_named_in_words_then_by_hash(tmp_path):
    from omegaconf import OmegaConf

    from condattn.engine.twins import TwinIndex
    from condattn.experiment import load
    from condattn.runs import RunRecord
    from condattn.table.cells import parts
    from condattn.table.compose import Composer, named
    from condattn.table.lr_grid import lr_override, lr_variant

    exp = load(REPO / "experiments" / "table4_lra.yaml")
    cells = {p.method: p for p in parts(exp, "smoke", [0]) if p.row == "listops"}
    sca, base = cells["spectral"], cells["none"]
    comp = Composer()
    lr = float(comp.base(sca.own).optim.lr)

    spec, v = named(comp, sca, [], {}, *lr_variant(lr, 2))  # an lr-grid cell
    assert (v, spec.name, spec.cfg.run.name) == ("lr2x", f"{sca.name}-lr2x", f"{sca.name}-lr2x")
    assert float(spec.cfg.optim.lr) == pytest.approx(2 * lr)
    assert named(comp, sca, [], {}, *lr_variant(lr, 1)) [1] == ""  # ×1 is the row's own cell
    steps = int(spec.cfg.task.steps)
    long, v = named(comp, sca, [], {}, (lr_override(2 * lr), f"task.steps={2 * steps}"), variant_of(2, 2))
    assert v == "lr2x-steps2x" and int(long.cfg.task.steps) == 2 * steps

    # the user's own overrides: the hash of the whole science config after the words, or alone
    lam, v = named(comp, sca, ["conditioning.lam=2"], {}, *lr_variant(lr, 2))
    assert v == f"lr2x-{config_hash(science_config(lam.cfg))}" and float(lam.cfg.optim.lr) == pytest.approx(2 * lr)
    plain, v = named(comp, sca, ["conditioning.lam=2"], {})
    assert v == config_hash(science_config(plain.cfg)) and RunId.parse(
        plain.name, exp.table, list(exp.rows), list(exp.methods), "smoke").variant == v
    # an override that changes nothing (λ on the baseline) keeps the words alone
    assert named(comp, base, ["conditioning.lam=2"], {}, *lr_variant(lr, 2))[1] == "lr2x"

    # a user's local run of the lr-grid cell under its old hash name is still this cell's twin
    old = tmp_path / "smoke" / f"{sca.name}-{config_hash(science_config(spec.cfg))}"
    old.mkdir(parents=True)
    OmegaConf.save(spec.cfg, old / "config.yaml", resolve=True)  # as the trainer writes it
    RunRecord(old).write_summary({"status": "finished", "metrics": {"val_acc": 0.5}})
    assert TwinIndex(tmp_path / "smoke").find(spec.cfg, tmp_path / "smoke" / spec.name) == old
