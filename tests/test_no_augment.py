"""task.augment.enabled=false: the training split is the cached evaluation tensors (the same ones the augmented
small recipe shifts), with no per-sample transform; the switch is part of a run's identity, and the runs recorded
before the key existed keep theirs."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from condattn.config import compose
from condattn.data.images import CachedImages, ShiftedImages
from condattn.data.registry import build_datasets
from condattn.engine.identity import answers, config_hash, differing_keys, science_config, variant

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)

# the small ViT's augmentation (cached tensors shifted by ±2 px) on scikit-learn's digits: a quick image bundle
DIGITS = ["task=imagenet_vit", "scale=smoke", "logger=none", "data=digits", "task.repeated_aug=1",
          "task.mixup.mixup_alpha=0", "task.mixup.cutmix_alpha=0", "task.augment.auto_augment=null",
          "task.augment.re_prob=0", "+task.augment.shift_px=2"]
OFF = "task.augment.enabled=false"


@pytest.fixture
def few_digits(monkeypatch):
    """The offline source as 20 training and 10 validation images of random 8 x 8 pixels (no package data read)."""
    import numpy as np

    from condattn.data import images

    def few(d):
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 256, (30, 8, 8), dtype=np.uint8), np.arange(30) % 10
        items = {"train": images.ArrayImages(x[:20], y[:20]), "val": images.ArrayImages(x[20:], y[20:])}
        return items, images._arrays_checksum(x, y), {"origin": "test"}

    monkeypatch.setattr(images, "_offline_source", few)


def test_no_augment_trains_on_the_cached_evaluation_tensors_without_a_per_sample_transform(few_digits, monkeypatch):
    from condattn.data.images import build_transforms

    plain_cfg = compose([*DIGITS, OFF])
    shifted, plain = build_datasets(compose(DIGITS)), build_datasets(plain_cfg)
    assert isinstance(shifted.train, ShiftedImages) and type(plain.train) is CachedImages
    # the same cached evaluation tensors as the augmented recipe, and the same held-out splits
    assert torch.equal(plain.train.x, shifted.train.x) and torch.equal(plain.train.y, shifted.train.y)
    assert all(torch.equal(plain.val[i]["pixel_values"], shifted.val[i]["pixel_values"]) for i in (0, 7, 9))
    # they are the evaluation transform's output of the training images
    img, label = plain.train.items[3]
    eval_tf = build_transforms(plain_cfg.data, plain_cfg.task.augment)[1]
    assert torch.equal(plain.train[3]["pixel_values"], eval_tf(img)) and int(plain.train[3]["labels"]) == label
    # served as they are: no transform is called per sample, and no random number is drawn
    monkeypatch.setattr(plain.train, "items", None)  # the raw images are not read again
    state = torch.get_rng_state()
    first = [plain.train[i]["pixel_values"] for i in range(5)]
    assert all(torch.equal(a, plain.train[i]["pixel_values"]) for i, a in enumerate(first))
    assert torch.equal(state, torch.get_rng_state())
    info = plain.info["train_transform"]
    assert "no augmentation (task.augment.enabled=false)" in info and "shift_px=2" in info  # inert keys named
    assert "RandomResizedCrop" not in info and plain.info["augment"]["enabled"] is False


@pytest.mark.parametrize(("bad", "match"), [
    (["task.mixup.mixup_alpha=0.8", "task.mixup.prob=1.0"], "task.mixup is on"),
    (["task.repeated_aug=3"], "task.repeated_aug=3"),
    (["task.augment.enabled=maybe"], "must be true or false"),
])
def test_no_augment_refuses_what_would_still_augment(few_digits, bad, match):
    with pytest.raises(ValueError, match=match):
        build_datasets(compose([*DIGITS, OFF, *bad]))


def test_the_switch_is_identity_and_old_records_keep_theirs():
    on, off = compose(DIGITS), compose([*DIGITS, OFF])
    assert on.task.augment.enabled is True  # declared by the task: real config
    assert science_config(on) != science_config(off) and variant(off, on) != ""
    assert differing_keys(science_config(on), science_config(off)) == [("task.augment.enabled", True, False)]
    # a run recorded before the key existed: its science config and hash are those of the same config today
    old = OmegaConf.to_container(on, resolve=True)
    del old["task"]["augment"]["enabled"]
    assert science_config(old) == science_config(on) and config_hash(science_config(old)) == \
        config_hash(science_config(on))
    assert answers(on, old) is None  # it still answers for its cell
    # ... and never for a cell that turns augmentation off (absent reads as the value every such run had)
    assert answers(off, old) == "task.augment.enabled is True there and False here"
    assert answers(off, copy.deepcopy(OmegaConf.to_container(off, resolve=True))) is None
