"""A part of the training loop (detectron2's hooks, with their own `state_dict`).

The loop (engine/loop.py) calls the hooks of the parts its `schedule` lists for each, in that order, at these points:
    before_train(loop)      once, before the first step of this session (after a resume)
    after_backward(loop)    a step's loss is known, its gradients are accumulated, the optimizer has not stepped
    after_optimizer_step(loop)  the counters of the step are updated
    after_step(loop)        logging, evaluation, diagnostics, stop requests, checkpoints
    end_of_step(loop)       after every part's after_step (what must follow the checkpoint)
    after_train(loop)       the loop ended (steps done or budget used up)
    close(loop)             the run ends early (interrupted, diverged): release what the part holds
A part with state returns it from `state_dict()` (flat keys, saved in the checkpoint's TrainState) and takes it
back in `load_state_dict()`.
"""

from __future__ import annotations

from typing import Any


class Part:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        vars(self).update(d)

    def before_train(self, loop: Any) -> None:
        pass

    def after_backward(self, loop: Any) -> None:
        pass

    def after_optimizer_step(self, loop: Any) -> None:
        pass

    def after_step(self, loop: Any) -> None:
        pass

    def end_of_step(self, loop: Any) -> None:
        pass

    def after_train(self, loop: Any) -> None:
        pass

    def close(self, loop: Any = None) -> None:
        pass
