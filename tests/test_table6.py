"""Table 6 (the papers' condition-number figures): XCiT's XCA head function for κ(J), κ(J) logged by the trainer,
the curves renderer on fake runs, and the experiment composing at every scale."""

import csv
import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch

from condattn.diagnostics import (
    attention_head,
    attention_jacobian,
    jacobian_condition_number,
    jacobian_condition_number_matfree,
    xca_head,
)

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "experiments" / "table6_condition_numbers.yaml"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


# ---------------------------------------------------------------- the XCA head function


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("method", ["none", "spectral"])
def test_xca_head_matches_timm_xca_module(fused, method):
    """xca_head on the site's (effective) head weights = timm XCA's output for that head (before its `proj`)."""
    from timm.models.xcit import XCA

    import condattn
    from condattn.conditioning import ROLES, find_attention

    torch.manual_seed(0)
    m = XCA(16, num_heads=2, qkv_bias=False).eval()
    with torch.no_grad():
        m.temperature.copy_(torch.tensor([1.7, 0.45]).view(2, 1, 1))
    condattn.apply_conditioning(m, method, **({"lam": 2.0} if method == "spectral" else {}))
    m.proj = torch.nn.Identity()
    m.fused_attn = fused
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = m(x)  # (B, N, C), head h in channels [h·d, (h+1)·d)
    (site,) = find_attention(m)
    assert site.layout == "timm_xca" and site.head_dim == 8
    for h in range(2):
        W = [site.head_weight(r, h, effective=True).T for r in ROLES]  # paper layout (D, d)
        tau = float(m.temperature[h].detach())
        for b in range(2):
            torch.testing.assert_close(xca_head(x[b], *W, temperature=tau), out[b, :, h * 8:(h + 1) * 8],
                                       rtol=1e-5, atol=1e-6)


def test_xca_jacobian_exact_and_matrix_free_agree():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(6, 12, generator=g, dtype=torch.float64)
    ws = [0.5 * torch.randn(12, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    head = partial(xca_head, temperature=1.3)
    J = attention_jacobian(X, *ws, head=head)
    assert J.shape == (6 * 4, 3 * 12 * 4)
    # J's W_V block is the derivative of X W_V Aᵀ: check one column against a finite difference
    eps = 1e-6
    dv = torch.zeros(12, 4, dtype=torch.float64)
    dv[5, 2] = eps
    fd = (head(X, ws[0], ws[1], ws[2] + dv) - head(X, ws[0], ws[1], ws[2] - dv)).reshape(-1) / (2 * eps)
    torch.testing.assert_close(J[:, 2 * 48 + 5 * 4 + 2], fd, rtol=1e-6, atol=1e-8)
    exact = jacobian_condition_number(X, *ws, head=head)
    approx, info = jacobian_condition_number_matfree(X, *ws, head=head, return_info=True)
    assert info["converged"] and math.isfinite(exact) and exact > 1
    assert approx == pytest.approx(exact, rel=1e-6)
    # a different formula from the token softmax head, and the default is unchanged
    assert exact != pytest.approx(jacobian_condition_number(X, *ws), rel=1e-3)
    assert jacobian_condition_number(X, *ws) == jacobian_condition_number(X, *ws, head=partial(attention_head))
    with pytest.raises(ValueError, match="scale applies to the default"):
        jacobian_condition_number(X, *ws, scale=1.0, head=head)


def test_jacobian_kappa_uses_the_xca_formula_for_xcit():
    import timm

    from condattn.diagnose import head_inputs, jacobian_kappa
    from condattn.tasks.classification import ClassificationTask

    torch.manual_seed(0)
    model = timm.create_model("xcit_nano_12_p16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                              embed_dim=32, num_heads=2, num_classes=10).eval()
    with torch.no_grad():
        model.blocks[0].attn.temperature.fill_(0.8)
    task = ClassificationTask(None)
    batch = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
             "labels": torch.tensor([1, 2])}
    j = jacobian_kappa(model, task, batch, None)
    assert j["formula"] == "xca" and j["layout"] == "timm_xca" and j["temperature"] == pytest.approx(0.8)
    assert j["solver"] == "exact" and j["tokens"] == j["tokens_total"] == 16 and j["scale"] is None
    X, W, _ = head_inputs(model, task, batch)
    assert j["kappa"] == pytest.approx(jacobian_condition_number(X, *W, head=partial(xca_head, temperature=0.8)))


# ---------------------------------------------------------------- the trainer logs κ(J) without changing training


def _tiny_vit_run(tmp: Path, *extra: str) -> dict:
    from condattn.config import compose
    from condattn.engine.trainer import train

    return train(compose([
        "task=imagenet_vit", "scale=smoke", "logger=none", f"paths.runs={tmp}", "conditioning=spectral",
        "task.steps=4", "task.eval_every=4", "task.log_every=1", "impl.checkpoint_every=4", "diagnostics.batch_size=2",
        "data.holdout_per_class=2", "model.drop_path_rate=0.1", *extra]))  # drop path: training consumes the RNG


@pytest.mark.slow
def test_trainer_logs_kappa_jacobian_and_training_is_unchanged(tmp_path):
    from safetensors.torch import load_file

    from condattn.utils.io import read_jsonl

    on = _tiny_vit_run(tmp_path / "on", "diagnostics.every=2", "diagnostics.jacobian=true",
                       "diagnostics.jacobian_tokens=8")
    off = _tiny_vit_run(tmp_path / "off", "diagnostics.every=2")
    rows = {s: [r for r in read_jsonl(Path(x["run_dir"]) / "metrics.jsonl") if r["split"] == "diag"]
            for s, x in (("on", on), ("off", off))}
    assert [r["step"] for r in rows["on"]] == [0, 2, 4, 4]  # step 0, every 2, the end of training
    for r in rows["on"]:
        assert math.isfinite(r["kappa_jacobian/l0"]) and r["kappa_jacobian/l0"] > 1
        assert r["kappa_jacobian_tokens/l0"] == 8 and r["kappa_jacobian_tokens_total/l0"] == 17
        assert r["kappa_jacobian_exact/l0"] == 1.0 and r["kappa_jacobian_xca/l0"] == 0.0
    assert all("kappa_jacobian/l0" not in r for r in rows["off"])
    assert on["diagnostics"]["step0"]["kappa_jacobian/l0"] == rows["on"][0]["kappa_jacobian/l0"]
    # same training: every train/val row and the final weights are identical
    keep = lambda d: [r for r in read_jsonl(Path(d) / "metrics.jsonl") if r["split"] in ("train", "val")]  # noqa: E731
    assert keep(on["run_dir"]) == keep(off["run_dir"]) and on["metrics"] == off["metrics"]
    wa, wb = (load_file(str(Path(x["run_dir"]) / "checkpoints" / "step_0000004" / "model.safetensors"))
              for x in (on, off))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ---------------------------------------------------------------- the renderer on fake runs


def _fake_run(runs: Path, name: str, model: str, kx: float, seed_shift: float, steps: int = 50, jac: bool = True):
    d = runs / "smoke" / name
    d.mkdir(parents=True)
    rows = []
    for s in range(0, steps + 1, 10):
        f = 1 + s / steps + seed_shift
        row = {"step": s, "split": "diag", "kappa_x/b0": kx * f, "entropy/mean": 2.0 - s / 100,
               "kappa_attn/l0": 50.0 * f, "kappa_attn/mean": 40.0 * f}
        for r in "qkv":
            row |= {f"kappa_w{r}/mean": 100.0 * f, f"kappa_w{r}/l0": 90.0 * f, f"sigma_min_w{r}/mean": 0.01 * f}
        if jac:
            row |= {"kappa_jacobian/l0": 1e4 * f, "kappa_jacobian_tokens/l0": 17, "kappa_jacobian_tokens_total/l0": 17,
                    "kappa_jacobian_exact/l0": 1.0, "kappa_jacobian_converged/l0": 1.0, "kappa_jacobian_xca/l0": 0.0}
        rows.append(row)
    rows.append({**rows[-1], "kappa_x/b0": 999.0})  # the end-of-training row repeats the last step: it wins
    rows.insert(1, {"step": 0, "split": "grad", "gradnorm_wq/mean": 1.0})
    rows[2:2] = [{"step": s, "split": "val", "acc": 0.4 + s / 500} for s in (10, 30, 40, 50)]  # +4 after step 37.5
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "finished", "run_dir": str(d), "metrics": {"final_val_acc": 0.5}, "steps": steps,
               "wall_time_s": 3.0, "commit": "abc123", "hardware_line": "1 × cpu", "data": {"stand_in": True},
               "config": {"model": {"name": model}}}
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.mark.slow
def test_curves_renderer_on_fake_runs(tmp_path):
    from helpers import plan_of

    from condattn.experiment import load
    from condattn.reporting.curves import write_table

    exp = load(EXP)
    runs = tmp_path / "runs"
    t = exp.table
    for seed, shift in ((0, 0.0), (1, 0.5)):
        _fake_run(runs, f"{t}_vit_none_smoke_s{seed}", "vit_tiny_32_smoke", 180.0, shift)
        _fake_run(runs, f"{t}_vit_embedded_smoke_s{seed}", "vit_tiny_32_smoke", 1.9, shift)
    _fake_run(runs, f"{t}_vit_spectral_smoke_s0", "vit_tiny_32_smoke", 180.0, 0.0, jac=False)
    failed = runs / "smoke" / f"{t}_vit_spectral_smoke_s1"  # a failed seed: reported, not averaged
    failed.mkdir(parents=True)
    (failed / "summary.json").write_text(json.dumps({"status": "failed", "error": "non-finite training loss (nan)"}))
    _fake_run(runs, f"{t}_xcit_none_smoke_s0", "xcit_nano_32_smoke", 80.0, 0.0)  # xcit: only seed 0 of baseline

    md_path, md = write_table(plan_of(exp, "smoke", runs, tmp_path / "results", [0, 1]))
    out = tmp_path / "results" / "smoke"
    assert md_path == out / f"{t}.md" and md_path.read_text() == md
    assert (out / f"{t}.png").stat().st_size > 10_000
    # the papers' claims, quoted and labelled; the provenance line of the other tables
    assert 'CET paper (Conditioned Embedded Tokens, ICCV 2025): "kappa(X) of embedded tokens about 1e3' in md
    assert "SCA paper (Spectral Conditioning of Attention, NeurIPS 2025)" in md and "not yet checked" in md
    assert "Ours: scale=smoke, offline stand-in data (not comparable with the papers), seeds [0, 1], commit abc123" \
        in md
    # step 0 and final, mean ± std over seeds (final: the last row of the last step wins)
    line = next(ln for ln in md.splitlines() if ln.startswith("| κ(X), embedded tokens"))
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert cols[1:3] == ["225 ± 63.6", "999 ± 0"]  # baseline: step 0 (180, 270), final (999, 999)
    assert cols[3:5] == ["180", "999"]  # SCA: one finished seed
    assert cols[5] == "2.38 ± 0.672"  # CET step 0: 1.9, 2.85
    jac = next(ln for ln in md.splitlines() if ln.startswith("| κ(J)"))
    assert "not logged" in jac  # SCA's run had diagnostics.jacobian off
    assert "SCA seed 1: failed: non-finite training loss (nan)" in md
    assert "SCA n=1" in md and "baseline n=2" in md
    # the task metric beside the κ values (a method that did not learn has the κ of an untrained model)
    assert "final_val_acc × 100 at the end of these runs" in md
    # the cost line (wall time of the runs shown) and the baseline's last-quarter figure, per row
    assert "Training time of the runs shown: 6 runs, " in md and "median per run: vit 3 s; xcit 3 s" in md
    assert "Convergence figure (vit, baseline): its validation top-1 gains +4.00 points over the last quarter" in md
    acc = next(ln for ln in md.splitlines() if ln.startswith("final_val_acc × 100"))
    assert "baseline 50.00 ± 0.00 (n=2); SCA 50.00" in acc and "CET 50.00 ± 0.00 (n=2)" in acc, acc
    # xcit: missing cells are reported as missing, with why
    xcit = md[md.index("## xcit"):]
    assert "| κ(X), embedded tokens (first block input) | 80 | 999 | missing | missing | missing | missing |" in xcit
    assert "baseline seed 1: not run" in xcit and "CET seed 0: not run" in xcit
    assert "token softmax, exact (jacrev + float64 SVD), on 17 of 17 tokens" in md
    assert "- CET vs baseline, κ(X), embedded tokens (first block input) (claimed lower): vit 999 → 999" in md
    with open(out / f"{t}.csv") as f:
        rows = list(csv.DictReader(f))
    got = {(r["row"], r["method"], r["quantity"], r["stage"]): r for r in rows}
    assert got[("vit", "none", "kappa_x/b0", "step0")]["values"] == "180.0 270.0"
    # the JSON holds numbers, not text (a mean, a std, the values, the steps; None where there is none)
    doc = json.loads((out / f"{t}.json").read_text())
    rows = {(r["row"], r["method"], r["quantity"], r["stage"]): r for r in doc["rows"]}
    first = rows[("vit", "none", "kappa_x/b0", "step0")]
    assert first["values"] == [180.0, 270.0] and first["mean"] == pytest.approx(225.0)
    assert isinstance(first["std"], float) and all(isinstance(x, int) for x in first["steps"])
    assert rows[("xcit", "embedded", "kappa_x/b0", "final")]["mean"] is None
    assert got[("vit", "none", "kappa_x/b0", "step0")]["n"] == "2"
    assert got[("xcit", "embedded", "kappa_x/b0", "final")]["n"] == "0"
    assert got[("vit", "spectral", "kappa_x/b0", "final")]["missing_seeds"] == "1"


def test_curves_renderer_with_no_runs(tmp_path):
    from helpers import plan_of

    from condattn.experiment import load
    from condattn.reporting.curves import write_table

    md_path, md = write_table(plan_of(load(EXP), "smoke", tmp_path / "runs", tmp_path / "results", [0]))
    assert "no finished runs yet" in md and "## vit: no finished runs" in md
    assert not (tmp_path / "results" / "smoke" / "table6_condition_numbers.png").exists()
    assert (tmp_path / "results" / "smoke" / "table6_condition_numbers.csv").read_text().startswith("table,scale,")


# ---------------------------------------------------------------- the experiment composes at every scale


@pytest.mark.parametrize("scale, every, seeds", [("smoke", 5, [0]), ("small", 80, [0, 1, 2]), ("paper", 37530, [0])])
@pytest.mark.slow
def test_experiment_composes_at_every_scale(tmp_path, capsys, scale, every, seeds):
    from condattn.experiment import load
    from condattn.reproduce import cells, main

    exp = load(EXP)
    assert exp.renderer == "condattn.reporting.curves:write_table"
    todo = cells(exp, scale, exp.at(scale).seeds, [])
    assert len(todo) == 2 * 3 * len(seeds)
    for _, ov in todo:
        assert f"diagnostics.every={every}" in ov and "diagnostics.jacobian=true" in ov
    args = [str(EXP), "--scale", scale, "--dry-run", f"paths.runs={tmp_path / 'runs'}",
            f"paths.results={tmp_path / 'results'}"]  # no committed records: every cell listed
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"dry run: {len(todo)} of {len(todo)} cells would train here" in out
    assert f"table6_condition_numbers_xcit_embedded_{scale}_s{seeds[-1]}" in out
    # the composed configs: the families' members of that scale, κ(J) on
    from condattn.launch import compose_cell

    names = {}
    for name, ov in todo[:: 3 * len(seeds)]:  # one cell per row
        cfg = compose_cell(ov)
        row = name.split("_")[3]
        # about 10 points per curve: the small ViT trains 3,000 steps (its row sets every 300), XCiT 800
        want_every = 300 if (scale, row) == ("small", "vit") else every
        assert cfg.diagnostics.jacobian is True and cfg.diagnostics.every == want_every
        assert 8 <= int(cfg.task.steps) // want_every <= 13
        names[row] = cfg.model.name
    want = {"smoke": ("vit_tiny_32_smoke", "xcit_nano_32_smoke"), "small": ("vit_tiny_32", "xcit_nano_32"),
            "paper": ("vit_base_patch16_224", "xcit_medium_24_p16_224")}[scale]
    assert (names["vit"], names["xcit"]) == want
