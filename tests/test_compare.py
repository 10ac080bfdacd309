"""`python -m condattn.compare`: groups of runs side by side, with the statistics the tables share."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from condattn.compare import main, resolve
from condattn.reporting.fmt import fmt_ci, fmt_p, fmt_values
from condattn.stats.core import bootstrap_ci, diff_ci, mean_std, welch_ci, welch_p
from condattn.table.result import Values


def ci_text(ci) -> str:
    return fmt_ci(ci.diff, ci.low, ci.high)

REPO = Path(__file__).resolve().parents[1]
A = [0.30, 0.32, 0.31]  # test_acc of a baseline over 3 seeds
B = [0.36, 0.38, 0.35]


def fake_run(root: Path, name: str, acc: float, steps: int = 120, wall: float = 30.0, finished: bool = True,
             task: str | None = None, evals: tuple[int, ...] = (40, 80, 120)) -> Path:
    d = root / "smoke" / name
    d.mkdir(parents=True)
    summary = {"status": "finished" if finished else "failed", "run_dir": str(d), "steps": steps,
               "wall_time_s": wall, "metrics": {"test_acc": acc, "val_acc": acc + 0.01},
               **({"config": {"task": {"name": task}}} if task else {})}
    (d / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": s, "split": "val", "acc": acc * s / steps, "loss": 2.0} for s in evals]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for i, v in enumerate(A):
        fake_run(root, f"t4_listops_none_smoke_s{i}", v)
    for i, v in enumerate(B):
        fake_run(root, f"t4_listops_embedded_smoke_s{i}", v, wall=40.0)
    fake_run(root, "t4_listops_spectral_smoke_s0", 0.2)
    fake_run(root, "t4_listops_spectral_smoke_s1", 0.9, finished=False)
    return root


def test_stats_helpers():
    assert mean_std([1.0]) == (1.0, 0.0)
    assert fmt_values(Values((0, 1), (30.0, 32.0), ())) == "31.00 ± 1.41 (n=2)"  # the tables' format (sample std)
    ci = welch_ci([100 * a for a in A], [100 * b for b in B])
    from scipy import stats

    ref = stats.ttest_ind([100 * b for b in B], [100 * a for a in A], equal_var=False).confidence_interval(0.95)
    assert ci.diff == pytest.approx(5.3333333) and ci.method == "welch-t"
    assert (ci.low, ci.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    boot = bootstrap_ci(A, B)
    assert boot.low < boot.diff < boot.high and boot == bootstrap_ci(A, B)  # seeded: reproducible
    assert diff_ci([1.0], B) is None  # no interval from a single run
    same = welch_ci([1.0, 1.0], [2.0, 2.0])
    assert (same.low, same.high) == (1.0, 1.0)


def test_groups_by_prefix_glob_and_directory(runs, tmp_path):
    assert [p.name for p in resolve("t4_listops_none_smoke", runs)] == [f"t4_listops_none_smoke_s{i}" for i in range(3)]
    assert len(resolve(str(runs / "smoke" / "t4_listops_embedded_smoke_s*"), runs)) == 3
    assert len(resolve("t4_listops_*_smoke_s0", runs)) == 3  # a glob relative to the runs root's scale folders
    one = resolve(str(runs / "smoke" / "t4_listops_none_smoke_s1"), runs)
    assert [p.name for p in one] == ["t4_listops_none_smoke_s1"]
    assert len(resolve(str(runs / "smoke"), runs)) == 8
    assert resolve("nothing_like_this", runs) == []


def test_compare_cli_table_and_figure(runs, tmp_path, capsys):
    out_png = tmp_path / "cmp.png"
    assert main(["t4_listops_none_smoke", str(runs / "smoke" / "t4_listops_embedded_smoke_s*"), "t4_listops_spectral",
                 "--runs-root", str(runs), "--out", str(out_png)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("| group | n | test_acc (×100) | Δ vs t4_listops_none_smoke [95% CI] | "
                        "p: Welch / Holm / permutation | verdict | steps | wall time / run | runs |")
    ci = welch_ci([100 * a for a in A], [100 * b for b in B])
    # Holm over the 2 groups set beside the first: the one-run group has no test but still counts (as p = 1)
    p = welch_p([100 * a for a in A], [100 * b for b in B])
    assert lines[2] == "| t4_listops_none_smoke | 3 | 31.00 ± 1.00 | – | – | – | 120 | 30 s | s0 s1 s2 |"
    assert lines[3] == (f"| t4_listops_embedded_smoke_s* | 3 | 36.33 ± 1.53 | {ci_text(ci)} | {fmt_p(p)} / "
                        f"{fmt_p(2 * p)} / 0.100 | better | 120 | 40 s | s0 s1 s2 |")
    assert lines[4] == ("| t4_listops_spectral | 1 | 20.00 ± n/a | -11.00 (no CI: needs ≥ 2 runs per group) | – | – | "
                        "120 | 30 s | s0 (+1 unfinished) |")
    assert "Δ: mean difference to the first group with its 95% CI (Welch t interval)." in out
    assert "t4_listops_spectral_smoke_s1 has no finished summary; left out" in out
    assert out_png.stat().st_size > 10_000 and f"[compare] figure: {out_png}" in out
    assert not math.isnan(ci.low)


def test_compare_refuses_unknown_groups_and_metrics(runs, capsys):
    assert main(["t4_listops_none_smoke", "t4_nope", "--runs-root", str(runs)]) == 2
    assert "no run matches 't4_nope'" in capsys.readouterr().err
    assert main(["t4_listops_none_smoke", "--runs-root", str(runs), "--metric", "bleu"]) == 2
    assert "metric 'bleu' is missing in runs of t4_listops_none_smoke; known metrics: test_acc, val_acc" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_make_compare_target_passes_globs_unexpanded(runs, tmp_path):
    glob = str(runs / "smoke" / "t4_listops_none_smoke_s*")
    out = subprocess.run(["make", "compare", f"RUNS={glob} t4_listops_embedded_smoke",
                          f"ARGS=--runs-root {runs} --out {tmp_path / 'm.png'}", f"BIN={Path(sys.executable).parent}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| t4_listops_none_smoke_s* | 3 | 31.00 ± 1.00 |" in out.stdout  # one group, not three runs


class _FakeWandbRun:
    def __init__(self, name, acc, state="finished"):
        self.name, self.state, self.url = name, state, f"https://wandb.ai/me/condattn/runs/{name}"
        self.summary = {"test_acc": acc, "val_acc": acc + 0.01, "condattn/steps": 120, "condattn/wall_time_s": 30.0,
                        "val/acc": acc, "_step": 120} if state == "finished" else {}
        self._hist = [{"_step": s, "val/acc": acc * s / 120, "val/loss": 2.0, "train/loss": None}
                      for s in (40, 80, 120)]

    def scan_history(self):
        return iter(self._hist)


class _FakeWandbApi:
    """Stands in for wandb.Api: the same runs() filter the real API takes, answered from memory."""

    def __init__(self, runs):
        self._runs, self.queries = runs, []

    def runs(self, path, filters):
        import re

        self.queries.append((path, filters))
        pattern = filters["display_name"]["$regex"]
        return [r for r in self._runs if re.match(pattern, r.name)]


def test_compare_reads_wandb_groups(runs, tmp_path, capsys, monkeypatch):
    from condattn import compare

    api = _FakeWandbApi([_FakeWandbRun(f"t4_listops_embedded_smoke_s{i}", b) for i, b in enumerate(B)]
                        + [_FakeWandbRun("t4_listops_embedded_smoke_s3", 0.0, state="crashed"),
                           _FakeWandbRun("t4_listops_none_smoke_s0", 0.1)])
    g = compare.load_wandb_group("wandb:me/condattn/t4_listops_embedded", api=api)
    assert api.queries == [("me/condattn", {"display_name": {"$regex": "^t4_listops_embedded"}})]
    assert [p.name for p in g.runs] == [f"t4_listops_embedded_smoke_s{i}" for i in range(3)]
    assert [p.name for p in g.unfinished] == ["t4_listops_embedded_smoke_s3"]
    assert g.summaries[0]["metrics"] == {"test_acc": B[0], "val_acc": B[0] + 0.01}  # "val/acc" is history, not a metric
    assert g.histories[0][0] == {"step": 40, "split": "val", "acc": B[0] * 40 / 120, "loss": 2.0}

    import wandb

    monkeypatch.setattr(wandb, "Api", lambda timeout=None: api)
    assert main(["t4_listops_none_smoke", "wandb:me/condattn/t4_listops_embedded", "--runs-root", str(runs),
                 "--out", str(tmp_path / "w.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    ci = welch_ci([100 * a for a in A], [100 * b for b in B])
    p = fmt_p(welch_p([100 * a for a in A], [100 * b for b in B]))  # one group beside the first: p unadjusted
    assert lines[3] == (f"| t4_listops_embedded | 3 | 36.33 ± 1.53 | {ci_text(ci)} | {p} / {p} / 0.100 | better | "
                        "120 | "
                        "30 s | s0 s1 s2 (+1 unfinished) |")
    assert (tmp_path / "w.png").stat().st_size > 10_000

    assert main(["wandb:me/condattn"]) == 2
    assert "must look like wandb:ENTITY/PROJECT/NAME_PREFIX" in capsys.readouterr().err

    def unreachable(timeout=None):
        raise ConnectionError("no route to api.wandb.ai")

    monkeypatch.setattr(wandb, "Api", unreachable)
    assert main(["wandb:me/condattn/t4"]) == 2
    assert "could not read the wandb groups (ConnectionError: no route to api.wandb.ai)" in capsys.readouterr().err


def test_a_glob_over_several_tasks_is_split_per_task(tmp_path, capsys):
    """A glob matching runs of several tasks: one table (and figure) per task with a warning, never one average."""
    root = tmp_path / "runs"
    for task, accs in (("lra_listops", (0.30, 0.34)), ("lra_text", (0.60, 0.64)), ("lra_image", (0.40,))):
        for i, a in enumerate(accs):
            fake_run(root, f"table4_{task}_none_smoke_s{i}", a, task=task)
    for i, a in enumerate((0.36, 0.38)):
        fake_run(root, f"table4_lra_listops_embedded_smoke_s{i}", a, task="lra_listops")
    out_png = tmp_path / "cmp.png"
    assert main(["table4_*_none_smoke_s*", "table4_lra_listops_embedded_smoke", "--runs-root", str(root),
                 "--out", str(out_png)]) == 0
    captured = capsys.readouterr()
    assert ("warning: 'table4_*_none_smoke_s*' matches runs of 3 tasks: lra_image (1), lra_listops (2), lra_text (2); "
            "compared per task, not averaged into one group") in captured.err
    out = captured.out
    assert "| table4_*_none_smoke_s* [lra_listops] | 2 | 32.00 ± 2.83 | – |" in out
    assert "| table4_lra_listops_embedded_smoke | 2 | 37.00 ± 1.41 | " in out  # against the listops baseline only
    assert "| table4_*_none_smoke_s* [lra_text] | 2 | 62.00 ± 2.83 | – |" in out
    assert "| table4_*_none_smoke_s* [lra_image] | 1 | 40.00 ± n/a | – |" in out
    assert "### task lra_listops" in out and "### task lra_image" in out
    assert not any(f"| {n} | " in out for n in ("5", "7"))  # no group of all tasks' runs
    for task in ("lra_listops", "lra_text", "lra_image"):
        assert (tmp_path / f"cmp_{task}.png").stat().st_size > 10_000
    # one task: a single table, no warning
    assert main(["table4_lra_listops_none_smoke", "--runs-root", str(root), "--out", str(out_png)]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "### task" not in captured.out


def test_figure_shows_the_tables_metric_and_draws_the_bold_mean(tmp_path, monkeypatch):
    """The figure plots the val curves, each group's bold mean (also when its runs were evaluated at different
    steps), and the table's metric (test_acc) as a marker with the table's mean ± std at the last step."""
    from matplotlib.figure import Figure

    from condattn import compare

    root = tmp_path / "runs"
    fake_run(root, "a_s0", 0.30, evals=(40, 80, 120))
    fake_run(root, "a_s1", 0.34, evals=(50, 100, 120))  # different eval steps: no step common to both but 120
    fake_run(root, "b_s0", 0.50)
    figs = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self))
    groups = [compare.load_group("a_s", root), compare.load_group("b_s", root)]
    compare.plot(groups, tmp_path / "f.png", "val", "acc", metric="test_acc")
    (ax,) = figs[0].axes
    bold = [ln for ln in ax.lines if ln.get_linewidth() == 2.5]
    assert [ln.get_label() for ln in bold] == ["a_s (mean of 2)", "b_s (mean of 1)"]
    assert list(bold[0].get_xdata()) == [50, 80, 100, 120]  # interpolated on the union of steps both runs cover
    assert bold[0].get_ydata()[-1] == pytest.approx(100 * (0.30 + 0.34) / 2)
    markers = [ln for ln in ax.lines if ln.get_marker() == "D"]
    assert [(float(m.get_xdata()[0]), float(m.get_ydata()[0])) for m in markers] == \
        [(120.0, pytest.approx(32.0)), (120.0, pytest.approx(50.0))]  # the table's test_acc means
    assert "the table's test_acc" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a_s (mean of 2)", "b_s (mean of 1)"]


def test_runs_of_different_configs_are_never_pooled_as_seeds(tmp_path, capsys):
    """A prefix over λ variants (the issue's `lra_listops_spectral_smoke`): one group per science config, labelled with
    the readable difference, with a warning naming the differing keys; seeds of one config are still one group."""
    import json as json_

    root = tmp_path / "runs"

    def run(name, acc, lam, seed, **extra):
        d = fake_run(root, name, acc)
        s = json_.loads((d / "summary.json").read_text())
        s["config"] = {"task": {"name": "lra_listops", "steps": 120}, "seed": seed, "run": {"name": name},
                       "conditioning": {"method": "spectral", "lam": lam, **extra}}
        (d / "summary.json").write_text(json_.dumps(s))

    run("t4_listops_spectral_smoke_s0", 0.20, 10.0, 0)
    run("t4_listops_spectral_smoke_s1", 0.24, 10.0, 1)
    run("t4_listops_spectral_smoke_s0-1a2b3c4d", 0.30, 5.0, 0)
    run("t4_listops_spectral_smoke_s0-5e6f7a8b", 0.40, 2.0, 0, identity="per_head")
    assert main(["t4_listops_spectral_smoke", "--runs-root", str(root), "--out", str(tmp_path / "c.png")]) == 0
    captured = capsys.readouterr()
    assert ("warning: 't4_listops_spectral_smoke' matches runs of 3 configs that differ in conditioning.identity, "
            "conditioning.lam; compared as separate groups, not pooled as seeds") in captured.err
    out = captured.out
    assert "| t4_listops_spectral_smoke [identity=full, lam=10.0] | 2 | 22.00 ± 2.83 | – |" in out
    assert "| t4_listops_spectral_smoke [identity=full, lam=5.0] | 1 | 30.00 ± n/a |" in out
    assert "| s0-1a2b3c4d |" in out and "| s0-5e6f7a8b |" in out
    assert "[identity=per_head, lam=2.0] | 1 | 40.00 ± n/a |" in out
    assert "| 4 |" not in out  # never one group of all four runs
    # one config: no warning, one group
    assert main(["t4_listops_spectral_smoke_s", "--runs-root", str(root), "--out", str(tmp_path / "c.png")]) == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err  # the prefix still matches the variants (…_s0-<hex>)
    assert main([str(root / "smoke" / "t4_listops_spectral_smoke_s?"), "--runs-root", str(root),
                 "--out", str(tmp_path / "c.png")]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "| 2 | 22.00 ± 2.83 |" in captured.out
