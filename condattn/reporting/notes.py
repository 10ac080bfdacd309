"""Notes printed under a table: the experiment's own `notes:`, and at paper scale each row's deliberate differences
from its official recipe (configs/recipe_cards.yaml, one card per task); `card_mismatches` compares a resolved
config with its card (tests/test_recipe_cards.py)."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

CARDS = Path(__file__).resolve().parents[2] / "configs" / "recipe_cards.yaml"
LR_KEY = "lr_at_global_batch"  # a card key that is not a config key: optim.lr × global batch / optim.lr_ref_batch


@cache
def load_cards(path: str = str(CARDS)) -> dict[str, dict]:
    """{task name: {source, values: {key: [value, source]}, differences: [...]}}."""
    cards = yaml.safe_load(Path(path).read_text()) or {}
    for task, card in cards.items():
        for key, entry in (card.get("values") or {}).items():
            if not (isinstance(entry, list) and len(entry) == 2):
                raise ValueError(f"{path}: {task}.values.{key} must be [value, source], got {entry!r}")
    return cards


def resolved_value(cfg: Any, key: str) -> Any:
    """The value a card key names in a composed config (`lr_at_global_batch`: the lr the trainer uses)."""
    if key == LR_KEY:
        from ..engine.optim import scaled_lr

        return scaled_lr(cfg, int(cfg.task.batch_size))
    missing = object()
    value = OmegaConf.select(cfg, key, default=missing)
    if value is missing:
        return missing
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def card_mismatches(cfg: Any, card: dict) -> list[str]:
    """One line per card value the resolved config does not have: `key: config X, card Y (source)`."""
    out = []
    for key, (want, source) in (card.get("values") or {}).items():
        got = resolved_value(cfg, key)
        if not isinstance(got, (type(None), bool, int, float, str, list, tuple, dict)):
            out.append(f"{key}: not in the resolved config (card: {want!r}, {source})")
        elif not _same(got, want):
            out.append(f"{key}: config {got!r}, card {want!r} ({source})")
    return out


def _row_tasks(exp: dict, rows: list[str]) -> dict[str, str]:
    """{row: task name} from each row's `task=` override (the pretraining stage as row `pretrain`)."""
    out = {}
    specs = {"pretrain": exp["pretrain"]} if exp.get("pretrain") else {}
    specs.update({r: exp["rows"][r] for r in rows})
    for row, spec in specs.items():
        task = next((o.split("=", 1)[1] for o in spec.get("overrides", []) if o.startswith("task=")), None)
        if task:
            out[row] = task
    return out


def table_notes(exp: dict, scale: str, rows: list[str]) -> list[str]:
    """Markdown lines for under the table: the experiment's `notes:` (a list: at every scale; a mapping: the note of
    this scale, {scale: text}) and, at paper scale, the deliberate differences of each row's recipe card."""
    notes = exp.get("notes") or []
    if isinstance(notes, dict):
        lines = [f"Note ({scale}): {' '.join(str(notes[scale]).split())}"] if notes.get(scale) else []
    else:
        lines = [f"Note: {n}" for n in notes]
    if scale == "paper":
        cards = load_cards()
        by_task: dict[str, list[str]] = {}
        for row, task in _row_tasks(exp, rows).items():
            by_task.setdefault(task, []).append(row)
        diffs = []
        for task, task_rows in by_task.items():
            for d in (cards.get(task) or {}).get("differences") or []:
                diffs.append(f"- {', '.join(task_rows)} ({task}): {' '.join(str(d).split())}")
        if diffs:
            lines += ["Deliberate differences from the official recipes (configs/recipe_cards.yaml):", *diffs]
    return (["", *lines] if lines else [])


def tokenizer_notes(summaries: list[dict]) -> list[str]:
    """Which tokenizer the runs' numbers used (recorded by the text builders), when any run recorded one."""
    kinds = sorted({str(s.get("data", {}).get("tokenizer", {}).get("kind")) for s in summaries
                    if isinstance(s.get("data", {}).get("tokenizer"), dict)})
    return ["", f"Tokenizer: {'; '.join(kinds)}."] if kinds else []
