"""The floors as the tables print them: read from the cache `python -m condattn.floors` writes
(`results/<scale>/floors/<table>.json`). Nothing here fits a model."""

from __future__ import annotations

from pathlib import Path

from ..utils.io import read_json

SCALES = ("smoke", "small")


def cache_path(results_root: str | Path, scale: str, table: str) -> Path:
    return Path(results_root) / scale / "floors" / f"{table}.json"


def load(results_root: str | Path, scale: str, table: str) -> dict[str, dict]:
    """{group: entry} of a table's cached floors (empty when none were computed)."""
    return (read_json(cache_path(results_root, scale, table)) or {}).get("groups", {})


def fit_time(floor: dict) -> str:
    """A floor's fitting time as printed beside it ("0.8 s"; "–" for a cache written before it was recorded)."""
    sec = floor.get("seconds")
    return "–" if sec is None else (f"{sec:.1f} s" if sec < 600 else f"{sec / 60:.1f} min")


def length(floor: dict) -> str:
    """A floor's training length as printed beside it: a trained floor's epoch kept (best on its tuning split), the
    epochs trained and whether its curve ended flat; a solver's iterations and whether it converged; "–" for a floor
    that is not trained (the majority class, kNN, a rule, an n-gram) or a cache written before lengths were."""
    if "epochs_trained" in floor:
        gain = floor["end_gain"]
        tail = (f"flat over the last {floor['window']}" if floor["flat"] else "still rising at the cap" +
                ("" if gain is None else f" ({100 * gain:+.2f} points over its last {floor['window']})"))
        return (f"epoch {floor['epochs']} of {floor['epochs_trained']} (best mean of {floor['smooth']} on "
                f"{floor['tuned_on']}), {tail}")
    if "iterations" in floor:
        return f"{'converged' if floor['converged'] else 'NOT converged'} in {floor['iterations']} iterations"
    return "–"


def floor_lines(table: str, scale: str, results_root: str | Path, multiplier: float = 100.0,
                group: str | None = None) -> list[str]:
    """Markdown rows `| <group> | floor: ... | value |` of a table's cached floors (all groups, or one); [] when the
    scale has none. A renderer prints them under its table."""
    if scale not in SCALES:
        return []
    entries = load(results_root, scale, table)
    same: dict[tuple, list[str]] = {}  # rows on one split (table 1's five models) share their floors' lines
    for g, e in entries.items():
        if group is None or g == group:
            same.setdefault((e["key"], e["metric"]), []).append(g)
    rows = []
    for names in same.values():
        for f in entries[names[0]]["floors"]:
            label = f["label"].replace("|", "\\|")  # |u − v| inside a Markdown cell
            rows.append(f"| {', '.join(names)} | {label} | {f['value'] * multiplier:.2f} | {f['split']} | "
                        f"{length(f)} | {fit_time(f)} |")
    return rows


def floor_table(table: str, scale: str, results_root: str | Path, multiplier: float = 100.0) -> str:
    """The floors block a renderer appends under a small/smoke table ("" when none are cached)."""
    rows = floor_lines(table, scale, results_root, multiplier)
    if not rows:
        return ""
    head = ("Floors on the same data split (classical models and the majority class; not methods): "
            "`python -m condattn.floors --scale " + scale + "`. A trained floor runs until its last epochs do no "
            "better on its tuning split (validation; a tenth of the training split where validation is reported) and "
            "keeps its best epoch; its length says how many.")
    return "\n".join([head, "", "| row | floor | value | split | training length | fitting time |",
                      "|---|---|---|---|---|---|", *rows])

