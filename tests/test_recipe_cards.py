"""Every paper-scale cell of every experiment resolves to the official values of its recipe card
(configs/recipe_cards.yaml), and the check notices a change of any listed value."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from condattn.experiment import load
from condattn.launch import compose_cell
from condattn.reporting.notes import LR_KEY, card_mismatches, load_cards, table_notes
from condattn.reproduce import cells

EXPERIMENTS = sorted((Path(__file__).resolve().parent.parent / "experiments").glob("table*.yaml"))
PAPER = [p for p in EXPERIMENTS if "paper" in load(p).scales]


def paper_cells(path: Path) -> list[tuple[str, list[str]]]:
    """One cell per row × method (seeds differ only in `seed=`/`run.name=`)."""
    exp = load(path)
    seen, out = set(), []
    for name, overrides in cells(exp, "paper", list(exp.at("paper").seeds)[:1], []):
        rest = tuple(o for o in overrides if not o.startswith(("seed=", "run.name=")))
        if rest not in seen:
            seen.add(rest)
            out.append((name, overrides))
    return out


@pytest.fixture(autouse=True)
def _no_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDATTN_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CONDATTN_DATA", str(tmp_path / "data"))


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
@pytest.mark.slow
def test_every_paper_cell_matches_its_card(path):
    cards = load_cards()
    problems = []
    for name, overrides in paper_cells(path):
        cfg = compose_cell(overrides)
        card = cards.get(str(cfg.task.name))
        if card is None:
            problems.append(f"{name}: no recipe card for task {cfg.task.name!r} in configs/recipe_cards.yaml")
            continue
        problems += [f"{name}: {m}" for m in card_mismatches(cfg, card)]
    assert not problems, "\n".join(problems)


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "_changed"
    if isinstance(value, list):
        return [*value, "changed"]
    return 1  # None


def _cards_with_a_cell() -> list[tuple[str, list[str]]]:
    """(task, overrides of one paper cell) for every task a paper-scale row (or pretraining stage) runs."""
    out: dict[str, list[str]] = {}
    for path in PAPER:
        exp = load(path)
        own = {**{r: spec.overrides for r, spec in exp.rows.items()}, "pretrain": exp.pretrain.overrides if exp.pretrain
               else ()}
        for _, overrides in paper_cells(path):
            row = next(o.split("=", 1)[1] for o in overrides if o.startswith("run.row="))
            task = next((o.split("=", 1)[1] for o in own[row] if o.startswith("task=")), None)
            if task:
                out.setdefault(task, overrides)
    return sorted(out.items())


@pytest.mark.parametrize("task, overrides", _cards_with_a_cell(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.slow
def test_changing_any_listed_value_fails(task, overrides):
    """Mutation check: each listed value changed in the resolved config is reported (so a recipe edit that moves a
    paper value away from its source fails the test above)."""
    cfg = compose_cell(overrides)
    card = load_cards()[str(cfg.task.name)]
    assert card_mismatches(cfg, card) == []
    for key in card["values"]:
        bad = copy.deepcopy(cfg)
        OmegaConf.set_readonly(bad, False)
        OmegaConf.set_struct(bad, False)
        target = "optim.lr" if key == LR_KEY else key
        OmegaConf.update(bad, target, _changed(OmegaConf.select(bad, target)), merge=False)
        found = card_mismatches(bad, card)
        assert any(m.startswith(f"{key}:") for m in found), f"{task}: changing {target} went unnoticed"


def test_card_file_is_well_formed_and_every_card_is_used():
    cards = load_cards()
    used = {task for task, _ in _cards_with_a_cell()}
    for task, card in cards.items():
        assert card.get("source"), f"{task}: a card names its source"
        assert card.get("values"), f"{task}: a card lists values"
        for key, (_, source) in card["values"].items():
            assert isinstance(source, str) and source, f"{task}.{key}: each value names its source"
    assert used == set(cards)


@pytest.mark.slow
def test_paper_table_prints_the_differences():
    exp = load(next(p for p in PAPER if p.stem == "table4_lra"))
    lines = table_notes(exp, "paper", list(exp.rows))
    text = "\n".join(lines)
    assert "Deliberate differences" in text and "listops (lra_listops)" in text and "Mean pooling" in text
    assert not [n for n in table_notes(exp, "smoke", list(exp.rows)) if "Deliberate differences" in n]
    t1 = load(next(p for p in PAPER if p.stem == "table1_imagenet"))
    assert any("same run twice" in line for line in table_notes(t1, "smoke", list(t1.rows)))


@pytest.mark.slow
def test_a_note_about_rows_or_scales_prints_only_where_they_apply():
    t1 = load(next(p for p in PAPER if p.stem == "table1_imagenet"))
    exp = replace(t1, free={**t1.free, "notes": [{"rows": ["vit_base", "deit_base"], "text": "same run\n twice"},
                                                 {"scales": ["small"], "text": "left out"}, "always"]})
    smoke = table_notes(exp, "smoke", ["vit_base", "deit_base"])
    assert smoke[1:3] == ["Note: same run twice", "Note: always"] and not any("left out" in n for n in smoke)
    small = table_notes(exp, "small", ["vit_base", "swin_base"])
    assert "Note: left out" in small and "Note: always" in small and not any("same run" in n for n in small)
    exp = replace(t1, free={**t1.free, "notes": [{"rows": ["vit_bsae"], "text": "x"}]})  # a misspelt row: hidden
    with pytest.raises(ValueError, match="rows 'vit_bsae'"):
        table_notes(exp, "small", ["vit_base"])
