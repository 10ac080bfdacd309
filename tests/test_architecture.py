"""The import contract: dependencies point down the layers, and no module sits in an import cycle.

Layers, top to bottom (a module may import its own layer and the layers below it, never one above):

1. entry points: train, reproduce, compare, bench, diagnose, floors, medium_claim (+ its report and projection), the
   table wing's command table.equivalence and `python -m condattn.reporting`
2. the views: reporting (Markdown, CSV, JSON, figures, findings, README block), formatting a TableResult
3. the table wing: table (plan, run store, TableResult, and table.report, which writes a table with the renderer the
   command hands it: nothing under condattn/table/ imports the views) and launch (composing and launching cells)
4. the engine: engine (trainer and its parts, optimizer, preflight), config (Hydra composition), checks (values)
5. the zoo: models, data, tasks
6. leaves of the harness: runs (the run record), utils, stats (the statistics: pure functions on numbers)
7. the method library: conditioning, diagnostics. They import torch (and timm / transformers to match layouts),
   nothing else of condattn; diagnostics may read conditioning's sites, never the reverse.

Every import counts, also one inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

import pytest
from helpers import parsed

PACKAGE = Path(__file__).resolve().parent.parent / "condattn"

LAYERS: list[list[str]] = [
    ["condattn.train", "condattn.reproduce", "condattn.reproduce_all", "condattn.compare", "condattn.bench",
     "condattn.diagnose", "condattn.floors", "condattn.medium_claim", "condattn.medium_claim_report",
     "condattn.medium_projection", "condattn.table.equivalence",
     "condattn.reporting.__main__"],
    ["condattn.reporting"],
    ["condattn.table", "condattn.launch"],
    ["condattn.engine", "condattn.config", "condattn.experiment", "condattn.checks"],
    ["condattn.models", "condattn.data", "condattn.tasks"],
    ["condattn.runs", "condattn.utils", "condattn.stats"],
    ["condattn.diagnostics"],
    ["condattn.conditioning"],
]
LIBRARY = ("condattn.conditioning", "condattn.diagnostics")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def _import_statements(text: str) -> tuple[tuple[int, str | None, tuple[str, ...]], ...]:
    """A source's import statements as (level, module, names); `import a, b` is (-1, None, (a, b)). Cached by the
    text, so the tests below parse each file once per process (the planted copies reparse only what they change)."""
    out = []
    for node in ast.walk(parsed(text)):
        if isinstance(node, ast.Import):
            out.append((-1, None, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module, tuple(a.name for a in node.names)))
    return tuple(out)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the condattn modules it imports (a `from pkg import name` that names a submodule counts as it)."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for level, module, names in _import_statements(path.read_text()):
            if level < 0:
                deps.update(names)
                continue
            if level:
                base = package.split(".")[: len(package.split(".")) - level + 1]
                target = ".".join(base + ([module] if module else []))
            else:
                target = module or ""
            deps.add(target)
            deps.update(f"{target}.{n}" for n in names if f"{target}.{n}" in modules)
        graph[mod] = {d for d in deps if d in modules and d != mod}
    return graph


def layer_of(mod: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            return i
    return None


def violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod in sorted(graph):
        if mod == "condattn":  # the package's front door: the library only
            bad = [d for d in graph[mod] if not d.startswith(LIBRARY)]
            out += [f"condattn/__init__ imports {d} (only the method library belongs there)" for d in sorted(bad)]
            continue
        src = layer_of(mod)
        if src is None:
            out.append(f"{mod} is in no layer: add it to LAYERS in tests/test_architecture.py")
            continue
        for dep in sorted(graph[mod]):
            dst = layer_of(dep) if dep != "condattn" else len(LAYERS) - 1  # the front door: the library
            if dst is None or dst < src:
                out.append(f"{mod} (layer {src + 1}) imports {dep} (layer {'?' if dst is None else dst + 1}): upward")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_dependencies_point_down():
    problems = violations(import_graph())
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_no_view_imports_the_statistics():
    """The views format a TableResult: none of reporting/ imports condattn.stats (the table wing decides)."""
    graph = import_graph()
    bad = sorted(f"{m} imports {d}" for m in graph if m.startswith("condattn.reporting")
                 for d in graph[m] if d == "condattn.stats" or d.startswith("condattn.stats."))
    assert not bad, "\n".join(bad)


def test_the_statistics_import_nothing_of_condattn():
    graph = import_graph()
    assert not [d for m in graph if m.startswith("condattn.stats") for d in graph[m]
                if not d.startswith("condattn.stats")]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("plant, expect", [
    # the library reaching up into the harness
    ("conditioning/api.py", "from ..engine import trainer  # planted\n"),
    # a cycle inside one layer
    ("models/lra.py", "from . import crammed_bert  # planted\n"),
])
def test_contract_catches_a_planted_violation(tmp_path, plant, expect):
    """The checker is not vacuous: a copy of the package with one planted import fails it."""
    root = tmp_path / "condattn"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / plant
    target.write_text(target.read_text() + "\n" + expect)
    if plant.startswith("models/"):  # make it a real cycle: crammed_bert imports lra back
        back = root / "models/crammed_bert.py"
        back.write_text(back.read_text() + "\nfrom . import lra  # planted\n")
    graph = import_graph(root)
    if plant.startswith("conditioning/"):
        assert any(v.startswith("condattn.conditioning.api ") and "condattn.engine" in v for v in violations(graph))
    else:
        assert any({"condattn.models.lra", "condattn.models.crammed_bert"} <= set(c) for c in cycles(graph))
