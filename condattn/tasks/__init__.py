"""Per task family: how a batch goes through the model, the loss, and the evaluation metrics."""

from __future__ import annotations

from typing import Any

from .classification import ClassificationTask
from .detection import DetectionTask
from .glue import GlueTask
from .lm import LMTask
from .mlm import MLMTask

TASKS = {"classification": ClassificationTask, "glue": GlueTask, "lm": LMTask, "mlm": MLMTask,
         "detection": DetectionTask}


def build_task(cfg: Any):
    kind = cfg.task.kind
    if kind not in TASKS:
        raise ValueError(f"unknown task kind {kind!r} (task={cfg.task.name!r}); known: {', '.join(TASKS)}")
    return TASKS[kind](cfg.task)


__all__ = ["TASKS", "ClassificationTask", "DetectionTask", "GlueTask", "LMTask", "MLMTask", "build_task"]
