"""The GLUE task table: text columns, label count, metric and dev splits of each task (and the offline stand-in).

A leaf module: the config resolver `${glue_num_labels:TASK}` reads it without loading the GLUE data code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlueTaskSpec:
    columns: tuple[str, ...]  # the text column(s): one sentence or a pair
    num_labels: int  # 1 = regression (STS-B)
    metric: str  # the task's score (cramming's target metric; the GLUE leaderboard's first number)
    val: str = "validation"
    test: str | None = None  # a second labelled dev split reported beside the first (MNLI-mm)


GLUE_TASKS: dict[str, GlueTaskSpec] = {
    "cola": GlueTaskSpec(("sentence",), 2, "mcc"),
    "sst2": GlueTaskSpec(("sentence",), 2, "acc"),
    "mrpc": GlueTaskSpec(("sentence1", "sentence2"), 2, "f1"),
    "stsb": GlueTaskSpec(("sentence1", "sentence2"), 1, "pearson"),
    "qqp": GlueTaskSpec(("question1", "question2"), 2, "f1"),
    "mnli": GlueTaskSpec(("premise", "hypothesis"), 3, "acc", val="validation_matched", test="validation_mismatched"),
    "qnli": GlueTaskSpec(("question", "sentence"), 2, "acc"),
    "rte": GlueTaskSpec(("sentence1", "sentence2"), 2, "acc"),
    # offline stand-in for SST-2 (module docstring)
    "rotten_tomatoes": GlueTaskSpec(("sentence",), 2, "acc"),
}
STAND_IN_TASK = "rotten_tomatoes"


def glue_task(name: str) -> GlueTaskSpec:
    if name not in GLUE_TASKS:
        raise ValueError(f"task.glue_task={name!r} is not a GLUE task; choose one of {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[name]
