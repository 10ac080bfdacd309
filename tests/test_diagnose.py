"""`python -m condattn.diagnose`: per-layer table baseline → conditioned, png + json, errors."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from condattn.diagnose import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("diag_cache")


def tiny(cache: Path, *extra: str) -> list[str]:
    return [
        "scale=smoke", f"paths.cache={cache}", "data.generate.train=64", "data.generate.val=16",
        "data.generate.test=16", "data.generate.max_length=120", "data.max_length=128", "data.seq_len=128", *extra,
    ]


@pytest.mark.slow
def test_spectral_table_json_and_plot(tmp_path, cache, capsys):
    assert main(["--out", str(tmp_path), *tiny(cache, "conditioning=spectral", "conditioning.lam=2")]) == 0
    out = capsys.readouterr().out
    assert "κ(W_Q)" in out and "‖∇W_K‖" in out and out.count(" → ") >= 18  # 9 columns × 2 layers
    assert "lam=2.0" in out and "scale=smoke seed=0 batch=4" in out and "commit " in out
    r = json.loads((tmp_path / "nystromformer_lra_spectral_smoke.json").read_text())
    assert (tmp_path / "nystromformer_lra_spectral_smoke.png").stat().st_size > 10_000
    base, cond = r["baseline"]["flat"], r["conditioned"]["flat"]
    for i in range(2):
        assert cond[f"kappa_wq/l{i}"] < base[f"kappa_wq/l{i}"]
        assert cond[f"kappa_x/b{i}"] > 0 and base[f"gradnorm_wq/l{i}"] > 0
    assert base["kappa_x/b0"] == pytest.approx(cond["kappa_x/b0"])  # same weights, same batch: SCA acts later
    p = r["provenance"]
    assert p["method"] == "spectral" and p["options"]["lam"] == 2.0 and p["batch"] == 4 and p["data"]["stand_in"]
    assert r["patch"]["counts"] == {"spectral:hf_separate_qkv": 2}


@pytest.mark.slow
def test_embedded_via_method_flag_default_out_dir(tmp_path, cache, capsys):
    assert main(["--method", "embedded", "--batch", "3", *tiny(cache, f"paths.results={tmp_path}")]) == 0
    out = capsys.readouterr().out
    js = tmp_path / "exploratory" / "diagnose" / "nystromformer_lra_embedded_smoke.json"  # ignored by git
    assert str(js) in out and js.with_suffix(".png").exists()
    r = json.loads(js.read_text())
    assert r["provenance"]["batch"] == 3
    assert r["conditioned"]["blocks"][0]["kappa_max"] <= 2.05 < r["baseline"]["blocks"][0]["kappa_min"]
    # one model, deep-copied: the stored weights of both arms are identical
    assert r["conditioned"]["flat"]["kappa_wq/l1"] == r["baseline"]["flat"]["kappa_wq/l1"]


@pytest.mark.slow
def test_cli_subprocess_with_jacobian(tmp_path, cache):
    cmd = [sys.executable, "-m", "condattn.diagnose", "--jacobian", "--jacobian-tokens", "8", "--out", str(tmp_path),
           *tiny(cache, "conditioning=spectral")]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "κ(J)" in res.stdout and "SUBSAMPLED: the first 8 of" in res.stdout and " → " in res.stdout
    r = json.loads((tmp_path / "nystromformer_lra_spectral_smoke.json").read_text())
    jb, jc = r["baseline"]["jacobian"], r["conditioned"]["jacobian"]
    assert jb["solver"] == jc["solver"] == "exact" and jb["tokens"] == 8 and jb["subsampled"] == "--jacobian-tokens"
    assert jb["J_shape"] == [8 * 32, 3 * 64 * 32] and jb["tokens_total"] > 8
    assert math.isfinite(jb["kappa"]) and math.isfinite(jc["kappa"]) and jc["kappa"] < jb["kappa"]


def test_jacobian_matrix_free_on_a_timm_vit():
    """Nothing Nyströmformer-specific: a timm ViT goes through the same helpers (too wide for exact κ(J))."""
    from helpers import tiny_vit

    import condattn
    from condattn.diagnose import jacobian_kappa, measure
    from condattn.tasks.classification import ClassificationTask

    model, task = tiny_vit(), ClassificationTask(None)
    condattn.apply_conditioning(model, "spectral")
    batch = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
             "labels": torch.tensor([1, 2])}
    assert measure(model, task, batch)["flat"]["kappa_wq/l0"] < 2
    j = jacobian_kappa(model, task, batch, None)
    assert j["solver"] == "matrix-free" and j["tokens"] == 17 and j["info"]["converged"] and j["kappa"] < 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "bogus"], "valid methods: none, spectral, embedded, spectral+embedded"),
        (["conditioning=bogus"], "diagnose: override 'conditioning=bogus': there is no configs/conditioning/bogus"),
        (["model.no_such_key.x=1"], "diagnose: override 'model.no_such_key.x=1' names no key of the config"),
        (["--method", "embedded", "conditioning=spectral"], "contradicts"),
    ],
)
def test_errors_exit_nonzero(cache, capsys, args, message):
    assert main([*args, *tiny(cache)]) != 0
    err = capsys.readouterr()
    assert message in err.err + err.out
