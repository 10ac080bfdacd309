"""The harder vision stand-in (condattn/data/standins/mnist_variations.py, data=mnist_variations,
task=imagenet_vit_hard): a deterministic generator, a checked checksum, the trainer's data path."""

from __future__ import annotations

import numpy as np
import pytest

from condattn.config import compose
from condattn.data.registry import build_datasets
from condattn.data.standins import mnist_variations as mv

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


def toy_base(n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (n, 28, 28)).astype(np.uint8), np.arange(n) % 10


@pytest.mark.parametrize("variant", [
    "rot", "back_rand", pytest.param("back_image", marks=pytest.mark.slow),  # slow: decoding the photographs
    pytest.param("rot_back_image", marks=pytest.mark.slow)])
def test_same_seed_same_checksum_and_another_seed_another(variant):
    base = toy_base()
    a, b, c = (mv.generate(variant, s, base=base) for s in (0, 0, 1))
    assert mv.checksum(*a) == mv.checksum(*b) != mv.checksum(*c)
    assert a[0].dtype == np.uint8 and a[0].shape == base[0].shape and np.array_equal(a[1], base[1])


def test_rotation_by_zero_is_the_identity_and_by_a_right_angle_is_rot90():
    x = toy_base()[0]
    assert np.array_equal(mv.rotate(x, np.zeros(len(x))), x)
    quarter = mv.rotate(x, np.full(len(x), np.pi / 2))
    assert np.array_equal(quarter, np.rot90(x, k=-1, axes=(1, 2)))


def test_ink_over_a_background():
    d = np.array([0, 255, 128, 0], dtype=np.uint8)
    b = np.array([200, 200, 0, 0], dtype=np.uint8)
    assert mv.over(d, b).tolist() == [200, 255, 128, 0]  # no ink: background; full ink: white; black: the digit


def test_a_wrong_checksum_is_refused_in_one_line():
    images, labels = mv.generate("back_rand", 0, base=toy_base())
    good = mv.checksum(images, labels)
    assert mv.verify(images, labels, good, "toy") == good
    with pytest.raises(ValueError) as e:
        mv.verify(images, labels, "0" * 64, "toy")
    assert "\n" not in str(e.value) and "sha256" in str(e.value) and good[:16] in str(e.value)


def test_unknown_variant_and_unrecorded_seed_name_the_fix():
    with pytest.raises(ValueError, match="data.variant='spin' is not one of rot, back_rand"):
        mv.generate("spin", 0, base=toy_base())
    with pytest.raises(ValueError, match="no recorded checksum .* data.variant_seed=3.*set data.sha256"):
        mv.expected_checksum("rot", 3)
    assert mv.expected_checksum("rot", 3, "ab" * 32) == "ab" * 32


def test_the_small_recipe_composes_the_hard_stand_in_on_the_vit_split():
    cfg = compose(["task=imagenet_vit_hard", "scale=small", "logger=none"])
    vit = compose(["task=imagenet_vit", "scale=small", "logger=none"])
    assert (cfg.data.source, cfg.data.name, cfg.task.name) == ("mnist_variations", "mnist_rot", "imagenet_vit_hard")
    # the search's pick (the recipe's comment): 100 training images per class, 3,500 test, no repeated augmentation
    assert (cfg.data.train_per_class, cfg.data.test_per_class, cfg.task.repeated_aug) == (100, 350, 1)
    for key in ("holdout_per_class", "split_seed", "img_size"):
        assert cfg.data[key] == vit.data[key], key
    assert cfg.model == vit.model and cfg.optim.lr == 2e-3 and cfg.task.steps == 4000
    assert {k: v for k, v in cfg.optim.items() if k != "lr"} == {k: v for k, v in vit.optim.items() if k != "lr"}


@pytest.mark.slow
def test_the_full_variants_match_their_recorded_checksums():
    for variant in mv.VARIANTS:
        assert mv.checksum(*mv.generate(variant, 0)) == mv.CHECKSUMS[variant, 0], variant


@pytest.mark.slow
def test_loads_through_the_trainers_data_path_and_refuses_a_wrong_checksum():
    cfg = compose(["task=imagenet_vit_hard", "scale=small", "logger=none"])
    b = build_datasets(cfg)
    assert (len(b.train), len(b.val), len(b.test)) == (1000, 500, 3500)
    assert b.info["stand_in"] and "rot" in b.info["origin"] and b.info["dataset"] == "mnist_rot"
    assert b.train[0]["pixel_values"].shape == (3, 32, 32)
    assert build_datasets(cfg).checksum == b.checksum
    # every split is drawn from the generated variant, and none shares a digit with another
    generated = {img.tobytes(): i for i, img in enumerate(mv.generate("rot", 0)[0])}
    idx = {s: {generated[img.tobytes()] for img in getattr(b, s).items.images} for s in ("train", "val", "test")}
    assert [len(v) for v in idx.values()] == [1000, 500, 3500]
    assert not (idx["train"] & idx["test"]) and not (idx["val"] & idx["test"]) and not (idx["train"] & idx["val"])
    bad = compose(["task=imagenet_vit_hard", "scale=small", "logger=none", "data.variant=back_image",
                   f"data.sha256={'0' * 64}"])  # another variant, a wrong checksum
    with pytest.raises(ValueError, match=r"^mnist_variations back_image seed 0: the generated arrays' sha256 [^\n]*$"):
        build_datasets(bad)


@pytest.mark.slow
def test_one_training_step_on_the_hard_stand_in(tmp_path):
    from condattn.engine.trainer import train

    cfg = compose(["task=imagenet_vit_hard", "scale=smoke", "logger=none", f"paths.runs={tmp_path}", "task.steps=1",
                   "task.eval_every=1", "impl.checkpoint_every=1", "diagnostics.batch_size=2",
                   "data.holdout_per_class=4"])
    s = train(cfg)
    assert s["status"] == "finished" and s["steps"] == 1
    assert s["data"]["dataset"] == "mnist_back_image" and s["data"]["checksum"] and s["data"]["stand_in"]
    assert 0.0 <= s["metrics"]["final_val_acc"] <= 1.0


@pytest.mark.slow
def test_floors_of_a_task_no_table_has_are_cached_under_its_name(tmp_path, monkeypatch, capsys):
    from condattn.floors import compute as floors

    seen = []

    def fake(cfg, bundle, metric):
        seen.append((cfg.data.name, metric, len(bundle.train)))
        return [floors._floor("majority class", 0.1, "test", 0.0)]

    monkeypatch.setattr(floors, "compute", fake)
    args = ["--scale", "small", "--results", str(tmp_path), "--task", "imagenet_vit_hard", "--overrides",
            "data.variant=back_rand"]
    assert floors.main(args) == 0 and seen == [("mnist_back_rand", "final_test_acc", 1000)]
    path = tmp_path / "small" / "floors" / "task_imagenet_vit_hard.json"
    entry = floors.load(tmp_path, "small", "task_imagenet_vit_hard")["imagenet_vit_hard"]
    assert path.is_file() and entry["data"] == "mnist_back_rand" and entry["overrides"] == ["data.variant=back_rand"]
    assert floors.main(args) == 0 and len(seen) == 1 and "cached" in capsys.readouterr().out  # the same data: cached
    with pytest.raises(SystemExit):
        floors.main([*args[:-1], "data.variant=spin"])
    assert "data.variant='spin' is not one of" in capsys.readouterr().err


def test_fewer_training_images_per_class_is_a_stratified_subset():
    from condattn.data.images import _train_subset

    y = np.repeat(np.arange(10), 30)
    train = np.arange(0, 300, 2)  # 15 per class
    sub = _train_subset(train, y, 4, 1234)
    assert set(np.bincount(y[sub])) == {4} and set(sub) <= set(train)
    assert np.array_equal(sub, _train_subset(train, y, 4, 1234))
    with pytest.raises(ValueError, match="data.train_per_class=16 but the smallest class has 15 training images"):
        _train_subset(train, y, 16, 1234)


@pytest.mark.slow
def test_train_per_class_leaves_the_held_out_splits_alone():
    base = ["task=imagenet_vit_hard", "scale=small", "logger=none", "data.variant=back_rand",
            "data.train_per_class=null", "data.test_per_class=100"]
    full, few = build_datasets(compose(base)), build_datasets(compose([*base, "data.train_per_class=100"]))
    assert (len(full.train), len(few.train)) == (3500, 1000) and few.info["train_per_class"] == 100
    assert np.array_equal(full.test.items.images, few.test.items.images)
    assert np.array_equal(full.val.items.images, few.val.items.images) and full.checksum != few.checksum


@pytest.mark.slow
def test_the_three_way_split_holds_out_what_it_asks_or_refuses():
    """50 validation + 350 test of each class's 500 digits: exactly that (before: silently at most half a class, so
    350 became 200); asking more than a class holds is one line naming both keys."""
    base = ["task=imagenet_vit_hard", "scale=small", "logger=none"]
    b = build_datasets(compose(base))
    assert (len(b.train), len(b.val), len(b.test)) == (1000, 500, 3500)
    with pytest.raises(ValueError, match=r"^data.holdout_per_class \+ data.test_per_class = 500 held-out images per "
                                         r"class, but class 0 has 500: hold out fewer"):
        build_datasets(compose([*base, "data.test_per_class=450"]))
