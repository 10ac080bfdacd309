"""A committed smoke table reproduces at HEAD: one of its cells trained again gives the committed number exactly."""

import re
from pathlib import Path

import pytest

from condattn.config import compose_cell
from condattn.engine.trainer import train
from condattn.experiment import load
from condattn.reproduce import cells

REPO = Path(__file__).resolve().parents[1]


def committed(table: Path, row: str, column: str) -> str:
    lines = [ln for ln in table.read_text().splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    for ln in lines[2:]:
        cells_ = [c.strip() for c in ln.strip("|").split("|")]
        if cells_[0] == row:
            return cells_[head.index(column)]
    raise AssertionError(f"no row {row!r} in {table}")


@pytest.mark.slow
def test_a_committed_smoke_cell_reproduces_exactly(tmp_path):
    """Table 4's Image baseline cell (about 20 s of training), at the smoke recipe's one thread."""
    exp = load(REPO / "experiments" / "table4_lra.yaml")
    (name, overrides), = [c for c in cells(exp, "smoke", [0], [], only_rows=["image"]) if "_none_" in c[0]]
    cfg = compose_cell([*overrides, "logger=none", f"paths.runs={tmp_path / 'runs'}",
                        f"paths.cache={tmp_path / 'cache'}"])
    assert cfg.impl.threads == 1  # the smoke recipe's count, whatever the machine has
    s = train(cfg)
    want = committed(REPO / "results" / "smoke" / "table4_lra.md", "image", "ours: baseline")
    assert re.fullmatch(r"\d+\.\d\d, n = 1 \(no spread\)", want)
    assert f"{100 * s['metrics']['test_acc']:.2f}" == want.split(",")[0]
