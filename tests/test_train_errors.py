"""`python -m condattn.train` refuses bad input like `reproduce`: one line per problem on stderr, exit 2, nothing
written (no run dir, no Hydra output dir)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from condattn.train import cli

REPO = Path(__file__).resolve().parents[1]

BAD = [
    (["conditioning.lamda=1"], "override 'conditioning.lamda=1' names no key of the config; did you mean "
                               "conditioning.lam?"),
    (["conditioning=spectal"], "override 'conditioning=spectal': there is no configs/conditioning/spectal.yaml; did "
                               "you mean conditioning=spectral? available: "),
    (["seed=abc"], "seed='abc' must be an integer 0 ≤ seed < 2**32 (4,294,967,296), e.g. seed=0"),
    (["seed=1.5"], "seed=1.5 must be an integer 0 ≤ seed < 2**32 (4,294,967,296), e.g. seed=0"),
    (["task.batch_size=0"], "task.batch_size=0 must be a positive integer (the global batch)"),
    (["impl.micro_batch_size=0"], "impl.micro_batch_size=0 must be a positive integer"),
    (["conditioning=spectral", "conditioning.lam=-1"], "conditioning.lam=-1 must be a finite number ≥ 0"),
    (["conditioning.lam=2"], "override 'conditioning.lam=2' does not apply to conditioning=none: it is an option of "
                             "spectral (SCA); add conditioning=spectral (or spectral+embedded, qk_norm+spectral), "
                             "or drop it"),
    (["conditioning=spectral", "conditioning.solver=svd"], "override 'conditioning.solver=svd' does not apply to "
                                                           "conditioning=spectral: it is an option of embedded (CET)"),
    (["conditioning=spectral", "conditioning.identity=diagonal"], "conditioning option identity='diagonal' is invalid"),
    (["task=imagenet_vit", "model.model_name=vit_tiny_patch16_22"], "model.model_name='vit_tiny_patch16_22' is not a "
                                                                    "timm model (timm "),
    (["task=imagenet_vit", "model.model_name=nothing_like_it"], "model.model_name='nothing_like_it' is not a timm "
                                                                "model"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
@pytest.mark.slow
def test_each_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, overrides, message):
    assert cli(["scale=smoke", "logger=none", f"paths.runs={tmp_path / 'runs'}", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"[condattn] {message}"), err
    assert not (tmp_path / "runs").exists()


def test_a_sweep_is_checked_job_by_job(tmp_path, capsys):
    assert cli(["-m", "scale=smoke", "logger=none", f"paths.runs={tmp_path}", "conditioning=spectral",
                "conditioning.lam=1,-2"]) == 2
    assert capsys.readouterr().err.strip() == \
        "[condattn] conditioning.lam=-2 must be a finite number ≥ 0 (λ = 0 adds nothing; the SCA paper's default is 10)"


def test_good_input_is_handed_to_hydra(tmp_path):
    assert cli(["scale=smoke", "logger=none", f"paths.runs={tmp_path}", "conditioning=spectral",
                "conditioning.lam=2"]) is None
    assert cli(["--cfg", "job", "model=nope"]) is None  # Hydra's own inspection flags pass through


@pytest.mark.slow
def test_cli_refusal_writes_nothing_anywhere(tmp_path):
    """Through `python -m`: one line, exit 2, and neither Hydra (outputs/, .hydra, train.log) nor the trainer
    creates a directory; the same for the issue's examples."""
    for bad in (["conditioning.lamda=1"], ["seed=abc"], ["task.batch_size=0"]):
        out = subprocess.run([sys.executable, "-m", "condattn.train", "scale=smoke", "logger=none",
                              f"paths.runs={tmp_path / 'runs'}", *bad], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "Traceback" not in out.stderr and "+conditioning" not in out.stderr
        assert list(tmp_path.iterdir()) == []
