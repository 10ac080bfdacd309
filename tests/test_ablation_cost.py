"""Table 8's cost line and convergence figure (condattn.reporting.ablation), from run records."""

from __future__ import annotations

import json

from condattn.reporting.ablation import cost_and_convergence, last_quarter_gain
from condattn.table.provenance import walls_of


def test_last_quarter_gain_reads_each_runs_validation_curve(tmp_path):
    for name, accs in {"a": [0.5, 0.8, 0.9, 0.95], "b": [0.5, 0.7, 0.9, 0.91]}.items():
        (tmp_path / name).mkdir()
        rows = [{"step": 100 * (i + 1), "split": "val", "acc": a, "loss": 1.0} for i, a in enumerate(accs)]
        rows.append({"step": 0, "split": "diag", "entropy/mean": 2.8})
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sums = [{"run_dir": str(tmp_path / n), "steps": 400} for n in ("a", "b", "gone")]
    # last value minus the value at step 300 (3/4 of 400): +5 and +1 points; the run without a curve is left out
    assert abs(last_quarter_gain(sums) - 3.0) < 1e-9
    assert last_quarter_gain([{"run_dir": str(tmp_path / "gone"), "steps": 400}]) is None


def test_cost_line_and_convergence_figure():
    rows = [{"lam": 0.0, "gain": 0.47}, {"lam": 10.0, "gain": 5.0}]
    cost, conv = cost_and_convergence(rows, walls_of([100.0, 140.0, 120.0]))
    assert "3 runs" in cost and "0.10 h of run wall time summed (median per run 120 s)" in cost
    assert "+0.47 points" in conv and "λ = 0" in conv
    assert cost_and_convergence([{"lam": 1.0, "gain": None}], walls_of([])) == []
