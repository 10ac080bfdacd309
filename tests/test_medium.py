"""The medium scale: CIFAR read from replicas of its official python releases (the pickles the archives unpack to),
a few-step medium run of one vision family through the real entry point, and every medium cell composing."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from condattn.config import compose
from condattn.data import cifar

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


def write_cifar_release(out: Path, classes: int, n_train: int = 40, n_test: int = 20, seed: int = 0) -> Path:
    """A replica of the official release: the same folder, file names, pickle protocol and dict keys (bytes keys,
    as the release's Python 2 pickles load with encoding='bytes'), uint8 rows of 3072 = 3 planes of 32×32."""
    rng = np.random.default_rng(seed)
    folder, train_files, test_file, label_key = cifar.RELEASES[classes]
    root = out / folder
    root.mkdir(parents=True, exist_ok=True)

    def dump(name: str, n: int) -> None:
        d = {b"batch_label": name.encode(), b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             label_key.encode(): [int(v) for v in rng.integers(0, classes, n)],
             b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
        if classes == 100:
            d[b"coarse_labels"] = [int(v) // 5 for v in d[label_key.encode()]]
        with open(root / name, "wb") as f:
            pickle.dump(d, f, protocol=2)

    for name in train_files:
        dump(name, n_train // len(train_files))
    dump(test_file, n_test)
    meta = "batches.meta" if classes == 10 else "meta"
    with open(root / meta, "wb") as f:
        pickle.dump({b"label_names" if classes == 10 else b"fine_label_names":
                     [f"class{i}".encode() for i in range(classes)]}, f, protocol=2)
    return root


@pytest.mark.parametrize("classes", [10, 100])
def test_cifar_release_read_from_the_folder_or_its_parent(tmp_path, classes):
    folder = write_cifar_release(tmp_path, classes, n_train=50, n_test=20)
    for root in (tmp_path, folder):
        arrays, checksum, info = cifar.load(root, classes)
        x, y = arrays["train"]
        assert x.shape == (50, 32, 32, 3) and x.dtype == np.uint8 and len(y) == 50
        assert arrays["val"][0].shape == (20, 32, 32, 3) and info["classes"] == classes
    with open(folder / cifar.RELEASES[classes][2], "rb") as f:  # pixel order: 3 planes of 32×32, row-major
        raw = pickle.load(f, encoding="bytes")[b"data"][0]
    assert np.array_equal(arrays["val"][0][0][..., 1], raw[1024:2048].reshape(32, 32))


def test_missing_or_wrong_cifar_release_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar-100-python.*cifar-100-python.tar.gz"):
        cifar.find_root(tmp_path, 100)
    write_cifar_release(tmp_path, 100)
    (tmp_path / "cifar-10-batches-py").symlink_to(tmp_path / "cifar-100-python")
    with pytest.raises(FileNotFoundError):  # CIFAR-100 files are not CIFAR-10's names
        cifar.find_root(tmp_path, 10)
    with pytest.raises(ValueError, match="data.classes=10 or data.classes=100"):
        cifar.find_root(tmp_path, 20)


@pytest.mark.parametrize("task", ["imagenet_vit", "imagenet_deit", "imagenet_swin", "imagenet_xcit",
                                  "imagenet_davit"])
def test_medium_vision_recipes_compose_and_build(task):
    import torch

    from condattn.models import build_model

    cfg = compose([f"task={task}", "scale=medium", "logger=none"])
    assert cfg.data.source == "cifar" and cfg.data.num_classes == 100 and cfg.task.steps == 39000
    model = build_model(cfg.model)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_medium_preflight_names_the_missing_cifar_release(tmp_path):
    from condattn.engine.preflight import data_problems

    cfg = compose(["task=imagenet_vit", "scale=medium", "logger=none", f"paths.data_root={tmp_path}"])
    problems = data_problems(cfg)
    assert any("medium-scale data missing" in p and "cifar-100-python" in p for p in problems), problems
    write_cifar_release(tmp_path, 100)
    assert data_problems(cfg) == []


@pytest.mark.slow
def test_a_few_medium_steps_on_a_cifar_release_replica(tmp_path):
    """The medium path end to end through `python -m condattn.train` on a CIFAR-100 replica (CPU, fp32)."""
    write_cifar_release(tmp_path / "data", 100, n_train=64, n_test=16)
    cmd = [sys.executable, "-m", "condattn.train", "task=imagenet_vit", "scale=medium", "conditioning=spectral",
           "logger=none", f"paths.data_root={tmp_path / 'data'}", f"paths.runs={tmp_path / 'runs'}",
           "task.steps=3", "task.batch_size=8", "task.eval_every=3", "task.log_every=1", "impl.checkpoint_every=3",
           "impl.num_workers=0", "impl.precision=no", "model.depth=2", "model.attention_layers=2",
           "diagnostics.batch_size=2", "impl.threads=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    [summary] = list((tmp_path / "runs" / "medium").glob("*/summary.json"))
    s = json.loads(summary.read_text())
    assert s["status"] == "finished" and s["steps"] == 3 and s["scale"] == "medium"
    assert s["data"]["classes"] == 100 and s["data"]["source"] == "cifar" and not s["data"]["stand_in"]
    assert s["data"]["sizes"] == {"train": 64, "val": 16}
