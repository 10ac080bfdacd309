"""Floors: what the majority class and a classical model reach on exactly the split a small table's runs use.

`python -m condattn.floors --scale small` composes each row's config as `reproduce` does (row overrides,
scale overrides, `conditioning=none scale=<scale> seed=0`), builds its data through the trainer's data builder
(data/registry.py), fits each floor on the training split and reports it on the split the table's metric uses
(`test_*` and `final_test_*` metrics: test; the others: validation). A hyper-parameter (logistic regression's C)
is picked on the validation split when the report is on test, else on a seeded tenth of the training split, then
refitted on all of it.

- classification: the majority class of the training split;
- images (raw pixels of the MNIST stand-in; LRA Image / Pathfinder pixels): logistic regression and an RBF-kernel SVM
  (C picked like logistic regression's), and for the ViT's images also kNN (k = 3), a one-hidden-layer MLP and a
  small CNN, each trained until its curve on the tuning split is flat (fit.train_until_flat: 10 epochs in a row no
  better than its best), keeping its best epoch;
- text (LRA Text / Retrieval bytes decoded to text; the GLUE stand-in's WordPiece ids as words, and decoded back to
  text with its tokenizer): tf-idf (uni- and bigrams) logistic regression, and tf-idf of word 1–2-grams with character
  2–5-grams; Retrieval on [u, v, u·v, |u − v|, cos(u, v)] of the two documents' tf-idf vectors;
- ListOps: logistic regression on standardised token counts (bag of tokens); the rule "outer operator → its most
  frequent training label" (the plateau of a model that reads one token) and the depth-1 evaluator (the outer
  operator applied exactly, nested lists guessed by their operator's most frequent value);
- LM: an interpolated Kneser-Ney trigram (discount 0.75) and the best interpolated Kneser-Ney n-gram (order 2–8 and
  discount picked on validation) over the training tokens, their loss in nats per token on the held-out split
  (validation, or test for a test metric), on the predictions the LM task counts (each block on its own: token t + 1
  from tokens ≤ t of its block).
Each floor records its fitting time (`seconds`) and, where it is trained, its length, printed beside it: the trained
floors' epoch kept, epochs trained and whether the curve ended flat; logistic regression's solver iterations and
whether it converged (its own tolerance; SOLVER_MAX_ITER allows it).

The GLUE stand-in's inputs are encoded with the tokenizer its pretraining run's data builder trains (table 3's
`pretrain:` cell, built here the same way). Results are cached as JSON in `results/<scale>/floors/<table>.json`,
keyed by the data checksum the runs record in summary.json and the data config; the renderers read that file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..experiment import Experiment
from ..experiment import load as load_experiment
from ..reporting.floors import SCALES, cache_path, load
from ..utils.io import write_json_atomic
from .features import (
    byte_texts,
    data_key,
    groups,
    id_words,
    pair_features,
    pixels,
    pretrain_tokenizer,
    stack,
    wordpiece_texts,
)
from .fit import (
    C_GRID,
    MLP,
    RBFSVM,
    SVM_GRID,
    TEXT_C_GRID,
    VERSION,
    SmallCNN,
    _floor,
    best_kneser_ney,
    fit_report,
    kneser_ney_loss,
    length_record,
    listops_rules,
    logreg,
    scaled_logreg,
    tfidf_logreg,
    tfidf_word_char_logreg,
    tuning_data,
)

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


TABLES = ("table1_imagenet", "table3_glue", "table4_lra", "table5_tinystories", "table6_condition_numbers",
          "table8_sca_lambda", "table9_readings")


_COMPUTED: dict[tuple[str, str], list[dict]] = {}  # (data key, metric) -> floors in this process (table 1's rows)




def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def trained_floor(label: str, model, x: dict, y: dict, split: str, tune_on_val: bool, **extra) -> dict:
    """A floor trained epoch by epoch (fit.MLP, fit.SmallCNN): its length chosen on the tuning split (`tuning_data`:
    validation, or a tenth of the training split when validation is reported; never the test split), the curve's
    flatness at its end recorded beside its value."""
    fx, fy, tune = tuning_data(x, y, tune_on_val)
    model, sec = _timed(lambda: model.fit(fx, fy, tune))
    acc = float((model.predict(x[split]) == y[split]).mean())
    return _floor(label, acc, split, sec, tuned_on="val" if tune_on_val else "train tenth",
                  **length_record(model.scores, model.patience), **extra)


def compute(cfg: Any, bundle, metric: str) -> list[dict]:
    """The floors of one data bundle, reported on the split `metric` names (test_*: test, else validation)."""
    split = "test" if metric.startswith(("test_", "final_test_")) else "val"
    builder = str(cfg.data.builder)
    if builder == "lm_text":
        if split == "test" and bundle.test is None:
            raise ValueError(f"metric {metric} reads the test split but the LM data has none (data.test_fraction)")
        train = np.asarray(bundle.train.tokens[: len(bundle.train) * bundle.train.seq_len], dtype=np.int64)

        def blocks(ds):
            held = stack(ds)
            return [row[m > 0] for row, m in zip(held["input_ids"], held["attention_mask"])]

        val = blocks(bundle.val)
        report = val if split == "val" else blocks(bundle.test)
        vocab = int(cfg.data.vocab_size)
        (loss, n), s = _timed(lambda: kneser_ney_loss(train, report, vocab))
        out = [_floor("Kneser-Ney trigram (interpolated, D = 0.75)", loss, split, s, predictions=n,
                      unit="nats per token")]
        (loss, n, chosen), s = _timed(lambda: best_kneser_ney(train, val, report, vocab))
        out.append(_floor(f"Kneser-Ney n-gram, best order and D on validation (order {chosen['order']}, "
                          f"D = {chosen['discount']})", loss, split, s, predictions=n, unit="nats per token", **chosen))
        return out
    if builder == "mlm_text":
        raise ValueError("no floor for the MLM pretraining data (table 3 reports the GLUE fine-tuning score)")
    if split == "test" and bundle.test is None:
        raise ValueError(f"metric {metric} reads the test split but data.builder={builder} has none")
    names = ["train", "val"] + (["test"] if split == "test" else [])
    sets = {"train": bundle.train, "val": bundle.val, "test": bundle.test}
    tune_on_val = split == "test"
    out = []
    if builder in ("images", "lra_image", "lra_pathfinder"):
        data = {s: pixels(sets[s]) for s in names}
    else:
        data = {s: stack(sets[s]) for s in names}
    y = {s: np.asarray(data[s][1] if isinstance(data[s], tuple) else data[s]["labels"]) for s in names}
    t = time.perf_counter()
    values, counts = np.unique(y["train"], return_counts=True)
    majority = values[np.argmax(counts)]
    out.append(_floor("majority class", float((y[split] == majority).mean()), split, time.perf_counter() - t,
                      **{"class": int(majority)}))

    def add(label, make, x, grid=None, param="C", **extra):
        tune = (x["val"], y["val"]) if tune_on_val else None
        (acc, chosen), s = _timed(lambda: fit_report(make, x["train"], y["train"], tune, x[split], y[split], grid,
                                                     param))
        out.append(_floor(label, acc, split, s, **chosen, **extra))

    if builder in ("images", "lra_image", "lra_pathfinder"):
        from sklearn.neighbors import KNeighborsClassifier

        x = {s: data[s][0] for s in names}
        add("logistic regression (pixels)", logreg, x, list(C_GRID))
        if builder == "images":
            add("kNN, k = 3 (pixels)", lambda _: KNeighborsClassifier(3), x)
            out.append(trained_floor("MLP, one hidden layer of 256 (pixels)", MLP(), x, y, split, tune_on_val))
        add("RBF-kernel SVM (pixels; C and gamma on the tuning split)", RBFSVM, x, list(SVM_GRID),
            param="C, gamma/scale")
        side = int(round(np.sqrt(x["train"].shape[1])))
        if builder == "images" and side * side == x["train"].shape[1] and side % 4 == 0:
            shift = int(((cfg.task.get("augment") or {}).get("shift_px")) or 0)
            for k in sorted({0, shift}):  # without shifts, and with the transformers' own (a fair floor)
                aug = f", the transformers' ±{k}-pixel shifts" if k else ""
                out.append(trained_floor(f"small CNN (2 conv layers, pixels{aug})", SmallCNN(side, k), x, y, split,
                                         tune_on_val, shift_px=k))
    elif builder == "listops":
        vocab = int(max(data[s]["input_ids"].max() for s in names)) + 1
        x = {s: np.stack([np.bincount(r[m > 0], minlength=vocab) for r, m in
                          zip(data[s]["input_ids"], data[s]["attention_mask"])]).astype(np.float32) for s in names}
        add("logistic regression (bag of tokens)", scaled_logreg, x, list(C_GRID))
        if str(cfg.data.get("tokenization", "lra")) != "no_close_bracket":  # the trees need "]"
            ids = {s: [r[m > 0] for r, m in zip(data[s]["input_ids"], data[s]["attention_mask"])] for s in names}
            out.extend(listops_rules(ids, y, split))
    elif builder == "lra_text":
        x = {s: byte_texts(data[s]["input_ids"], data[s]["attention_mask"]) for s in names}
        add("tf-idf logistic regression (words)", tfidf_logreg, x, list(TEXT_C_GRID))
        add("tf-idf logistic regression (word 1–2-grams + char 2–5-grams)", tfidf_word_char_logreg, x,
            list(TEXT_C_GRID))
    elif builder == "lra_retrieval":
        docs = [{s: (data[s][f"input_ids_{k}"], data[s][f"attention_mask_{k}"]) for s in names} for k in (0, 1)]
        x, s0 = _timed(lambda: pair_features(*docs, names))
        add("tf-idf logistic regression ([u, v, u·v, |u − v|, cos])", logreg, x, list(C_GRID))
        out[-1]["seconds"] = round(out[-1]["seconds"] + s0, 2)
    elif builder == "glue":
        x = {s: id_words(data[s]["input_ids"], data[s]["attention_mask"]) for s in names}
        add("tf-idf logistic regression (WordPiece tokens)", tfidf_logreg, x, list(TEXT_C_GRID))
        if texts := wordpiece_texts(cfg, data, names):
            add("tf-idf logistic regression (word 1–2-grams + char 2–5-grams of the decoded text)",
                tfidf_word_char_logreg, texts, list(TEXT_C_GRID))
    return out


def table_floors(exp: Experiment, scale: str, results_root: str | Path, force: bool = False,
                 log=print) -> dict[str, dict]:
    """Compute (or read from the cache) every group's floors of one experiment and write the cache."""
    from ..config import compose_cell
    from ..data.registry import build_datasets

    if scale not in SCALES:
        raise ValueError(f"floors are for the offline scales {SCALES}, not scale={scale!r}")
    path = cache_path(results_root, scale, exp.table)
    cached = load(results_root, scale, exp.table)
    elsewhere = [e for other in sorted(path.parent.glob("*.json")) if other != path
                 for e in load(results_root, scale, other.stem).values()]
    out: dict[str, dict] = {}
    tokenizer = None
    for group, (metric, overrides) in groups(exp, scale).items():
        if exp.pretrain:
            tokenizer = tokenizer or pretrain_tokenizer(exp, scale)
            overrides = [*overrides, f"data.tokenizer={tokenizer}"]
        cfg = compose_cell(overrides)
        (bundle, s) = _timed(lambda cfg=cfg: build_datasets(cfg))
        key = data_key(cfg, bundle.checksum, bundle.info)
        # this group's cache entry, else another group's on the same data and metric, in this table or another at this
        # scale (rows that share a split, such as table 1's small rows or table 1's vit_hard and table 9's vit_hard
        # family, share their floors: one fit, one value)
        same = [e for e in (cached.get(group), *cached.values(), *elsewhere) if e and e.get("key") == key
                and e.get("metric") == metric]
        if not force and same:
            log(f"[floors] {exp.table} {group}: cached (data checksum {bundle.checksum[:12]})")
            out[group] = {**same[0], "cached": True}
            continue
        log(f"[floors] {exp.table} {group}: data {cfg.data.name} built in {s:.1f} s, checksum "
            f"{bundle.checksum[:12]}")
        if (key, metric) not in _COMPUTED:
            _COMPUTED[key, metric] = compute(cfg, bundle, metric)
        out[group] = {"key": key, "data_checksum": bundle.checksum, "data": str(cfg.data.name), "metric": metric,
                      "floors": _COMPUTED[key, metric], "cached": False}
    # a cached group this run did not compute (a row outside the scale's `rows:`, such as table 9's ListOps half at
    # small) is kept as it was
    kept = {g: e for g, e in cached.items() if g not in out}
    write_json_atomic(path, {"table": exp.table, "scale": scale, "version": VERSION, "groups": {
        **kept, **{g: {k: v for k, v in e.items() if k != "cached"} for g, e in out.items()}}})
    return out


def task_floors(task: str, scale: str, results_root: str | Path, overrides: list[str] | tuple = (),
                metric: str = "final_test_acc", force: bool = False, log=print) -> dict:
    """The floors of a task that no table has yet (its baseline cell at seed 0, `overrides` added), cached as
    `results/<scale>/floors/task_<task>.json` in the tables' format (group = the task)."""
    from ..config import compose_cell
    from ..data.registry import build_datasets

    if scale not in SCALES:
        raise ValueError(f"floors are for the offline scales {SCALES}, not scale={scale!r}")
    cfg = compose_cell([f"task={task}", "conditioning=none", f"scale={scale}", "seed=0", *overrides])
    bundle, s = _timed(lambda: build_datasets(cfg))
    key = data_key(cfg, bundle.checksum, bundle.info)
    name = f"task_{task}"
    cached = load(results_root, scale, name).get(task)
    if not force and cached and cached.get("key") == key and cached.get("metric") == metric:
        log(f"[floors] {name}: cached (data checksum {bundle.checksum[:12]})")
        return {**cached, "cached": True}
    log(f"[floors] {name}: data {cfg.data.name} built in {s:.1f} s, checksum {bundle.checksum[:12]}")
    entry = {"key": key, "data_checksum": bundle.checksum, "data": str(cfg.data.name), "metric": metric,
             "overrides": list(overrides), "floors": compute(cfg, bundle, metric)}
    write_json_atomic(cache_path(results_root, scale, name),
                      {"table": name, "scale": scale, "version": VERSION, "groups": {task: entry}})
    return {**entry, "cached": False}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.floors", description=__doc__.split("\n")[0])
    p.add_argument("--scale", default="small", choices=SCALES)
    p.add_argument("--tables", nargs="*", default=list(TABLES), help="experiment names (default: every small table)")
    p.add_argument("--results", default="results")
    p.add_argument("--force", action="store_true", help="recompute even when the cache matches")
    p.add_argument("--task", help="a task no table has yet (e.g. imagenet_vit_hard): its floors, not the tables'")
    p.add_argument("--overrides", nargs="*", default=[], help="with --task: Hydra overrides of its cell")
    args = p.parse_args(argv)
    if args.task:
        from ..config import ConfigError

        try:
            e = task_floors(args.task, args.scale, args.results, args.overrides, force=args.force)
        except (ConfigError, ValueError) as err:
            p.error(f"--task {args.task}: {err}")
        for f in e["floors"]:
            print(f"{args.task:20s} {f['label']:55s} {f['value'] * 100:7.2f} ({f['split']}, {f['seconds']:.1f} s"
                  f"{', cached' if e['cached'] else ''})")
        print(f"[floors] -> {cache_path(args.results, args.scale, f'task_{args.task}')}")
        return 0
    for table in args.tables:
        path = EXPERIMENTS / f"{table}.yaml"
        if not path.is_file():
            p.error(f"--tables {table}: there is no {path}; tables: {', '.join(TABLES)}")
        exp = load_experiment(path)
        t = time.perf_counter()
        result = table_floors(exp, args.scale, args.results, args.force)
        times = exp.multiplier  # as the table shows the metric
        for group, e in result.items():
            for f in e["floors"]:
                print(f"{table:20s} {group:12s} {f['label']:55s} {f['value'] * times:7.2f} ({f['split']}, "
                      f"{f['seconds']:.1f} s{', cached' if e['cached'] else ''})")
        print(f"[floors] {table}: {time.perf_counter() - t:.1f} s -> {cache_path(args.results, args.scale, table)}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
