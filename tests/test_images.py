"""Image data (ImageNet layouts and the offline stand-ins), the ImageNet recipe's pieces (transforms, repeated
augmentation, mixup / label smoothing, top-5), one trainer run on the stand-in, and the λ-ablation table."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from condattn.config import compose
from condattn.data.images import RepeatAugEpochSampler, _fix_posterize, _posterize_keep_bits, build_transforms
from condattn.data.registry import build_datasets
from condattn.tasks.classification import ClassificationTask

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


def cfg_for(*overrides: str):
    return compose(["task=imagenet_vit", "scale=smoke", "logger=none", *overrides])


# ---------------------------------------------------------------- offline stand-ins


@pytest.mark.parametrize("data,n_train,n_val", [("mnist", 4000, 1000), ("digits", 1497, 300)])
@pytest.mark.slow
def test_offline_stand_in_bundle(data, n_train, n_val):
    cfg = compose(["task=imagenet_vit", f"data={data}", "task.repeated_aug=1"])  # a stand-in chosen directly
    b = build_datasets(cfg)
    assert (len(b.train), len(b.val), b.test) == (n_train, n_val, None)
    item = b.train[0]
    assert item["pixel_values"].shape == (3, 32, 32) and item["pixel_values"].dtype == torch.float32
    assert item["labels"].dtype == torch.long
    assert b.info["stand_in"] and "not comparable" in b.info["note"]
    assert b.info["sizes"] == {"train": n_train, "val": n_val}
    # a stratified held-out split: every class, disjoint from train, the same on a rebuild
    val_labels = np.array([b.val.items[i][1] for i in range(len(b.val))])
    assert set(np.bincount(val_labels)) == {n_val // 10}
    tr = {b.train.items.images[i].tobytes() for i in range(len(b.train))}
    assert not any(b.val.items.images[i].tobytes() in tr for i in range(len(b.val)))
    assert build_datasets(cfg).checksum == b.checksum and len(b.checksum) == 64


@pytest.mark.slow
def test_smoke_recipe_uses_the_stand_in_through_the_same_transforms():
    cfg = cfg_for()
    assert cfg.data.name == "mnist" and cfg.data.builder == "images" and cfg.model.img_size == 32
    b = build_datasets(cfg)
    assert "RandAugment" in b.info["train_transform"] and "RandomErasing" in b.info["train_transform"]
    assert "CenterCrop" in b.info["eval_transform"]
    # eval transform is deterministic, train transform is random
    assert torch.equal(b.val[3]["pixel_values"], b.val[3]["pixel_values"])
    torch.manual_seed(0)
    assert not torch.equal(b.train[3]["pixel_values"], b.train[3]["pixel_values"])


def test_shifted_images_translate_the_eval_geometry_by_at_most_k_pixels():
    from condattn.data.images import ArrayImages, ShiftedImages

    img = np.zeros((1, 8, 8), dtype=np.uint8)
    img[0, 3, 4] = 255  # one white pixel

    def tf(pil):
        return torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255.0).permute(2, 0, 1)

    ds = ShiftedImages(ArrayImages(img, np.array([7])), tf, 10, shift_px=2, fill=torch.full((3,), -1.0))
    torch.manual_seed(0)
    seen = set()
    for _ in range(200):
        item = ds[0]
        assert int(item["labels"]) == 7 and item["pixel_values"].shape == (3, 8, 8)
        (r, c), = torch.nonzero(item["pixel_values"][0] == 1.0).tolist()
        seen.add((r - 3, c - 4))
        assert set(torch.unique(item["pixel_values"][0]).tolist()) <= {-1.0, 0.0, 1.0}  # moved-in border: fill
        assert bool((item["pixel_values"][0] == -1.0).any()) == ((r, c) != (3, 4))
    assert seen == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}  # every offset of ±2 px, no other


@pytest.mark.slow
def test_small_vit_recipe_uses_cached_shifts_and_refuses_them_with_randaugment():
    cfg = compose(["task=imagenet_vit", "scale=small", "logger=none"])
    b = build_datasets(cfg)
    assert "±2 px" in b.info["train_transform"] and b.train[0]["pixel_values"].shape == (3, 32, 32)
    assert "color_jitter=0.4 is not applied" in b.info["train_transform"]  # inherited, inert, and said so
    for bad, match in ((["task.augment.auto_augment=rand-m5"], "shift_px=2"), (["data.hflip=0.5"], "hflip=0.5"),
                       (["task.augment.shift_px=32"], "smaller than the image")):
        with pytest.raises(ValueError, match=match):
            build_datasets(compose(["task=imagenet_vit", "scale=small", "logger=none", *bad]))


def test_randaugment_posterize_zero_bits_does_not_crash():
    """Pillow 13 refuses posterize(0 bits), which rand-m9-mstd0.5-inc1 reaches; we restore the old result."""
    from PIL import Image

    img = Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8))
    assert np.asarray(_posterize_keep_bits(img, 0)).max() == 0
    assert np.asarray(_posterize_keep_bits(img, 2)).max() == 192
    cfg = cfg_for()
    train, _ = build_transforms(cfg.data, cfg.task.augment)
    assert _fix_posterize(train) == 1  # the one Posterize op of rand-m9-mstd0.5-inc1 (re-pointing is idempotent)
    ops = [op for t in train.transforms for op in getattr(t, "ops", [])]
    assert any(op.name == "PosterizeIncreasing" and op.aug_fn is _posterize_keep_bits for op in ops)


# ---------------------------------------------------------------- ImageNet layouts


def _fake_imagefolder(root: Path, classes=("n01", "n02"), per_class=3) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")


def paper_cfg(root: Path, *extra: str, repeats: int = 1):
    return compose(["task=imagenet_deit", "logger=none", f"data.root={root}", "data.img_size=32",
                    f"task.repeated_aug={repeats}", *extra])


def test_imagenet_from_an_imagefolder_tree(tmp_path):
    _fake_imagefolder(tmp_path / "imagenet")
    b = build_datasets(paper_cfg(tmp_path / "imagenet", "data.num_classes=2"))
    assert b.info["source"] == "imagefolder" and not b.info["stand_in"] and b.info["classes"] == 2
    assert (len(b.train), len(b.val)) == (6, 6)
    assert b.train[0]["pixel_values"].shape == (3, 32, 32) and int(b.val[5]["labels"]) == 1
    assert "interpolation=bicubic" in b.info["eval_transform"]


def test_imagenet_from_a_saved_hugging_face_copy(tmp_path):
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)

    def split(n):
        imgs = [Image.fromarray(rng.integers(0, 255, (36, 36, 3), dtype=np.uint8)) for _ in range(n)]
        feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=3)})
        return datasets.Dataset.from_dict({"image": imgs, "label": [i % 3 for i in range(n)]}, features=feats)

    datasets.DatasetDict({"train": split(6), "validation": split(3)}).save_to_disk(str(tmp_path / "hf"))
    b = build_datasets(paper_cfg(tmp_path / "hf", "data.num_classes=3"))
    assert b.info["source"] == "hf_disk" and (len(b.train), len(b.val)) == (6, 3)
    assert b.val[2]["pixel_values"].shape == (3, 32, 32) and int(b.val[2]["labels"]) == 2


@pytest.mark.parametrize("source", ["auto", "imagefolder", "hf_disk"])
def test_missing_imagenet_names_the_path_and_the_layout(tmp_path, source):
    from condattn.data.images import check_paper_data

    root = tmp_path / "nowhere"
    cfg = paper_cfg(root, f"data.source={source}")
    for check in (build_datasets, check_paper_data):  # the run, and the cheap preflight check
        with pytest.raises(FileNotFoundError, match=str(root)) as e:
            check(cfg)
        assert "ImageFolder tree ROOT/train/<class>" in str(e.value) and "save_to_disk" in str(e.value)


def test_missing_hf_cache_fails_fast_offline(tmp_path):
    with pytest.raises(FileNotFoundError, match="Hugging Face cache") as e:
        build_datasets(paper_cfg(tmp_path, "data.source=hf_cache", f"data.hf_cache_dir={tmp_path / 'empty'}"))
    assert str(tmp_path / "empty") in str(e.value)


def test_repeated_aug_sampler_repeats_each_index_within_an_epoch():
    from condattn.data.images import RepeatAugEpochSampler

    s = RepeatAugEpochSampler(512, seed=0, num_repeats=3, block=8)
    order = list(s)
    assert len(order) == len(s) == 512  # n // 256 * 256 indices, as DeiT's RASampler keeps
    assert all(order[i] == order[i + 1] == order[i + 2] for i in range(0, 510, 3))
    halves = [list(RepeatAugEpochSampler(512, 0, r, 2, num_repeats=3, block=8)) for r in (0, 1)]
    assert sorted(halves[0] + halves[1]) == sorted(order)  # two ranks deal the same epoch between them



def test_repeat_aug_sampler_repeats_in_order_and_is_world_invariant():
    n, seed = 600, 3
    one = list(RepeatAugEpochSampler(n, seed, 0, 1, block=4))
    assert len(one) == 512  # DeiT: n // 256 * 256 indices per epoch
    assert all(one[i] == one[i + 1] == one[i + 2] for i in range(0, 510, 3))  # copies back to back
    two = [list(RepeatAugEpochSampler(n, seed, r, 2, block=4)) for r in (0, 1)]
    assert len(two[0]) == len(two[1]) == 256
    # the same global batches whatever the process count: micro-batch i of rank r is block i·world + r
    interleaved = [x for i in range(0, 256, 4) for r in (0, 1) for x in two[r][i : i + 4]]
    assert interleaved == one
    s = RepeatAugEpochSampler(n, seed, 0, 1)
    s.set_epoch(1)
    assert list(s) != one and list(RepeatAugEpochSampler(n, seed + 1, 0, 1, block=4)) != one
    assert list(RepeatAugEpochSampler(n, seed, 0, 1, block=4)) == one  # (seed, epoch) fixes the order


# ---------------------------------------------------------------- the task: mixup, smoothing, top-5


class _Acc:
    @staticmethod
    def gather_for_metrics(x):
        return x


def _toy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))
    batch = {"pixel_values": torch.randn(6, 3, 4, 4), "labels": torch.tensor([0, 1, 2, 3, 4, 5])}
    return model, batch


def test_mixup_soft_target_loss_and_label_smoothing():
    task = ClassificationTask(compose(["task=imagenet_vit", "data=mnist"]).task)  # 10 classes
    assert task.mixup is not None and task.label_smoothing == 0.1
    model, batch = _toy()
    before = batch["pixel_values"].clone()
    loss, logs = task.loss(model, batch)
    assert torch.isfinite(loss) and 0 <= float(logs["acc"]) <= 1
    assert torch.equal(batch["pixel_values"], before)  # timm mixes in place: not the caller's batch
    with pytest.raises(ValueError, match="even micro-batch"):
        task.loss(model, {k: v[:5] for k, v in batch.items()})
    smooth = ClassificationTask(OmegaConf.create({"label_smoothing": 0.1}))
    from timm.loss import LabelSmoothingCrossEntropy

    expected = LabelSmoothingCrossEntropy(0.1)(model(batch["pixel_values"]), batch["labels"])
    torch.testing.assert_close(smooth.loss(model, batch)[0], expected)


def test_lra_path_unchanged_and_top5_only_when_asked():
    model, batch = _toy()
    lra = ClassificationTask(compose([]).task)  # task=lra_listops: no mixup, no smoothing, no top-5
    assert lra.mixup is None and lra.label_smoothing == 0 and not lra.top5
    plain = F.cross_entropy(model(batch["pixel_values"]), batch["labels"])
    torch.testing.assert_close(lra.loss(model, batch)[0], plain)
    assert "top5" not in lra.evaluate(model, [batch], _Acc())
    img = ClassificationTask(compose(["task=imagenet_vit", "data=mnist"]).task)
    out = img.evaluate(model, [batch, batch], _Acc())
    logits = model(batch["pixel_values"])
    top5 = (logits.topk(5, -1).indices == batch["labels"][:, None]).any(-1).float().mean()
    assert out["n"] == 12 and out["top5"] == pytest.approx(float(top5)) and out["acc"] <= out["top5"]


# ---------------------------------------------------------------- one trainer run on the stand-in


@pytest.mark.slow
def test_train_imagenet_recipe_on_the_stand_in(tmp_path):
    from condattn.engine.trainer import train
    from condattn.utils.io import read_jsonl

    cfg = cfg_for(f"paths.runs={tmp_path}", "conditioning=spectral+embedded", "task.steps=4", "task.eval_every=2",
                  "task.log_every=1", "impl.checkpoint_every=4", "diagnostics.batch_size=2", "data.holdout_per_class=4")
    s = train(cfg)
    assert s["status"] == "finished" and s["steps"] == 4 and s["global_batch"] == 32
    assert s["patch"]["counts"] == {"spectral:timm_fused_qkv": 2, "embedded:timm_vit": 1}
    assert s["lr"] == pytest.approx(1e-3)  # lr × global_batch / lr_ref_batch
    assert s["data"]["stand_in"] and s["data"]["repeated_aug"]["requested"] == 3
    assert s["config"]["model"]["fused_attn"] == 1  # the fused-attention setting travels with the run
    assert s["diagnostics"]["step0"]["kappa_x/b0"] <= 2.0 + 1e-3
    val = [r for r in read_jsonl(Path(s["run_dir"]) / "metrics.jsonl") if r["split"] == "val"]
    assert val and all(0 <= r["acc"] <= r["top5"] <= 1 for r in val)


# ---------------------------------------------------------------- table 8 renderer


@pytest.mark.slow
def test_ablation_table_from_run_summaries(tmp_path):
    from helpers import plan_of

    from condattn.experiment import load
    from condattn.reporting.ablation import write_table

    exp = load(Path(__file__).resolve().parents[1] / "experiments" / "table8_sca_lambda.yaml")
    runs = tmp_path / "runs"
    for i, (row, spec) in enumerate(exp.rows.items()):
        if row == "lam20":
            continue  # a missing cell
        d = runs / "smoke" / f"{exp.table}_{row}_spectral_smoke_s0"
        d.mkdir(parents=True)
        lam = spec.lam
        step0 = {"entropy/mean": 2.8 / (1 + lam), "entropy/l0": 2.8 / (1 + lam), "maxprob/mean": 0.1 + 0.1 * i,
                 "gradnorm_wq/mean": 1e-2 / (1 + lam**2), "gradnorm_wk/mean": 1e-2, "gradnorm_wv/mean": 0.3,
                 "kappa_wq/mean": 1.0 + 1.0 / (1 + lam), "self_logit_unit/mean": 4.0}
        summary = {"status": "finished", "run_dir": str(d), "metrics": {"final_val_acc": 0.5 + 0.01 * i}, "steps": 50,
                   "wall_time_s": 5.0, "diagnostics": {"step0": step0}, "data": {"stand_in": True},
                   "config": {"model": {"img_size": 32, "patch_size": 8}}}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 50, "split": "val", "acc": 0.5, "top5": 0.9}) + "\n")
    md_path, md = write_table(plan_of(exp, "smoke", runs, tmp_path / "results", [0]))
    assert md_path == tmp_path / "results" / "smoke" / "table8_sca_lambda.md"
    assert "| 0 | 0 | 50.00 (n=1) | 90.00 |" in md and "| 10 | 400 | 57.00 (n=1) |" in md
    assert "| 0.25 | 0.25 | 52.00 (n=1) |" in md and "| 20 | – | missing |" in md  # λ²·4: 0.0625·4; λ = 20 no run
    assert "ln 17 = 2.833" in md and "offline stand-in data" in md
    assert (tmp_path / "results" / "smoke" / "table8_sca_lambda.png").stat().st_size > 0
    assert (tmp_path / "results" / "smoke" / "table8_sca_lambda.csv").read_text().count("\n") == 10
