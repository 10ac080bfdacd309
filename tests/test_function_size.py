"""Orchestration in parts (issue 24): no function of reproduce.py or diagnose.py is over 80 lines (measured with ast,
decorators and docstrings included)."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "condattn"
LIMIT = 80


def long_functions(path: Path, limit: int = LIMIT) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{n.lineno} {n.name} is {n.end_lineno - n.lineno + 1} lines"
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > limit]


@pytest.mark.parametrize("module", ["reproduce.py", "diagnose.py"])
def test_no_function_over_80_lines(module):
    assert long_functions(PKG / module) == []


def test_the_measure_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    f = tmp_path / "m.py"
    f.write_text(f"def big():\n{body}\n")
    assert long_functions(f) == [f"m.py:1 big is {LIMIT + 1} lines"]
