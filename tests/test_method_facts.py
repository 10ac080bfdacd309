"""Method facts live in the method library: provenance's per-method modules, the bench arms, the cost estimate's arm
and init-only parts, the preflight's λ check and table 6's claimed directions are read from each MethodSpec, and no
module outside condattn/conditioning/ lists method names (the AST guard below)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import parsed

from condattn.bench import baseline_arm, bench_arms
from condattn.conditioning.spec import _METHODS, BASELINE, METHODS, MethodSpec, method_spec
from condattn.engine import cost, preflight, provenance
from condattn.reporting.curves import LABELS, claim_checks

PACKAGE = Path(__file__).resolve().parent.parent / "condattn"

# (path under condattn/, method name): why the name may stand there. Every entry must still be needed (checked).
ALLOWED = {
    # one experiment's design, not a list a new method joins: it settles CET's claim against the baseline, and its
    # report (medium_claim_report.py) is CET's
    ("medium_claim.py", "none"): "the medium claim's baseline arm",
    ("medium_claim.py", "embedded"): "the medium claim's CET arm",
    # the word "none" where it is not the baseline method: a logger's name, an empty list of commits or threads
    ("engine/step0.py", "none"): "logger=none (no logger while step 0 is recomputed)",
    ("reporting/tables.py", "none"): "the provenance line's word for no commit / no thread count",
}


def method_names_in_lists(root: Path = PACKAGE) -> dict[tuple[str, str], list[int]]:
    """{(path under root, method name): lines} where a registered method's name is a string constant in a
    list/tuple/set/dict literal or a comparison, outside conditioning/."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("conditioning/"):
            continue
        for node in ast.walk(parsed(path.read_text())):
            if isinstance(node, ast.List | ast.Tuple | ast.Set):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [k for k in node.keys if k is not None] + node.values
            elif isinstance(node, ast.Compare):
                items = [node.left, *node.comparators]
            else:
                continue
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in METHODS:
                    found.setdefault((rel, item.value), []).append(item.lineno)
    return found


def test_no_module_outside_the_method_library_lists_method_names():
    found = method_names_in_lists()
    listed = [f"condattn/{rel}:{lines[0]}: {name!r}" for (rel, name), lines in found.items()
              if (rel, name) not in ALLOWED]
    assert not listed, ("method names listed outside condattn/conditioning/ (make them a MethodSpec field or read "
                        "the registry): " + "; ".join(listed))
    assert not set(ALLOWED) - set(found), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - set(found))}"


def test_the_guard_finds_a_list_and_a_comparison(tmp_path):
    (tmp_path / "conditioning").mkdir()
    (tmp_path / "conditioning" / "ok.py").write_text('X = ["spectral"]\n')  # the library may list its own methods
    (tmp_path / "a.py").write_text('ARMS = {"SCA": ("spectral", {})}\nif m == "qk_norm":\n    pass\n'
                                   'f(method="embedded")\n')
    assert method_names_in_lists(tmp_path) == {("a.py", "spectral"): [1], ("a.py", "qk_norm"): [2]}


@pytest.fixture
def toy_method(monkeypatch):
    """A method registered for one test only (no other edit anywhere): its facts reach every reader."""
    spec = MethodSpec("toy_facts", sources=("methods/qk_norm.py",), bench_arms={"toy": {}},
                      diagnostics_claimed={"entropy/mean": "higher"})
    monkeypatch.setitem(_METHODS, spec.name, spec)
    return spec


def test_a_registered_method_needs_no_other_edit(toy_method):
    assert provenance.method_files()["toy_facts"] == ("condattn/conditioning/methods/qk_norm.py",)
    assert bench_arms()["toy"] == ("toy_facts", {})
    assert ("toy_facts", "entropy/mean", "higher") in claim_checks()
    assert cost.bench_arm({"method": "toy_facts"}) == "toy"


def test_each_methods_sources_exist_and_fingerprint_its_runs_only():
    files = provenance.method_files()
    assert files[BASELINE] == ()
    for m, own in files.items():
        assert all((provenance.REPO / f).is_file() for f in own), (m, own)
        parts = method_spec(m).parts
        if parts:  # a composite runs its parts' modules
            assert set(own) == {f for p in parts for f in files[p]}
    shared = {"condattn/conditioning/spec.py": b"s", **{f: b"x" for fs in files.values() for f in fs}}
    for m, own in files.items():
        for f in own:
            edited = {**shared, f: b"y"}
            changed = {n for n in files if provenance.fingerprint(edited, n)["conditioning"]
                       != provenance.fingerprint(shared, n)["conditioning"]}
            assert changed == {n for n, fs in files.items() if f in fs}, (m, f)
    edited = {**shared, "condattn/conditioning/spec.py": b"t"}  # shared code: every method's runs
    assert all(provenance.fingerprint(edited, n) != provenance.fingerprint(shared, n) for n in files)


def test_bench_arms_come_from_the_registry_baseline_first():
    arms = bench_arms()
    assert next(iter(arms)) == baseline_arm() and arms[baseline_arm()] == (BASELINE, {})
    for arm, (m, opts) in arms.items():
        assert set(opts) <= set(method_spec(m).options), (arm, opts)  # every arm's options are its method's


@pytest.mark.parametrize("node, arm", [
    ({"method": "embedded", "solver": "svd"}, "CET-svd"),
    ({"method": "embedded"}, "CET-fast"),  # newton_schulz by default
    ({"method": "sigma_reparam", "partition": "per_role"}, "σReparam-role"),  # the more specific arm
    ({"method": "sigma_reparam"}, "σReparam"),
    ({"method": "spectral+embedded"}, "SCA"),  # the first part that costs per step
    ({"method": "spectral", "mode": "init"}, "baseline"),  # init-only under its options: no per-step cost
    ({"method": "conditioned_init"}, "baseline"),
    ({"method": "spectral", "lam": "ten"}, None),  # not a valid node: no measured arm
])
def test_a_cells_bench_arm_is_read_from_its_methods_facts(node, arm):
    assert cost.bench_arm(node) == arm


def test_claimed_diagnostics_are_table_6_quantities():
    checks = claim_checks()
    assert {m for m, _, _ in checks} >= {"spectral", "embedded"}
    assert all(key in LABELS and way in ("lower", "higher") for _, key, way in checks), checks


@pytest.mark.parametrize("node", [
    {"method": "spectral", "correction": "svd", "lam": 1e8},  # λ does not act under the exact correction
    {"method": "none", "lam": 1e8},
    {"method": "conditioned_init"},
    {"method": "spectral", "lam": -1},  # a bad value: the config check names it, not this warning
])
def test_the_lambda_warning_reads_whether_lambda_acts(node):
    assert preflight.lam_warning({"conditioning": node}) is None
