"""Model FLOPs, peaks and MFU (engine/flops.py), precision / compile / fused AdamW per device (engine/precision.py),
the dry run's cost estimate (engine/cost.py), the loader bench and the GPU check's fail-fast."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from condattn.config import compose
from condattn.engine.cost import cell_cost, describe_cost, loader_warning, training_flops_per_sample
from condattn.engine.flops import count_flops, mfu, peak_flops
from condattn.engine.precision import resolve_execution

REPO = Path(__file__).resolve().parents[1]
VIT_B_FORWARD = 35.1e9  # 17.6 GMAC at 224² (DeiT's and timm's tables), 2 FLOPs per multiply-add


def test_vit_b16_forward_flops_match_the_known_figure():
    import timm

    with torch.device("meta"):
        model = timm.create_model("vit_base_patch16_224")
        x = torch.randn(2, 3, 224, 224)
    fwd = count_flops(lambda: model(x)) / 2
    assert abs(fwd - VIT_B_FORWARD) / VIT_B_FORWARD < 0.05, fwd


def test_cpu_attention_is_counted_like_the_meta_decomposition():
    """On CPU, SDPA runs a flash kernel torch's counter has no formula for; ours counts it (forward and backward),
    so a real CPU count equals the meta count (where SDPA decomposes into counted bmm)."""
    import timm

    def build(device):
        torch.manual_seed(0)
        with torch.device(device):
            return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)

    counts = []
    for device in ("cpu", "meta"):
        model, x = build(device), torch.randn(2, 3, 32, 32, device=device)
        counts.append(count_flops(lambda m=model, x=x: m(x).sum().backward()))
    assert counts[0] == counts[1] > 0


def test_peaks_and_mfu():
    assert peak_flops("NVIDIA H200", "bf16") == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756.5e12)
    assert peak_flops("NVIDIA H100 80GB HBM3", "no") == pytest.approx(66.9e12)  # accelerate's "no" = fp32
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(312e12)
    assert peak_flops("NVIDIA L40S", "bf16") == pytest.approx(362.1e12)
    assert peak_flops("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 tensor cores
    assert peak_flops("x86_64", "fp32") is None
    # ViT-B/16 at 3.4k img/s on one H200 in bf16 is ≈ 36% MFU by the 105 GFLOP/sample count
    assert mfu(105.15e9, 3400, "NVIDIA H200", "bf16") == pytest.approx(105.15e9 * 3400 / 989.4e12)
    assert mfu(105.15e9, 3400, "NVIDIA H200", "bf16", devices=2) == pytest.approx(mfu(105.15e9, 1700, "H200", "bf16"))
    assert mfu(1e9, 10, "cpu", "fp32") is None


def test_precision_compile_and_fused_adamw_resolve_per_device():
    impl = OmegaConf.create({"precision": "bf16", "compile": True, "fused_adamw": "auto"})
    cuda, cpu = resolve_execution(impl, "cuda"), resolve_execution(impl, "cpu")
    assert (cuda.precision, cuda.compile, cuda.fused_adamw, cuda.dtype_name) == ("bf16", True, True, "bf16")
    assert (cpu.precision, cpu.compile, cpu.fused_adamw, cpu.dtype_name) == ("no", False, False, "fp32")
    assert cpu.requested_precision == "bf16"
    forced = OmegaConf.create({"precision": "bf16", "cpu_precision": "bf16", "cpu_compile": True, "fused_adamw": False})
    f = resolve_execution(forced, "cpu")
    assert (f.precision, f.compile, f.fused_adamw) == ("bf16", True, False)
    with pytest.raises(ValueError, match=r"impl.precision='fp8': choose no, bf16 or fp16"):
        resolve_execution(OmegaConf.create({"precision": "fp8"}), "cuda")
    with pytest.raises(ValueError, match=r"impl.fused_adamw='maybe': choose auto, true or false"):
        resolve_execution(OmegaConf.create({"fused_adamw": "maybe"}), "cuda")


def test_default_configs_resolve_to_fp32_on_cpu():
    cfg = compose(["task=imagenet_vit", "scale=paper", "impl.precision=bf16"])
    ex = resolve_execution(cfg.impl, "cpu")
    assert ex.precision == "no" and not ex.compile and not ex.fused_adamw
    assert resolve_execution(cfg.impl, "cuda").precision == "bf16"


@pytest.mark.slow
def test_cost_of_a_paper_cell_follows_flops_samples_peak_and_mfu():
    ov = ["task=imagenet_vit", "scale=paper", "launcher=slurm", "launcher.gpu_type=H100", "launcher.assumed_mfu=0.5",
          "impl.worker_samples_per_s.images=null", "launcher.min_step_ms=null"]  # FLOPs alone (floors: next test)
    fp32 = cell_cost("vit", compose([*ov, "impl.precision=no"]))
    bf16 = cell_cost("vit", compose([*ov, "impl.precision=bf16"]))
    assert abs(fp32.flops_per_sample - 3 * VIT_B_FORWARD) / (3 * VIT_B_FORWARD) < 0.05
    assert fp32.samples == 375300 * 1024
    train = fp32.gpu_hours - fp32.eval_hours  # + 301 evaluations of the 50,000 validation images (a forward each)
    assert train == pytest.approx(fp32.flops_per_sample * fp32.samples / (66.9e12 * 0.5) / 3600)
    assert fp32.eval_hours == pytest.approx(train * 301 * 50000 / (3 * fp32.samples))
    assert bf16.precision == "bf16" and fp32.gpu_hours / bf16.gpu_hours == pytest.approx(989.4 / 66.9)
    cet, _ = training_flops_per_sample(compose([*ov, "conditioning=embedded"]))
    assert cet > fp32.flops_per_sample  # CET's Newton–Schulz correction is counted on top of the model


@pytest.mark.slow
def test_weight_only_readings_cost_the_model_they_leave_and_cet_beside_them_keeps_its_cost():
    ov = ["task=imagenet_vit", "scale=paper", "launcher=slurm", "impl.worker_samples_per_s.images=null",
          "launcher.min_step_ms=null"]
    flops = {m: cell_cost(m, compose([*ov, *extra])).flops_per_sample for m, extra in {
        "none": [], "init": ["conditioning=spectral", "conditioning.mode=init"],
        "cinit": ["conditioning=conditioned_init"], "cet": ["conditioning=embedded"],
        "both_init": ["conditioning=spectral+embedded", "conditioning.mode=init"]}.items()}
    assert flops["init"] == flops["cinit"] == flops["none"]
    assert flops["both_init"] == flops["cet"] > flops["none"]


@pytest.mark.slow
def test_the_cpu_fallback_feeds_ids_inside_the_models_vocabulary():
    """SCA's svd correction reads values, so ListOps (vocabulary 20) is counted on CPU: the synthetic ids must be
    valid there (they were drawn from 5..99 and the embedding raised IndexError: no estimate)."""
    flops, how = training_flops_per_sample(compose(["task=lra_listops", "scale=small", "conditioning=spectral",
                                                    "conditioning.correction=svd"]))
    assert how.startswith("counted on CPU") and flops > 0


def test_cost_floors_for_what_flops_do_not_see():
    """A cell never costs less than its data workers can feed (samples / (workers × rate)) nor less than its steps
    at launcher.min_step_ms: tiny models (CIFAR, LRA) are bound by those, not by FLOPs."""
    ov = ["task=imagenet_vit", "scale=medium", "launcher=slurm", "launcher.cpus_per_task=8"]
    loader = cell_cost("c", compose([*ov, "impl.worker_samples_per_s.cifar=1000", "launcher.min_step_ms=null"]))
    train = loader.gpu_hours - (loader.eval_hours or 0.0)
    assert train == pytest.approx(39000 * 128 / (7 * 1000) / 3600) and "loader-bound" in loader.note
    step = cell_cost("c", compose([*ov, "impl.worker_samples_per_s.cifar=1e9", "launcher.min_step_ms=100"]))
    train = step.gpu_hours - (step.eval_hours or 0.0)
    assert train == pytest.approx(39000 * 0.1 / 3600) and "step-bound" in step.note and "(assumed" in step.note


def test_dry_run_cost_lines_total_and_detection_not_estimated():
    cells = [(f"listops_{m}", compose(["scale=smoke", f"conditioning={m}"])) for m in ("none", "spectral")]
    cells.append(("detr", compose(["task=coco_detr_r50", "scale=smoke"])))
    lines = describe_cost("t", cells)
    assert "cost estimate (H100, launcher.gpu_type; training steps and evaluations" in lines[0]
    assert "listops_none:" in lines[1] and "GPU-hours" in lines[1]
    assert "detection" in lines[3] and "→ – GPU-hours" in lines[3]
    assert lines[4].startswith("[reproduce] t: 3 runs,") and "(1 cell(s) not estimated)" in lines[4]


def test_loader_warning_when_cpus_cannot_feed_the_gpu():
    ov = ["task=imagenet_vit", "scale=paper", "launcher=slurm", "launcher.gpu_type=H200", "impl.precision=bf16",
          "impl.worker_samples_per_s.images=100"]
    fps = 105e9  # H200 at 40% bf16: 989.4e12 * 0.4 / 105e9 ≈ 3769 img/s; 7 workers × 100 = 700
    w = loader_warning(compose([*ov, "launcher.cpus_per_task=8"]), fps)
    assert w is not None and "launcher.cpus_per_task=8" in w and "set launcher.cpus_per_task=39 or more" in w
    assert loader_warning(compose([*ov, "launcher.cpus_per_task=48"]), fps) is None
    no_rate = [*ov[:-1], "impl.worker_samples_per_s.images=null", "launcher.cpus_per_task=8"]
    assert loader_warning(compose(no_rate), fps) is None  # no measured rate: silent


def test_loader_bench_measures_every_option_on_a_replica(tmp_path):
    from condattn.data import loader_bench

    root = loader_bench.write_imagenet_replica(tmp_path / "imagenet", n=4, classes=2)
    assert len(list((root / "train").glob("*/*.JPEG"))) == 4
    cfg = compose(["task=imagenet_vit", "scale=paper", f"data.root={root}", "data.img_size=64"])
    options = loader_bench.imagenet_options(cfg)
    assert list(options) == ["pil", "pil+prefetcher", "pil-draft+prefetcher"]
    assert options["pil"][0][0].dtype == torch.float32 and options["pil+prefetcher"][0][0].dtype == torch.uint8
    n = torch.get_num_threads()
    try:
        rows = loader_bench.samples_per_s(options, seconds=0.01, per_round=1)
    finally:
        torch.set_num_threads(n)
    assert set(rows) == set(options) and all(v["samples_per_s_per_worker"] > 0 for v in rows.values())
    assert rows["pil"]["ratio_to_first"] == 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
@pytest.mark.slow
def test_gpu_check_fails_fast_without_cuda():
    out = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PY": sys.executable})
    assert out.returncode == 2
    assert "gpu_check: no CUDA device visible to torch" in out.stderr


@pytest.mark.gpu
def test_bf16_autocast_fused_adamw_and_mfu_on_cuda(tmp_path):
    from condattn.engine.trainer import train

    s = train(compose(["scale=smoke", "logger=none", f"paths.runs={tmp_path}", f"paths.cache={tmp_path / 'c'}",
                       "task.steps=4", "task.eval_every=4", "task.log_every=2", "impl.precision=bf16"]))
    assert s["execution"]["device_type"] == "cuda" and s["execution"]["precision"] == "bf16"
    assert s["execution"]["fused_adamw"] is True
    assert s["performance"]["train_flops_per_sample"] > 0 and s["performance"]["mfu"] is not None


@pytest.mark.slow
def test_cpu_run_is_fp32_records_execution_and_logs_throughput(tmp_path):
    """A recipe asking for bf16 + compile still runs fp32, uncompiled, on CPU; summary.json says what was used and
    metrics.jsonl gets `perf` rows (samples/s; no MFU on CPU), never in the train/val rows."""
    from condattn.engine.trainer import train
    from condattn.utils.io import read_jsonl

    s = train(compose(["scale=smoke", "logger=none", f"paths.runs={tmp_path}", f"paths.cache={tmp_path / 'c'}",
                       "data.generate.train=64", "data.generate.val=16", "data.generate.test=16",
                       "data.generate.max_length=60", "data.max_length=64", "data.seq_len=64", "task.batch_size=8",
                       "task.steps=4", "task.eval_every=4", "task.log_every=2", "impl.precision=bf16",
                       "impl.compile=true"]))
    assert s["execution"] == {"device_type": "cpu", "precision": "no", "requested_precision": "bf16",
                              "compile": False, "compile_mode": None, "fused_adamw": False,
                              "compile_reason": "impl.cpu_compile=false"}
    assert s["performance"]["train_samples_per_s"] > 0 and "mfu" not in s["performance"]
    rows = read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")
    perf = [r for r in rows if r["split"] == "perf"]
    assert [r["step"] for r in perf] == [2, 4] and all(r["samples_per_s"] > 0 and "mfu" not in r for r in perf)
    assert not any("samples_per_s" in r for r in rows if r["split"] in ("train", "val"))


@pytest.mark.slow
def test_reproduce_dry_run_prints_the_cost_and_one_loader_warning_per_model(tmp_path, capsys):
    from condattn.reproduce import main

    args = ["experiments/table1_imagenet.yaml", "--scale", "paper", "--launcher", "slurm", "--dry-run",
            f"paths.runs={tmp_path}", "launcher.gpu_type=H200", "launcher.assumed_mfu=0.45", "impl.precision=bf16"]
    with pytest.MonkeyPatch.context() as mp:  # two rows are enough: ViT-B and Swin-B
        from condattn.experiment import Experiment

        rows = Experiment.rows_at
        mp.setattr(Experiment, "rows_at",
                   lambda exp, scale: [r for r in rows(exp, scale) if r in ("vit_base", "swin_base")])
        assert main(args) == 0
    out = capsys.readouterr().out
    assert "cost estimate (H200, launcher.gpu_type; training steps and evaluations" in out and "at 45% MFU" in out
    import re

    # impl.precision=bf16 changes what the runs compute, so their names carry a variant hash (engine/identity.py)
    assert re.search(r"table1_imagenet_vit_base_spectral_paper_s0(-[0-9a-f]{8})?: 105 GFLOP/sample × 384,307,200 "
                     r"samples", out)
    assert "table1_imagenet: 8 runs," in out and "GPU-hours on H200 at 45% MFU" in out
    warnings = [ln for ln in out.splitlines() if ln.startswith("[reproduce] warning: ")]
    assert len(warnings) == 2 and warnings[0].startswith("[reproduce] warning: vit_base_patch16_224: launcher.cpus_per")
