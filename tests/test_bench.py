"""`python -m condattn.bench`: one run prints every arm beside baseline and writes its provenance."""

import json

import pytest

from condattn.bench import main


@pytest.mark.slow
def test_bench_runs_all_arms_and_writes_results(tmp_path, capsys):
    assert main(["--models", "nystromformer_lra_listops", "--batch", "1", "--warmup", "0", "--iters", "1",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    arms, refused = data["results"][0]["arms"], data["results"][0].get("refused", {})
    for arm in ("baseline", "SCA", "CET-svd", "CET-fast", "QK-norm", "σReparam", "σReparam-role", "mimetic", "NS-attn",
                "gated", "gated-head", "soft-cap", "sink", "QK-clip"):  # timed, or not run with its reason
        assert f"| nystromformer_lra_listops | 1 | {arm} |" in out or \
            f"nystromformer_lra_listops: {arm} not run: {refused[arm]}" in out
    # Nyströmformer builds its own softmax (landmarks): the logit methods cannot reach it, the rest are timed
    assert set(refused) <= {"soft-cap", "sink", "QK-clip"} and "SCA" in arms and "gated" in arms
    assert arms["baseline"]["ratio_to_baseline"] == 1.0 and arms["SCA"]["step_ms"] > 0
    assert "commit" in data["header"] and data["versions"]["torch"]


def test_bench_has_an_arm_for_every_registered_method():
    """Every plain registered method is timed (a composite is the sum of its parts' arms); conditioned_init and
    mimetic init, init-only, cost the baseline's step by construction."""
    from condattn.bench import bench_arms
    from condattn.conditioning import METHODS, method_spec

    timed = {m for m, _ in bench_arms().values()}
    plain = {m for m in METHODS if not method_spec(m).parts}
    assert plain - timed <= {"conditioned_init"}, sorted(plain - timed)


def test_bench_refuses_unknown_model():
    with pytest.raises(SystemExit):
        main(["--models", "resnet_9000"])


@pytest.mark.slow
def test_bench_zoo_small_members_all_arms(tmp_path, capsys):
    """Every small vision zoo member goes through all four arms (the paper members only differ in size)."""
    from condattn.bench import ZOO, bench_arms

    small = [m for m in ZOO if m.endswith("_32")]
    assert len(small) == 5 and len(ZOO) == 10
    assert main(["--models", *small, "--batch", "2", "--warmup", "0", "--iters", "1", "--out", str(tmp_path)]) == 0
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [r["model"] for r in data["results"]] == small
    for r in data["results"]:
        assert set(r["arms"]) | set(r.get("refused", {})) == set(bench_arms())  # run, or refused in one line
        assert all("\n" not in why for why in r.get("refused", {}).values())
        assert all(v["step_ms"] > 0 for v in r["arms"].values())
