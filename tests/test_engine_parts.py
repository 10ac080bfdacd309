"""The trainer's parts: the checkpointed state keeps the format of earlier runs, the parts' hooks run in the
documented order, and every task implements the declared interface."""

import json
import math
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from condattn.engine.parts import BestModel, BudgetStop, Diagnostics, Part
from condattn.engine.state import KEY_ORDER
from condattn.engine.trainer import TrainState
from condattn.tasks import TASKS, Task, evaluation_mode

# what TrainState.state_dict() returned before the trainer was split into parts (a checkpoint of an earlier run)
OLD_STATE = {"step": 4, "epoch": 1, "batch_in_epoch": 3, "best_val": 0.25, "best_step": 2, "train_time": 1.5,
             "samples": 128, "budget_stopped": False, "wall_time": 2.0, "resumes": [2]}


class _Run:
    class cfg:  # noqa: N801
        class task:  # noqa: N801
            eval_every = 2

            @staticmethod
            def get(key, default=None):
                return default

    class task:  # noqa: N801
        metric, higher_is_better = "loss", False

    budget = type("B", (), {"hours": None, "exhausted": lambda self: False})()


def _state() -> tuple[TrainState, BestModel, BudgetStop]:
    state, best, budget = TrainState(), BestModel(_Run()), BudgetStop(_Run())
    state.attach(best)
    state.attach(budget)
    return state, best, budget


def test_state_dict_keeps_the_keys_and_order_of_earlier_checkpoints():
    state, best, _ = _state()
    d = state.state_dict()
    assert tuple(d) == KEY_ORDER == tuple(OLD_STATE)
    assert d["best_val"] == -math.inf and d["best_step"] == -1 and d["budget_stopped"] is False
    best.best_val, best.best_step = -0.5, 3
    assert state.state_dict()["best_val"] == -0.5 and state.state_dict()["best_step"] == 3
    pickle.dumps(state.state_dict())  # what accelerate saves: plain values only (no part objects)


def test_an_old_checkpoint_state_loads_into_the_parts():
    state, best, budget = _state()
    state.load_state_dict(dict(OLD_STATE))
    assert (state.step, state.epoch, state.batch_in_epoch, state.samples, state.resumes) == (4, 1, 3, 128, [2])
    assert (best.best_val, best.best_step, budget.budget_stopped) == (0.25, 2, False)
    assert state.state_dict() == OLD_STATE
    assert "best_val" not in vars(state)  # owned by the part, not duplicated on the state


def test_part_hooks_default_to_nothing():
    p = Part()
    for hook in ("before_train", "after_backward", "after_optimizer_step", "after_step", "end_of_step",
                 "after_train", "close"):
        assert getattr(p, hook)(None) is None
    assert p.state_dict() == {}


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_every_task_implements_the_interface(kind):
    cls = TASKS[kind]
    assert issubclass(cls, Task)
    assert isinstance(cls.metric, str) and isinstance(cls.higher_is_better, bool)
    assert not getattr(cls, "__abstractmethods__", None)


def test_a_task_without_forward_or_loss_cannot_be_built():
    class Half(Task):
        metric, higher_is_better = "acc", True

        def loss(self, model, batch):
            return torch.zeros(()), {}

    with pytest.raises(TypeError):
        Half()


def test_evaluation_mode_restores_the_mode_and_disables_grad():
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    m.train()
    with evaluation_mode(m):
        assert not m.training and not torch.is_grad_enabled()
    assert m.training and torch.is_grad_enabled()
    m.eval()
    with pytest.raises(RuntimeError), evaluation_mode(m):
        raise RuntimeError("boom")
    assert not m.training and torch.is_grad_enabled()


def _diagnostics(step: int = 0, metrics: Path | None = None) -> Diagnostics:
    cfg = OmegaConf.create({"diagnostics": {"every": 0, "batch_size": 2, "jacobian": False}})
    run = SimpleNamespace(cfg=cfg, main=True, state=SimpleNamespace(step=step),
                          logger=SimpleNamespace(path=metrics) if metrics else None,
                          data=SimpleNamespace(val=[{"x": torch.zeros(2)}] * 3, collate_fn=None))
    return Diagnostics(run)


def test_step0_diagnostics_travel_with_the_checkpoint_state():
    (state, _, _), part = _state(), _diagnostics()
    state.attach(part)
    part.step0.update({"kappa_wq/mean": 2.5, "gradnorm_wq/mean": 0.125})
    saved = pickle.loads(pickle.dumps(state.state_dict()))  # what accelerate writes and reads back
    assert tuple(saved) == (*KEY_ORDER, "diagnostics_step0")  # earlier checkpoints' keys first, in their order
    again, back = TrainState(), _diagnostics()
    again.attach(back)
    again.load_state_dict(saved)
    assert back.step0 == {"kappa_wq/mean": 2.5, "gradnorm_wq/mean": 0.125} and "diagnostics_step0" not in vars(again)
    old, part_old = TrainState(), _diagnostics()  # a checkpoint written before step 0 was kept in it
    old.attach(part_old)
    old.load_state_dict(dict(OLD_STATE))
    assert part_old.step0 == {} and old.step == 4


def test_a_run_resumed_from_an_older_checkpoint_reads_step0_from_its_log(tmp_path):
    rows = [{"step": 0, "split": "diag", "kappa_wq/mean": 2.5}, {"step": 0, "split": "grad", "gradnorm_wq/mean": 0.5},
            {"step": 1, "split": "train", "loss": 2.0}, {"step": 2, "split": "diag", "kappa_wq/mean": 9.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    part = _diagnostics(step=2, metrics=tmp_path / "metrics.jsonl")
    part.before_train(None)
    assert part.summary()["step0"] == {"kappa_wq/mean": 2.5, "gradnorm_wq/mean": 0.5}
    kept = _diagnostics(step=2, metrics=tmp_path / "metrics.jsonl")
    kept.step0 = {"kappa_wq/mean": 3.0}  # from the checkpoint: it wins over the log
    kept.before_train(None)
    assert kept.summary()["step0"] == {"kappa_wq/mean": 3.0}
