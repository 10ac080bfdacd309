"""After the last step: the last weights on the validation split, then the test split scored with the best-validation
weights (LRA's protocol: `test_<k>`) and with the last weights (`final_test_<k>`, e.g. MNLI-mm). What was already
computed is not computed again: the last step's validation evaluation is the last weights' (`final_val_<k>`), and when
the best validation value was at the last step, the best weights are the last ones (`test_<k>` = `final_test_<k>`)."""

from __future__ import annotations

from typing import Any

import torch

from .base import Part
from .evaluation import BestModel


class TestProtocol(Part):
    def __init__(self, run: Any, best: BestModel):
        self.run = run
        self.best = best
        self.final_val: dict = {}
        self.test: dict = {}

    def after_train(self, loop: Any) -> None:
        run, step = self.run, self.run.state.step
        # the last weights were evaluated on the validation split at the last step (BestModel): the same numbers
        latest = self.best.latest
        self.final_val = dict(latest[1]) if latest is not None and latest[0] == step else \
            self.best.evaluate(run.val_loader)
        if run.test_loader is None:
            return
        final_test = self.best.evaluate(run.test_loader)
        best = run.run_dir / "best_model.pt"
        run.accelerator.wait_for_everyone()
        if best.exists() and self.best.best_step != step:  # (best at the last step: its weights are the last ones)
            # map to the CPU first: under multi-process CPU runs accelerate's device is "cpu:0", which
            # torch.load cannot map to; load_state_dict then copies onto the model's device
            try:
                weights = torch.load(best, map_location="cpu", weights_only=True)
            except Exception as e:  # broke during this session: named; a rerun sets it aside (engine/artefacts.py)
                raise RuntimeError(f"{best} (the best-validation weights the test split is scored with) is unreadable: "
                                   f"{type(e).__name__}: {e}; run the same command again: it is set aside and the "
                                   "run repaired") from e
            run.raw.load_state_dict(weights)
            test = self.best.evaluate(run.test_loader)
        else:
            test = final_test
        self.test = {**{f"test_{k}": v for k, v in test.items() if k != "n"},
                     **{f"final_test_{k}": v for k, v in final_test.items() if k != "n"}}

    def metrics(self) -> dict[str, Any]:
        # every metric of the last evaluation (acc, loss; lm's ppl; GLUE's mcc / f1; detection's AP), and the test's
        return {**{f"final_val_{k}": v for k, v in self.final_val.items() if k != "n"}, **self.test}
