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

from ..experiment import Experiment

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


def _row_tasks(exp: Experiment, rows: list[str]) -> dict[str, str]:
    """{row: task name} from each row's `task=` override (the pretraining stage as row `pretrain`)."""
    out = {}
    overrides = {"pretrain": exp.pretrain.overrides} if exp.pretrain else {}
    overrides.update({r: exp.rows[r].overrides for r in rows})
    for row, own in overrides.items():
        task = next((o.split("=", 1)[1] for o in own if o.startswith("task=")), None)
        if task:
            out[row] = task
    return out


def table_notes(exp: Experiment, scale: str, rows: list[str]) -> list[str]:
    """Markdown lines for under the table: the experiment's `notes:` (a list: at every scale, an entry
    `{text: ..., rows: [...], scales: [...]}` only when every row it names is in the table and at the scales it
    names; a mapping: the note of this scale, {scale: text}) and, at paper scale, the deliberate differences of each
    row's recipe card."""
    notes = exp.notes
    if isinstance(notes, dict):
        lines = [f"Note ({scale}): {' '.join(str(notes[scale]).split())}"] if notes.get(scale) else []
    else:
        lines = []
        for n in notes:
            if isinstance(n, dict):
                named, at = list(n.get("rows") or []), list(n.get("scales") or [scale])
                bad = [f"rows {r!r}" for r in named if r not in exp.rows]
                bad += [f"scales {x!r}" for x in at if x not in exp.scales]
                bad += [f"key {k!r}" for k in n if k not in ("text", "rows", "scales")]
                bad += [] if n.get("text") else ["no text"]
                if bad:
                    raise ValueError(f"notes entry of {exp.table} has {', '.join(bad)}: give "
                                     "{text: ..., rows: [its rows], scales: [its scales]} with the experiment's names")
                if not set(named) <= set(rows) or scale not in at:
                    continue  # about rows this scale does not train, or another scale
                n = n["text"]
            lines.append(f"Note: {' '.join(str(n).split())}")
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
    lines += checkpoint_notes(exp, scale, rows) + chance_notes(exp, scale)
    return (["", *lines] if lines else [])


def _checkpoint_words(metric: str) -> str | None:
    """At which checkpoint a summary key was taken, in words (None: a key these words do not cover)."""
    for prefix, words in (("final_test_", "test {k} with the last step's weights"),
                          ("test_", "test {k} with the best-validation checkpoint (best_model.pt: the evaluation with "
                                    "the best validation {k}), as the LRA code reports it"),
                          ("final_val_", "validation {k} with the last step's weights (the final checkpoint)"),
                          ("val_", "the best validation {k} over the evaluations (the best checkpoint's)")):
        if metric.startswith(prefix):
            return words.format(k=metric[len(prefix):])
    return None


def checkpoint_notes(exp: Experiment, scale: str, rows: list[str]) -> list[str]:
    """One line per metric the rows report: at which checkpoint it was taken (best validation or last step)."""
    by_metric: dict[str, list[str]] = {}
    for row in rows:
        by_metric.setdefault(str(exp.row_metric(scale, row)), []).append(row)
    out = []
    for metric, metric_rows in by_metric.items():
        if words := _checkpoint_words(metric):
            who = "every row" if len(by_metric) == 1 else (
                ", ".join(metric_rows) if len(metric_rows) <= 4 else
                f"{len(metric_rows)} rows, {metric_rows[0]} … {metric_rows[-1]}")
            out.append(f"Checkpoint: `{metric}` ({who}) is {words}.")
    return out


def chance_notes(exp: Experiment, scale: str) -> list[str]:
    """At smoke and small scale (where a row may sit at chance), the accuracy a uniform guess reaches on each
    classification row (100 / classes, in the table's units); [] elsewhere or when no row classifies."""
    if scale not in ("smoke", "small"):
        return []
    from ..config import ConfigError, compose_cell

    times = exp.multiplier
    by_chance: dict[tuple[float, int], list[str]] = {}
    seen: set[str] = set()
    for row in exp.rows_at(scale):
        group = exp.rows[row].task or row  # table 9: one line per task, from its first row (as the floors)
        if group in seen or not any(k in str(exp.row_metric(scale, row)) for k in ("acc", "top1")):
            continue
        seen.add(group)
        overrides = exp.cell_overrides(row, "none", scale, 0)  # the row's baseline cell, as reproduce composes it
        try:
            cfg = compose_cell(overrides)
        except ConfigError:
            continue
        n = cfg.model.get("num_classes") or cfg.data.get("num_classes")
        if cfg.task.get("kind") == "classification" and isinstance(n, int) and n > 1:
            by_chance.setdefault((times / n, n), []).append(str(group))
    if not by_chance:
        return []
    parts = [f"{value:.2f} ({n} classes: {', '.join(groups_)})" for (value, n), groups_ in by_chance.items()]
    return [f"Chance (a uniform guess; at {scale} scale a row near it has learned nothing yet): {'; '.join(parts)}."]


def tokenizer_notes(summaries: list[dict]) -> list[str]:
    """Which tokenizer the runs' numbers used (recorded by the text builders), when any run recorded one."""
    kinds = sorted({str(s.get("data", {}).get("tokenizer", {}).get("kind")) for s in summaries
                    if isinstance(s.get("data", {}).get("tokenizer"), dict)})
    return ["", f"Tokenizer: {'; '.join(kinds)}."] if kinds else []


def patch_notes(summaries: list[dict]) -> list[str]:
    """What a method's patch carried that a reader of its numbers must see (CET's accepted causal leak on a decoder:
    `conditioning.causal_leak=accept`), once per distinct note, from the runs' patch reports."""
    seen = sorted({n for s in summaries for n in (s.get("patch") or {}).get("notes", []) if "causal_leak" in n})
    return [x for n in seen for x in ("", f"Patch: {n}")]
