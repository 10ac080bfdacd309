"""`scripts/gpu_check.sh --medium-claim` (condattn/medium_claim.py) on its CPU path with a toy CIFAR-100: trains and
writes a well-formed report, DRY_RUN prints the plan and trains nothing, missing data and an over-budget projection
stop in one line, and the vmapped seeds train exactly as the loop does."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from condattn import medium_claim as mc

TINY = ["--model", "depth=1,embed_dim=16,num_heads=2,patch_size=8", "--batch", "8", "--seeds", "2", "--allow-cpu"]


@pytest.fixture
def toy_cifar(tmp_path):
    """A CIFAR-100 python release in the official pickle format: 64 training and 32 test images, 100 classes."""
    folder = tmp_path / "data" / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", 64), ("test", 32)):
        labels = [int(i % 100) for i in range(n)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"fine_labels": labels,
                         b"coarse_labels": [v // 5 for v in labels]}, f)
    return tmp_path / "data"


@pytest.mark.slow
def test_trains_and_writes_the_report(toy_cifar, tmp_path, capsys):
    out = tmp_path / "out"
    assert mc.main(["--data", str(toy_cifar), "--steps", "2", "--out", str(out), "--warmup-steps", "1",
                    "--mode", "vmap", *TINY]) == 0
    text = capsys.readouterr().out
    assert "plan: arms ['baseline', 'CET'], 2 seeds each, B = 2 and 2B = 4 steps" in text
    assert "projected" in text and "CPU estimate" in text
    res = json.loads((out / "claim_vit_cet.json").read_text())
    assert [b["steps"] for b in res["budgets"]] == [2, 4]
    for b in res["budgets"]:
        for arm in ("baseline", "CET"):
            acc = b[arm]["acc"]
            assert len(acc) == 2 and all(0 <= a <= 100 and a * 32 / 100 == pytest.approx(round(a * 32 / 100))
                                         for a in acc)  # whole test images out of 32
            assert b[arm]["mean"] == pytest.approx(sum(acc) / 2)
        assert b["delta"] == pytest.approx(b["CET"]["mean"] - b["baseline"]["mean"])
        assert b["ci95"][0] <= b["delta"] <= b["ci95"][1] and b["verdict"]
    prov = res["provenance"]
    assert prov["seeds"] == [0, 1] and prov["steps"] == [2, 4] and prov["torch"] == torch.__version__
    assert prov["commit"] and prov["device"] and prov["wall_s"] > 0 and prov["mode"] == "vmap"
    md = (out / "claim_vit_cet.md").read_text()
    assert md.count("\n| 2 | ") == 1 and md.count("\n| 4 | ") == 1 and "Δ(2B) − Δ(B)" in md


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_trains_nothing(toy_cifar, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DRY_RUN", "1")
    trained = []
    monkeypatch.setattr(mc.Group, "test_acc", lambda self, data: trained.append(1))
    out = tmp_path / "out"
    assert mc.main(["--data", str(toy_cifar), "--steps", "3", "--out", str(out), "--warmup-steps", "1",
                    "--mode", "loop", *TINY]) == 0
    text = capsys.readouterr().out
    assert "warm-up (CPU estimate, loop)" in text and "B = 3 and 2B = 6 steps" in text
    assert "DRY_RUN: nothing trained" in text and "test acc" not in text
    assert not trained and not out.exists()


def test_missing_data_fails_in_one_line(tmp_path, capsys):
    where = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as e:
        mc.main(["--data", str(where), *TINY])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(where) in err and "tar xzf cifar-100-python.tar.gz" in err


def test_refuses_a_projection_over_the_budget(toy_cifar, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        mc.main(["--data", str(toy_cifar), "--steps", "50", "--budget-s", "0.5", "--out", str(tmp_path / "o"),
                 "--warmup-steps", "1", "--mode", "loop", *TINY])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "exceeds --budget-s 0" in err and not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["baseline", "CET"])
def test_vmapped_seeds_train_as_the_loop(toy_cifar, arm):
    """The same seeds, data streams and updates: after two steps the stacked parameters equal the looped models'
    (drop-path off, its random draws being the only difference); CET's correction is applied in both."""
    data = mc.load_data(str(toy_cifar), torch.device("cpu"))
    cfg, rc = mc.recipe({"depth": 1, "embed_dim": 16, "num_heads": 2, "patch_size": 8, "drop_path_rate": 0.0})
    rc["batch"] = 8
    groups = {m: mc.Group(cfg, rc, arm, [0, 1], 5, data, torch.device("cpu"), m) for m in ("loop", "vmap")}
    assert (mc.Group._cet_hook(groups["vmap"].base) is not None) == (arm == "CET")
    for g in groups.values():
        g.train_step()
        g.train_step()
    for name, stacked in groups["vmap"].params.items():
        looped = torch.stack([dict(m.named_parameters())[name] for m in groups["loop"].models])
        torch.testing.assert_close(stacked, looped, rtol=1e-4, atol=1e-5)
    assert groups["vmap"].test_acc(data) == groups["loop"].test_acc(data)


def test_augment_is_a_padded_crop_or_its_mirror():
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    out = mc.augment(x, g)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    assert out.shape == x.shape and out.dtype == torch.uint8
    for i in range(len(x)):
        windows = [padded[i, :, a:a + 32, b:b + 32] for a in range(9) for b in range(9)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(-1)) for w in windows)


@pytest.mark.slow
def test_gpu_check_sh_routes_the_dry_run_without_cuda(toy_cifar, tmp_path):
    """The user's command: `DRY_RUN=1 bash scripts/gpu_check.sh --medium-claim …` plans on a CPU (no CUDA check)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable}
    out = subprocess.run(["bash", str(repo / "scripts/gpu_check.sh"), "--medium-claim", "--data", str(toy_cifar),
                          "--steps", "2", "--out", str(tmp_path / "o"), "--warmup-steps", "1", "--mode", "loop",
                          *TINY], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "B = 2 and 2B = 4 steps" in out.stdout and "DRY_RUN: nothing trained" in out.stdout
    assert not (tmp_path / "o").exists()


def test_projection_arithmetic_and_the_steps_it_fits():
    """A step is the longer of compute and host time; the total is 3B steps plus evaluation; the B picked is the
    largest multiple of 100 within 90 % of the budget, and the dry run's lines print each part."""
    from condattn.medium_projection import Projection, fitting_steps, lines

    p = Projection(device_s=0.01, host_s={"vmap": 0.05, "loop": 0.2}, evals_s=30.0, mfu=0.241,
                   ops={"vmap": 5000, "loop": 20000})
    assert p.step_s("vmap") == 0.05 and p.step_s("loop") == 0.2 and p.mode == "vmap"
    assert p.total_s(1000) == pytest.approx(3 * 1000 * 0.05 + 30.0)
    steps = fitting_steps(p, 780.0)
    assert steps % 100 == 0 and p.total_s(steps) <= 0.9 * 780 < p.total_s(steps + 100)
    assert fitting_steps(p, 1.0) == 100  # never under 100 steps
    text = "\n".join(lines(p, steps, 780.0))
    assert f"projected GPU time (an estimate, not a measurement; the GPU run times its own warm-up): " \
           f"{p.total_s(steps):.0f} s on an H200 for B = {steps} and 2B = {2 * steps} steps, mode vmap" in text
    assert "MFU 24.1 %" in text and "vmap 0.0500 s (5000 ops), loop 0.2000 s (20000 ops)" in text
    assert "over --budget-s" not in text and "over --budget-s 100" in "\n".join(lines(p, 10_000, 100.0))


@pytest.mark.slow
def test_cpu_dry_run_projects_from_counted_flops_and_ops(tmp_path, capsys, monkeypatch):
    """A model too large to time on a CPU (depth × width × batch over CPU_HEAVY) is planned from its counted FLOPs and
    aten ops, without the data (zero images of CIFAR-100's sizes stand in) and without training or timing a step."""
    import re

    monkeypatch.setenv("DRY_RUN", "1")
    monkeypatch.setattr(mc, "step_seconds", lambda *a, **k: pytest.fail("a dry run on a CPU timed a step"))
    batch, out = mc.CPU_HEAVY // 16 + 1, tmp_path / "out"
    assert mc.main(["--data", str(tmp_path / "nowhere"), "--out", str(out), "--model",
                    "depth=1,embed_dim=16,num_heads=2,patch_size=8", "--batch", str(batch), "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "CIFAR-100 not found under" in text and "(50000 train / 10000 test images" in text
    assert "DRY_RUN: nothing trained" in text and not out.exists()
    flops = dict(re.findall(r"(baseline|CET) ([0-9.e+-]+) GFLOP", text))
    assert set(flops) == {"baseline", "CET"} and all(float(f) > 0 for f in flops.values())
    assert float(flops["CET"]) >= float(flops["baseline"])  # CET adds its correction to the same model
    mfu = float(re.search(r"MFU ([0-9.]+) %", text).group(1)) / 100
    compute = float(re.search(r"compute ([0-9.]+) s per step", text).group(1))
    assert 0.05 < mfu < 0.6
    assert compute == pytest.approx(2 * batch * sum(float(f) * 1e9 for f in flops.values()) / (mfu * 989.4e12),
                                    rel=0.01, abs=1e-4)
    host = {m: (float(s), int(n)) for m, s, n in re.findall(r"(vmap|loop) ([0-9.]+) s \((\d+) ops\)", text)}
    assert set(host) == {"vmap", "loop"} and host["loop"][1] > host["vmap"][1] > 0  # a loop dispatches per seed
    assert all(s == pytest.approx(n * 10e-6, abs=1e-4) for s, n in host.values())
    total, steps = map(int, re.search(r"GPU time .*?: (\d+) s on an H200 for B = (\d+)", text).groups())
    step = max(compute, min(n * 10e-6 for _, n in host.values()))
    assert steps % 100 == 0 and total == pytest.approx(3 * steps * step, abs=2)
    assert 3 * steps * step <= 0.9 * 780 < 3 * (steps + 100) * step + 1
