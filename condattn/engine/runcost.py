"""Where a run's CPU goes: the process's own CPU time (time.process_time: user + system of this process, every
thread, never the wall clock of a shared machine) split into its training steps and the causes outside them.

Causes (CAUSES): `startup` (imports, config, accelerate, model, conditioning, optimizer: everything before the first
hook that is not the data), `data` (building the datasets), `step0` (step 0's diagnostics: the fixed batch's κ and the
first backward pass's gradient norms), `eval` (periodic evaluation and best_model.pt), `test` (the test protocol
after the last step), `end_diag` (the diagnostics at the end, and every `diagnostics.every` steps), `checkpoint`, and
`other` (logging, progress, the rest). `train` is the optimizer steps themselves, fetching their batches included.
A run's split goes to summary.json under `performance.cpu_split` (timing only: never a metric).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CAUSES = ("startup", "data", "step0", "eval", "test", "end_diag", "checkpoint", "other")
LABELS = {"train": "training steps", "startup": "start-up", "data": "data", "step0": "step-0 diagnostics",
          "eval": "evaluation", "test": "test", "end_diag": "end diagnostics", "checkpoint": "checkpoints",
          "other": "other"}
# (part class, hook) -> cause; a hook not listed here is charged to `other` (or to `train` inside a step: `IN_STEP`)
HOOK_CAUSE = {
    ("Diagnostics", "before_train"): "step0", ("Diagnostics", "after_backward"): "step0",
    ("Diagnostics", "after_step"): "end_diag", ("Diagnostics", "after_train"): "end_diag",
    ("BestModel", "after_step"): "eval", ("TestProtocol", "after_train"): "test",
    ("Checkpointing", "after_step"): "checkpoint", ("Checkpointing", "after_train"): "checkpoint",
}
IN_STEP = {("Divergence", "after_backward"), ("Checkpointing", "after_backward"),
           ("BudgetStop", "after_optimizer_step")}


def cpu() -> float:
    """This process's CPU seconds so far (all its threads; not its children's)."""
    return time.process_time()


class CpuLedger:
    """CPU seconds by cause for one run in this process; `start`: the process CPU when the run began (0.0 in a fresh
    process: its imports and config are the run's start-up)."""

    def __init__(self, start: float = 0.0):
        self.start = start
        self.spent: dict[str, float] = {c: 0.0 for c in ("train", *CAUSES)}
        self.steps = 0
        self.evals = 0
        self.checkpoints = 0

    def add(self, cause: str, seconds: float) -> None:
        self.spent[cause] = self.spent.get(cause, 0.0) + seconds

    @contextmanager
    def charge(self, cause: str) -> Iterator[None]:
        t = cpu()
        try:
            yield
        finally:
            self.add(cause, cpu() - t)

    def close(self, now: float | None = None) -> dict[str, Any]:
        """The split at `now` (default: this moment): what no cause took before the first hook is start-up, the rest
        of the unexplained time `other`."""
        total = (cpu() if now is None else now) - self.start
        return split(self.spent, total, self.steps, self.evals, self.checkpoints)


def split(spent: dict[str, float], total: float, steps: int = 0, evals: int = 0, checkpoints: int = 0) -> dict:
    """The summary's `cpu_split`: CPU seconds per cause (`train` included), the remainder of `total` added to `other`,
    and the training share of the total."""
    out = {k: float(spent.get(k, 0.0)) for k in ("train", *CAUSES)}
    out["other"] += max(total - sum(out.values()), 0.0)
    total = max(total, sum(out.values()))
    return {"total_s": round(total, 3), "train_share": round(out["train"] / total, 4) if total > 0 else None,
            "seconds": {k: round(v, 3) for k, v in out.items()}, "steps": steps, "evals": evals,
            "checkpoints": checkpoints}


def project(measured: dict, steps: int, eval_every: int, checkpoint_every: int) -> dict:
    """The split of the same run at `steps` steps, from one measured at fewer: training in proportion to the steps,
    evaluation and checkpoints per evaluation / checkpoint (at every `*_every` steps and the last), every other cause
    as measured (a fixed cost per run)."""
    sec = dict(measured["seconds"])
    m_steps = max(int(measured["steps"]), 1)
    evals, ckpts = events(steps, eval_every), events(steps, checkpoint_every)
    sec["train"] = sec["train"] / m_steps * steps
    for cause, n, m in (("eval", evals, measured.get("evals")), ("checkpoint", ckpts, measured.get("checkpoints"))):
        if m:
            sec[cause] = sec[cause] / int(m) * n
    return split(sec, sum(sec.values()), steps, evals, ckpts)


def events(steps: int, every: int) -> int:
    """How many times something done every `every` steps and at the last one happens in `steps` steps."""
    if every <= 0:
        return 1
    return steps // every + (1 if steps % every else 0)


def render(rows: list[tuple[str, dict]]) -> str:
    """A markdown table: one row per (name, cpu_split), the training share and each cause in CPU seconds."""
    head = ["cell", "steps", "CPU s", "training share", *(LABELS[c] for c in ("train", *CAUSES))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in rows:
        share = "–" if s["train_share"] is None else f"{100 * s['train_share']:.1f} %"
        cells = [name, str(s["steps"]), f"{s['total_s']:.1f}", share,
                 *(f"{s['seconds'][c]:.1f}" for c in ("train", *CAUSES))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
