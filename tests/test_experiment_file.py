"""The typed experiment file (condattn/experiment.py): every experiment parses; a typo in any key it types is refused
in one line naming the key and the nearest valid one; an empty, malformed or ill-typed file gets one line too."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
import yaml
from helpers import parsed

from condattn.experiment import FREE, ExperimentError, load, parse

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))


def typo(key: str) -> str:
    """One deleted letter, as `higer_is_better` for `higher_is_better`."""
    i = max(1, len(key) // 2)
    return key[:i] + key[i + 1:]


def key_paths(raw: dict) -> list[tuple[str, ...]]:
    """Every typed key of a document: top level, each row's, each scale's (free-form paper keys excluded)."""
    out = [(k,) for k in raw if k not in FREE]
    out += [("rows", r, k) for r, spec in raw["rows"].items() for k in spec]
    out += [("scales", s, k) for s, spec in raw["scales"].items() for k in (spec or {})]
    return out


def rename(raw: dict, path: tuple[str, ...]) -> tuple[dict, str]:
    doc = copy.deepcopy(raw)
    node = doc
    for part in path[:-1]:
        node = node[part]
    new = typo(path[-1])
    node[new] = node.pop(path[-1])
    return doc, new


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_parses_and_every_key_typo_is_refused_in_one_line(path):
    exp = load(path)
    assert exp.table == path.stem and exp.rows and exp.scales
    raw = yaml.safe_load(path.read_text())
    paths = key_paths(raw)
    assert len(paths) >= 8
    for p in paths:
        doc, bad = rename(raw, p)
        with pytest.raises(ExperimentError) as err:
            parse(doc, str(path))
        msg = str(err.value)
        assert "\n" not in msg and f"unknown key {bad!r}" in msg, (p, msg)
        assert f"did you mean {p[-1]!r}" in msg, (p, msg)


def test_the_issue_s_typo_and_bad_values_are_refused():
    raw = yaml.safe_load(EXPERIMENTS[4].read_text())  # table 5: a loss, lower is better
    assert load(EXPERIMENTS[4]).higher_is_better is False
    raw["higer_is_better"] = raw.pop("higher_is_better")
    with pytest.raises(ExperimentError, match="unknown key 'higer_is_better'; did you mean 'higher_is_better'"):
        parse(raw, "t5")
    for doc, match in ((None, "empty or not a mapping"), ({}, "empty"), ([1, 2], "not a mapping"),
                       ({"table": "t", "metric": "m", "methods": ["none"], "rows": {"r": {}}}, "missing key 'scales'"),
                       ({"table": "t", "metric": "m", "methods": ["none"], "rows": {"r": {"hypothesis": "main"}},
                         "scales": {"smoke": {"seeds": [0]}}}, "hypothesis: 'main'; use one of primary, exploratory"),
                       ({"table": "t", "metric": "m", "methods": ["none"], "rows": {"r": {"method": "sca"}},
                         "scales": {"smoke": {"seeds": [0]}}}, "method: 'sca' is not among"),
                       ({"table": "t", "metric": "m", "methods": ["none"], "rows": {"r": {}},
                         "scales": {"smoke": {"seeds": [0], "rows": ["q"]}}}, "names 'q', not a row"),
                       ({"table": "t", "metric": "m", "methods": ["none"], "rows": {"r": {}},
                         "scales": {"smoke": {"seeds": ["zero"]}}}, "'zero' is not a int")):
        with pytest.raises(ExperimentError, match=match):
            parse(doc, "x")


def test_an_empty_or_broken_file_is_one_line(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ExperimentError, match="empty"):
        load(tmp_path / "empty.yaml")
    (tmp_path / "broken.yaml").write_text("table: t\nrows: [a\n")
    with pytest.raises(ExperimentError, match=r"not valid YAML \(line 3\)") as err:
        load(tmp_path / "broken.yaml")
    assert "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="known experiments: broken, empty"):
        load(tmp_path / "nope.yaml")


def test_cell_overrides_are_one_recipe_for_reproduce_and_the_floors():
    from condattn.floors.features import groups
    from condattn.reproduce import parts

    exp = load(EXPERIMENTS[8])  # table 9
    (part,) = [p for p in parts(exp, "smoke", [0]) if p.row == "listops_baseline"]
    cell = exp.cell_overrides("listops_baseline", "none", "smoke", 0)
    assert part.own[:len(cell)] == cell and "task.steps=40" in cell
    assert groups(exp, "smoke")["listops"][1] == cell


UNTYPED = re.compile(r"\b(dict|Mapping)\b")


def untyped_experiment_args(source: str, where: str) -> list[str]:
    """"<where>:function" of each def whose `exp`, `experiment` or `spec` argument is annotated as a dict or Mapping."""
    out = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.arg in ("exp", "experiment", "spec") and arg.annotation is not None and \
                        UNTYPED.search(ast.unparse(arg.annotation)):
                    out.append(f"{where}:{node.name}")
    return out


def test_planning_and_rendering_pass_the_typed_experiment_not_a_mapping():
    """The typed Experiment and the frozen Plan are what planning and rendering pass: no def of condattn takes the
    experiment as a plain mapping."""
    assert untyped_experiment_args("def f(exp: dict, spec: Mapping[str, Any] | None): ...", "m") == ["m:f", "m:f"]
    assert untyped_experiment_args("def f(exp: Experiment, row: dict): ...", "m") == []
    package = Path(__file__).resolve().parents[1] / "condattn"
    found = [f for path in sorted(package.rglob("*.py"))
             for f in untyped_experiment_args(path.read_text(), str(path.relative_to(package.parent)))]
    assert found == []


def test_the_rules_read_per_row_and_scale_are_the_experiments_methods():
    exp = load(EXPERIMENTS[8])  # table 9: rows that each train one method on one task
    assert exp.families("smoke")["vit"][0] == ("vit_baseline", "none") and exp.pick_key("vit_sca10", "spectral") == \
        "vit_sca10"
    explore = next(r for r in exp.rows if exp.hypothesis(r) == "exploratory")
    assert exp.at("small").exploratory_seeds == 5
    assert exp.row_seeds("small", explore, list(range(10))) == [0, 1, 2, 3, 4]
    assert exp.row_seeds("small", "vit_baseline", list(range(10))) == list(range(10))
    t4 = load(EXPERIMENTS[3])  # table 4: every row trains every method, each method picks its own lr
    assert t4.pick_key("listops", "spectral") == "listops/spectral" and t4.methods_of("listops") == list(t4.methods)
    assert t4.row_metric("small", "listops") == t4.row_metric(None) == "test_acc"
    assert exp.row_metric("small", "vit_baseline") == "final_test_acc"  # the row's `metrics: {small: ...}`
    assert load(EXPERIMENTS[4]).higher_is_better_for("gpt2") is False  # table 5: a loss
    with pytest.raises(ExperimentError, match="scale 'huge' is not defined in .*choose one of smoke"):
        t4.at("huge")


def test_a_family_that_needs_more_seeds_reports_them_and_a_named_seed_list_is_run_as_named():
    base = {"table": "t", "metric": "m", "methods": ["none", "spectral"],
            "rows": {"hard": {}, "easy": {}},
            "scales": {"small": {"seeds": [0, 1, 2], "family_seeds": {"hard": 5}}}}
    exp = parse(copy.deepcopy(base), "x")
    assert exp.row_seeds("small", "hard", [0, 1, 2]) == [0, 1, 2, 3, 4]  # the scale's seeds, continued
    assert exp.row_seeds("small", "easy", [0, 1, 2]) == [0, 1, 2]
    assert exp.row_seeds("small", "hard", [7, 8]) == [7, 8]  # --seeds 7 8: as named
    readings = {"table": "t9", "metric": "m", "methods": ["none", "spectral"],
                "rows": {"vit_hard_baseline": {"task": "vit_hard", "method": "none"},
                         "vit_hard_sca": {"task": "vit_hard", "method": "spectral"},
                         "vit_hard_lam": {"task": "vit_hard", "method": "spectral", "hypothesis": "exploratory"},
                         "vit_baseline": {"task": "vit", "method": "none"}},
                "scales": {"small": {"seeds": [0, 1, 2, 3], "exploratory_seeds": 2,
                                     "family_seeds": {"vit_hard": 6}}}}
    t9 = parse(readings, "t9")
    assert t9.family_of("vit_hard_sca") == "vit_hard" and set(t9.families("small")) == {"vit_hard", "vit"}
    assert t9.row_seeds("small", "vit_hard_sca", [0, 1, 2, 3]) == list(range(6))
    assert t9.row_seeds("small", "vit_hard_baseline", [0, 1, 2, 3]) == list(range(6))
    assert t9.row_seeds("small", "vit_hard_lam", [0, 1, 2, 3]) == [0, 1]  # exploratory rows keep their count
    assert t9.row_seeds("small", "vit_baseline", [0, 1, 2, 3]) == [0, 1, 2, 3]
    for bad, match in (({"hrd": 5}, "family_seeds names 'hrd', not a family"),
                       ({"hard": 1}, "at least 2"), ([20], "expected \\{family")):
        doc = copy.deepcopy(base)
        doc["scales"]["small"]["family_seeds"] = bad
        with pytest.raises(ExperimentError, match=match):
            parse(doc, "x")
