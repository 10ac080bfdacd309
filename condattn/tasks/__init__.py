"""Per task family: how a batch goes through the model, the loss, and the evaluation metrics (the interface:
base.Task)."""

from __future__ import annotations

from typing import Any

from .base import Task, evaluation_mode
from .classification import ClassificationTask
from .detection import DetectionTask
from .glue import GlueTask
from .lm import LMTask
from .mlm import MLMTask

TASKS: dict[str, type[Task]] = {"classification": ClassificationTask, "glue": GlueTask, "lm": LMTask,
                                 "mlm": MLMTask, "detection": DetectionTask}


def build_task(cfg: Any) -> Task:
    kind = cfg.task.kind
    if kind not in TASKS:
        raise ValueError(f"unknown task kind {kind!r} (task={cfg.task.name!r}); known: {', '.join(TASKS)}")
    return TASKS[kind](cfg.task)


__all__ = ["TASKS", "ClassificationTask", "DetectionTask", "GlueTask", "LMTask", "MLMTask", "Task", "build_task",
           "evaluation_mode"]
