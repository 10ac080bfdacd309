"""Floors: what the majority class and a classical model reach on exactly the split a small table's runs use.

`python -m condattn.reporting.floors --scale small` composes each row's config as `reproduce` does (row overrides,
scale overrides, `conditioning=none scale=<scale> seed=0`), builds its data through the trainer's data builder
(data/registry.py), fits each floor on the training split and reports it on the split the table's metric uses
(`test_*` and `final_test_*` metrics: test; the others: validation). A hyper-parameter (logistic regression's C)
is picked on the validation split when the report is on test, else on a seeded tenth of the training split, then
refitted on all of it.

- classification: the majority class of the training split;
- images (raw pixels of the MNIST stand-in; LRA Image / Pathfinder pixels): logistic regression and an RBF-kernel SVM
  (C picked like logistic regression's), and for the ViT's images also kNN (k = 3), a one-hidden-layer MLP and a
  small CNN (its epoch picked on the tuning split);
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
Each floor records its fitting time (`seconds`), printed beside it.

The GLUE stand-in's inputs are encoded with the tokenizer its pretraining run's data builder trains (table 3's
`pretrain:` cell, built here the same way). Results are cached as JSON in `results/<scale>/floors/<table>.json`,
keyed by the data checksum the runs record in summary.json and the data config; the renderers read that file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..experiment import cell_overrides
from ..utils.io import read_json, write_json_atomic
from .metric import row_metric

VERSION = 4  # bump when a floor's definition changes (the cache then recomputes)
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
TABLES = ("table1_imagenet", "table3_glue", "table4_lra", "table5_tinystories", "table6_condition_numbers",
          "table8_sca_lambda", "table9_readings")
SCALES = ("smoke", "small")
C_GRID = (0.1, 1.0, 10.0)
TEXT_C_GRID = (0.1, 1.0, 10.0, 100.0)  # tf-idf floors: their pick sat at C = 10, the edge of C_GRID
SVM_GRID = tuple((c, g) for c in (1.0, 10.0) for g in (1.0, 2.0, 4.0))  # (C, gamma as a multiple of "scale")
CNN_EPOCHS = 12  # the small CNN trains this many epochs and keeps its best one on the tuning split
KN_ORDERS = (2, 3, 4, 5, 6, 7, 8)  # the n-gram floor: the order (upwards while validation improves) and discount
KN_DISCOUNTS = (0.75, 0.9)
_COMPUTED: dict[tuple[str, str], list[dict]] = {}  # (data key, metric) -> floors in this process (table 1's rows)


# ----------------------------------------------------------------------------------------------------
# Which data each row uses
# ----------------------------------------------------------------------------------------------------


def groups(exp: dict, scale: str) -> dict[str, tuple[str, list[str]]]:
    """{group: (metric, overrides)}: one per row (table 9: one per task, from its first row), the row's baseline cell
    at seed 0 composed by the same recipe as reproduce's cells (experiment.cell_overrides)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for row in (exp["scales"].get(scale) or {}).get("rows") or list(exp["rows"]):
        group = exp["rows"][row].get("task", row)
        if group not in out:
            out[group] = (str(row_metric(exp, scale, row)), cell_overrides(exp, row, "none", scale, 0))
    return out


def pretrain_tokenizer(exp: dict, scale: str) -> str:
    """The tokenizer.json the pretraining cell's data builder trains (what GLUE's fine-tuning reads from its run)."""
    from ..config import compose_cell
    from ..data.registry import build_datasets

    pre = exp["pretrain"]
    cfg = compose_cell([*pre.get("overrides", []), *(pre.get("scales", {}).get(scale) or []), "conditioning=none",
                        f"scale={scale}", "seed=0"])
    return str(Path(build_datasets(cfg).info["cache"]) / "tokenizer.json")


def data_key(cfg: Any, checksum: str, info: dict) -> str:
    """sha256 of what decides the split: the data checksum, the data config (paths left out), the task's GLUE task
    and the tokenizer's checksum."""
    from omegaconf import OmegaConf

    d = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k not in ("root", "tokenizer")}
    tok = (info.get("tokenizer") or {}).get("sha256")
    blob = json.dumps({"version": VERSION, "checksum": checksum, "data": d, "glue_task": cfg.task.get("glue_task"),
                       "tokenizer": tok}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------------------------------------


def stack(ds) -> dict[str, np.ndarray]:
    """Every item of a dataset of equal-shape tensors, stacked per key."""
    from torch.utils.data import DataLoader

    parts: dict[str, list] = defaultdict(list)
    for batch in DataLoader(ds, batch_size=512, shuffle=False):
        for k, v in batch.items():
            parts[k].append(v.numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


def pixels(ds) -> tuple[np.ndarray, np.ndarray]:
    """(raw pixels in [0, 1], labels) of an image split, before any transform (the stand-in's uint8 arrays)."""
    items = getattr(ds, "items", None)
    if items is not None and hasattr(items, "images"):
        return items.images.reshape(len(items.images), -1).astype(np.float32) / 255.0, np.asarray(items.labels)
    if hasattr(ds, "values") and hasattr(ds, "lengths"):  # LRA Image / Pathfinder pixel sequences
        return ds.values.numpy().astype(np.float32) / 255.0, ds.labels.numpy()
    raise ValueError(f"floors read in-memory images; {type(ds).__name__} has none (use the smoke/small stand-ins)")


def byte_texts(ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """LRA byte ids (byte + 1, 0 = padding) back to text."""
    return [bytes((row[m > 0] - 1).astype(np.uint8).tolist()).decode("utf-8", "replace") for row, m in zip(ids, mask)]


def wordpiece_texts(cfg: Any, data: dict, names: list[str]) -> dict[str, list[str]] | None:
    """The GLUE stand-in's inputs decoded back to text with their WordPiece tokenizer (data.tokenizer), special tokens
    left out; None when the config names no tokenizer file."""
    path = cfg.data.get("tokenizer") if hasattr(cfg.data, "get") else None
    if not path or not Path(str(path)).is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return {s: tok.decode_batch([r[m > 0].tolist() for r, m in zip(data[s]["input_ids"], data[s]["attention_mask"])])
            for s in names}


def id_words(ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """Token ids as space-separated words (padding left out), for a tf-idf over a tokenizer's tokens."""
    return [" ".join(map(str, row[m > 0].tolist())) for row, m in zip(ids, mask)]


# ----------------------------------------------------------------------------------------------------
# Fitting
# ----------------------------------------------------------------------------------------------------


def _tuning_split(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    k = max(1, n // 10)
    return np.sort(order[k:]), np.sort(order[:k])


def _rows(x, idx):
    return x[idx] if not isinstance(x, list) else [x[i] for i in idx]


def fit_report(make, fit_x, fit_y, tune: tuple | None, report_x, report_y, grid=None,
               param: str = "C") -> tuple[float, dict]:
    """(accuracy on the report split, chosen params): `make(param)` builds an estimator; with a grid, each is scored
    on `tune` = (x, y) (the validation split) or, when None, on a seeded tenth of the training data; the best is
    refitted on all of the training data."""
    chosen: dict = {}
    if grid:
        if tune is None:
            a, b = _tuning_split(len(fit_y))
            tx, ty, vx, vy = _rows(fit_x, a), fit_y[a], _rows(fit_x, b), fit_y[b]
        else:
            tx, ty, (vx, vy) = fit_x, fit_y, tune
        scores = {p: float((make(p).fit(tx, ty).predict(vx) == vy).mean()) for p in grid}
        best = max(grid, key=lambda p: (scores[p], -grid.index(p)))
        chosen = {param: list(best) if isinstance(best, tuple) else best,  # JSON-native, as the cache reads back
                  "tuning_scores": {str(p): v for p, v in scores.items()},
                  "tuned_on": "val" if tune is not None else "train tenth"}
        model = make(best)
    else:
        model = make(None)
    model.fit(fit_x, fit_y)
    return float((model.predict(report_x) == report_y).mean()), chosen


def logreg(c):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=300)


def scaled_logreg(c):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), logreg(c))


def tfidf_logreg(c):
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline

    return make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"\S+"),
                         logreg(c))


def tfidf_word_char_logreg(c):
    """tf-idf of word uni- and bigrams beside character 2–5-grams (inside word boundaries), logistic regression."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline, make_union

    return make_pipeline(make_union(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"\S+"),
        TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), min_df=2, sublinear_tf=True, max_features=200_000),
    ), logreg(c))


class RBFSVM:
    """An RBF-kernel SVC with grid point (C, g): gamma = g × scikit-learn's "scale" (1 / (features × pixel variance
    of the training data it is fitted on))."""

    def __init__(self, point):
        self.c, self.g = point

    def fit(self, x, y):
        from sklearn.svm import SVC

        x = np.asarray(x)
        self.model = SVC(C=self.c, kernel="rbf", gamma=self.g / (x.shape[1] * x.var())).fit(x, y)
        return self

    def predict(self, x):
        return self.model.predict(np.asarray(x))


class SmallCNN:
    """A small CNN on the raw pixels (conv 32 → pool → conv 64 → pool → linear 128 → classes), Adam at 1e-3, batch
    64, seed 0, one thread, up to `epochs` epochs: the epoch kept is the one that scores best on `tune` (x, y)."""

    def __init__(self, side: int, epochs: int = 15, shift: int = 0):
        self.side, self.epochs, self.shift = side, int(epochs), int(shift)

    def _shifted(self, xb, gen):
        """Each image translated by a random integer offset in [-shift, shift] per axis, filled with 0: the ±k-pixel
        shifts the transformers train with (task.augment.shift_px, data/images.py ShiftedImages)."""
        import torch

        k = self.shift
        padded = torch.nn.functional.pad(xb, (k, k, k, k))
        off = torch.randint(0, 2 * k + 1, (len(xb), 2), generator=gen)
        return torch.stack([padded[i, :, a:a + self.side, b:b + self.side] for i, (a, b) in enumerate(off.tolist())])

    def _net(self, classes):
        from torch import nn

        s = self.side // 4
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * s * s, 128), nn.ReLU(), nn.Linear(128, classes))

    def _x(self, x):
        import torch

        return torch.as_tensor(np.asarray(x, dtype=np.float32)).view(-1, 1, self.side, self.side)

    def fit(self, x, y, tune: tuple):
        import copy

        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            gen = torch.Generator().manual_seed(0)
            torch.manual_seed(0)
            x, y = self._x(x), torch.as_tensor(np.asarray(y), dtype=torch.long)
            self.net = self._net(int(y.max()) + 1)
            opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
            best, self.scores = (-1.0, None, 0), []
            for epoch in range(1, self.epochs + 1):
                self.net.train()
                for idx in torch.randperm(len(y), generator=gen).split(64):
                    xb = self._shifted(x[idx], gen) if self.shift else x[idx]
                    loss = torch.nn.functional.cross_entropy(self.net(xb), y[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                score = float((self.predict(tune[0]) == np.asarray(tune[1])).mean())
                self.scores.append(score)
                if score > best[0]:
                    best = (score, copy.deepcopy(self.net.state_dict()), epoch)
            self.net.load_state_dict(best[1])
            self.epoch = best[2]
        finally:
            torch.set_num_threads(threads)
        return self

    def predict(self, x):
        import torch

        self.net.eval()
        with torch.no_grad():
            return torch.cat([self.net(b).argmax(-1) for b in self._x(x).split(512)]).numpy()


def pair_features(first: dict, second: dict, splits: list[str]):
    """[u, v, u·v, |u − v|, cos(u, v)] of the two documents' tf-idf vectors (fitted on the training documents)."""
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = {s: (byte_texts(*first[s]), byte_texts(*second[s])) for s in splits}
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"\S+")
    vec.fit(texts["train"][0] + texts["train"][1])
    out = {}
    for s in splits:
        u, v = vec.transform(texts[s][0]), vec.transform(texts[s][1])
        uv = u.multiply(v)
        out[s] = sp.hstack([u, v, uv, abs(u - v), sp.csr_matrix(np.asarray(uv.sum(1)))]).tocsr()
    return out


def kneser_ney(train: np.ndarray, vocab: int, d: float = 0.75, order: int = 3):
    """`p(context, w)`: an interpolated Kneser-Ney n-gram of `order` (Chen & Goodman 1998, one discount `d` for every
    order) fitted on the `train` token stream; `context` holds the tokens before w (its last order − 1 are used;
    fewer at a block's start). The highest order counts n-grams, each lower one continuation counts N1+(· g); the
    unigram level is interpolated with the uniform distribution over all `vocab` tokens, so every token has mass."""
    toks = train.tolist()
    counts: list[Counter] = [Counter() for _ in range(order + 1)]
    counts[order] = Counter(zip(*(toks[i:len(toks) - order + 1 + i] for i in range(order))))
    for k in range(order - 1, 0, -1):
        for g in counts[k + 1]:  # every distinct (k+1)-gram adds one left extension to its suffix
            counts[k][g[1:]] += 1
    totals: list[Counter] = [Counter() for _ in range(order + 1)]
    types: list[Counter] = [Counter() for _ in range(order + 1)]
    for k in range(2, order + 1):
        for g, c in counts[k].items():
            totals[k][g[:-1]] += c
            types[k][g[:-1]] += 1
    uni_total, uni_types = sum(counts[1].values()), len(counts[1])

    def prob(context: tuple, w) -> float:
        k = len(context) + 1
        if k == 1:
            return (max(counts[1][w,] - d, 0) + d * uni_types / vocab) / uni_total
        lower = prob(context[1:], w)
        den = totals[k][context]
        if not den:
            return lower
        return (max(counts[k][(*context, w)] - d, 0) + d * types[k][context] * lower) / den

    def p(context, w):
        return prob(tuple(context)[len(context) - order + 1:] if len(context) >= order else tuple(context), w)

    return p


def kneser_ney_loss(train: np.ndarray, blocks: list[np.ndarray], vocab: int, d: float = 0.75,
                    order: int = 3) -> tuple[float, int]:
    """(mean NLL in nats, predictions) of `kneser_ney(train)` over each block's next-token predictions (context:
    the block's own earlier tokens, at most order − 1), as the LM task counts them."""
    p = kneser_ney(train, vocab, d, order)
    nll, n = 0.0, 0
    for b in blocks:
        b = b.tolist()
        for t in range(1, len(b)):
            nll -= np.log(p(b[max(0, t - order + 1):t], b[t]))
            n += 1
    return nll / max(n, 1), n


def best_kneser_ney(train: np.ndarray, val: list[np.ndarray], report: list[np.ndarray],
                    vocab: int) -> tuple[float, int, dict]:
    """(loss on `report`, predictions, choice): the Kneser-Ney order and discount (KN_ORDERS × KN_DISCOUNTS, the orders
    tried upwards until one does no better on validation than the one below it) with the lowest validation loss, then
    its loss on the report split (the same number when that is validation)."""
    scores: dict[tuple[int, float], float] = {}
    for o in KN_ORDERS:  # ascending; stop once an order does no better than the one before it
        for dd in KN_DISCOUNTS:
            scores[o, dd] = kneser_ney_loss(train, val, vocab, dd, o)[0]
        if o > KN_ORDERS[0] and min(scores[o, dd] for dd in KN_DISCOUNTS) >= min(
                scores[o - 1, dd] for dd in KN_DISCOUNTS):
            break
    order, disc = min(scores, key=scores.get)
    loss, n = kneser_ney_loss(train, report, vocab, disc, order)
    return loss, n, {"order": order, "discount": disc, "tuned_on": "val",
                     "tuning_scores": {f"order {o}, D {dd}": round(v, 4) for (o, dd), v in scores.items()}}


def listops_rules(ids: dict[str, list], y: dict[str, np.ndarray], split: str) -> list[dict]:
    """ListOps' two rule floors, fitted on the training trees (data/listops.py parses the encoded examples):
    - the outer operator → its most frequent training label (the plateau a model that reads one token sits on);
    - the depth-1 evaluator: the outer operator applied exactly to its arguments, each nested list among them
      replaced by its operator's most frequent value over every list of the training trees."""
    from ..data.listops import evaluate_to_depth, parse_ids, subtrees, tree_value

    def root_op(tree):
        return tree[0] if isinstance(tree, tuple) else None

    t = time.perf_counter()
    trees = {s: [parse_ids(r) for r in ids[s]] for s in ids}
    fallback = int(Counter(y["train"].tolist()).most_common(1)[0][0])
    parse_s = time.perf_counter() - t
    t = time.perf_counter()
    by_op: dict = defaultdict(Counter)
    for tree, label in zip(trees["train"], y["train"].tolist()):
        by_op[root_op(tree)][label] += 1
    rule = {op: c.most_common(1)[0][0] for op, c in by_op.items()}
    pred = np.array([rule.get(root_op(tree), fallback) for tree in trees[split]])
    outer = _floor("ListOps rule: outer operator → its most frequent label", float((pred == y[split]).mean()), split,
                   time.perf_counter() - t + parse_s, rule={str(k): int(v) for k, v in rule.items()})
    t = time.perf_counter()
    values: dict = defaultdict(Counter)
    for tree in trees["train"]:
        if tree is not None:
            for node in subtrees(tree):
                values[node[0]][tree_value(node)] += 1
    guess = {op: c.most_common(1)[0][0] for op, c in values.items()}
    pred = np.array([fallback if tree is None else evaluate_to_depth(tree, 1, guess) for tree in trees[split]])
    depth1 = _floor("ListOps depth-1 evaluator (nested lists guessed by their operator's most frequent value)",
                    float((pred == y[split]).mean()), split, time.perf_counter() - t + parse_s,
                    guess={str(k): int(v) for k, v in guess.items()})
    return [outer, depth1]


# ----------------------------------------------------------------------------------------------------
# One group's floors
# ----------------------------------------------------------------------------------------------------


def _floor(label: str, value: float, split: str, seconds: float, **extra) -> dict:
    return {"label": f"floor: {label}", "value": value, "split": split, "seconds": round(seconds, 2), **extra}


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


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
        from sklearn.neural_network import MLPClassifier

        x = {s: data[s][0] for s in names}
        add("logistic regression (pixels)", logreg, x, list(C_GRID))
        if builder == "images":
            add("kNN, k = 3 (pixels)", lambda _: KNeighborsClassifier(3), x)
            add("MLP, one hidden layer of 256 (pixels)",
                lambda _: MLPClassifier((256,), max_iter=200, random_state=0), x)
        add("RBF-kernel SVM (pixels; C and gamma on the tuning split)", RBFSVM, x, list(SVM_GRID),
            param="C, gamma/scale")
        side = int(round(np.sqrt(x["train"].shape[1])))
        if builder == "images" and side * side == x["train"].shape[1] and side % 4 == 0:
            def cnn():
                if tune_on_val:
                    fx, fy, tune = x["train"], y["train"], (x["val"], y["val"])
                else:  # the report is on validation: the epoch is picked on a seeded tenth of the training split
                    a, b = _tuning_split(len(y["train"]))
                    fx, fy, tune = x["train"][a], y["train"][a], (x["train"][b], y["train"][b])
                model = SmallCNN(side, CNN_EPOCHS, k).fit(fx, fy, tune)
                return float((model.predict(x[split]) == y[split]).mean()), model

            shift = int(((cfg.task.get("augment") or {}).get("shift_px")) or 0)
            for k in sorted({0, shift}):  # without shifts, and with the transformers' own (a fair floor)
                (acc, model), sec = _timed(cnn)
                aug = f", the transformers' ±{k}-pixel shifts" if k else ""
                out.append(_floor(f"small CNN (2 conv layers, pixels{aug}; best of {CNN_EPOCHS} epochs)", acc, split,
                                  sec, epochs=model.epoch, shift_px=k, tuned_on="val" if tune_on_val else "train tenth",
                                  tuning_scores={str(i + 1): v for i, v in enumerate(model.scores)}))
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


# ----------------------------------------------------------------------------------------------------
# The cache and the CLI
# ----------------------------------------------------------------------------------------------------


def cache_path(results_root: str | Path, scale: str, table: str) -> Path:
    return Path(results_root) / scale / "floors" / f"{table}.json"


def load(results_root: str | Path, scale: str, table: str) -> dict[str, dict]:
    """{group: entry} of a table's cached floors (empty when none were computed)."""
    return (read_json(cache_path(results_root, scale, table)) or {}).get("groups", {})


def table_floors(exp: dict, scale: str, results_root: str | Path, force: bool = False,
                 log=print) -> dict[str, dict]:
    """Compute (or read from the cache) every group's floors of one experiment and write the cache."""
    from ..config import compose_cell
    from ..data.registry import build_datasets

    if scale not in SCALES:
        raise ValueError(f"floors are for the offline scales {SCALES}, not scale={scale!r}")
    path = cache_path(results_root, scale, exp["table"])
    cached = load(results_root, scale, exp["table"])
    out: dict[str, dict] = {}
    tokenizer = None
    for group, (metric, overrides) in groups(exp, scale).items():
        if exp.get("pretrain"):
            tokenizer = tokenizer or pretrain_tokenizer(exp, scale)
            overrides = [*overrides, f"data.tokenizer={tokenizer}"]
        cfg = compose_cell(overrides)
        (bundle, s) = _timed(lambda cfg=cfg: build_datasets(cfg))
        key = data_key(cfg, bundle.checksum, bundle.info)
        # this group's cache entry, else another group's on the same data and metric (rows that share a split, such
        # as table 1's small rows, share their floors: one fit, one value)
        same = [e for e in (cached.get(group), *cached.values()) if e and e.get("key") == key
                and e.get("metric") == metric]
        if not force and same:
            log(f"[floors] {exp['table']} {group}: cached (data checksum {bundle.checksum[:12]})")
            out[group] = {**same[0], "cached": True}
            continue
        log(f"[floors] {exp['table']} {group}: data {cfg.data.name} built in {s:.1f} s, checksum "
            f"{bundle.checksum[:12]}")
        if (key, metric) not in _COMPUTED:
            _COMPUTED[key, metric] = compute(cfg, bundle, metric)
        out[group] = {"key": key, "data_checksum": bundle.checksum, "data": str(cfg.data.name), "metric": metric,
                      "floors": _COMPUTED[key, metric], "cached": False}
    write_json_atomic(path, {"table": exp["table"], "scale": scale, "version": VERSION,
                             "groups": {g: {k: v for k, v in e.items() if k != "cached"} for g, e in out.items()}})
    return out


def fit_time(floor: dict) -> str:
    """A floor's fitting time as printed beside it ("0.8 s"; "–" for a cache written before it was recorded)."""
    sec = floor.get("seconds")
    return "–" if sec is None else (f"{sec:.1f} s" if sec < 600 else f"{sec / 60:.1f} min")


def floor_lines(exp: dict, scale: str, results_root: str | Path, multiplier: float = 100.0,
                group: str | None = None) -> list[str]:
    """Markdown rows `| <group> | floor: ... | value |` of a table's cached floors (all groups, or one); [] when the
    scale has none. A renderer prints them under its table."""
    if scale not in SCALES:
        return []
    entries = load(results_root, scale, exp["table"])
    same: dict[tuple, list[str]] = {}  # rows on one split (table 1's five models) share their floors' lines
    for g, e in entries.items():
        if group is None or g == group:
            same.setdefault((e["key"], e["metric"]), []).append(g)
    rows = []
    for names in same.values():
        for f in entries[names[0]]["floors"]:
            label = f["label"].replace("|", "\\|")  # |u − v| inside a Markdown cell
            rows.append(f"| {', '.join(names)} | {label} | {f['value'] * multiplier:.2f} | {f['split']} | "
                        f"{fit_time(f)} |")
    return rows


def floor_table(exp: dict, scale: str, results_root: str | Path, multiplier: float = 100.0) -> str:
    """The floors block a renderer appends under a small/smoke table ("" when none are cached)."""
    rows = floor_lines(exp, scale, results_root, multiplier)
    if not rows:
        return ""
    head = ("Floors on the same data split (classical models and the majority class; not methods): "
            "`python -m condattn.reporting.floors --scale " + scale + "`.")
    return "\n".join([head, "", "| row | floor | value | split | fitting time |", "|---|---|---|---|---|", *rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.reporting.floors", description=__doc__.split("\n")[0])
    p.add_argument("--scale", default="small", choices=SCALES)
    p.add_argument("--tables", nargs="*", default=list(TABLES), help="experiment names (default: every small table)")
    p.add_argument("--results", default="results")
    p.add_argument("--force", action="store_true", help="recompute even when the cache matches")
    args = p.parse_args(argv)
    import yaml

    for table in args.tables:
        path = EXPERIMENTS / f"{table}.yaml"
        if not path.is_file():
            p.error(f"--tables {table}: there is no {path}; tables: {', '.join(TABLES)}")
        exp = yaml.safe_load(path.read_text())
        t = time.perf_counter()
        result = table_floors(exp, args.scale, args.results, args.force)
        times = float(exp.get("metric_multiplier", 100))  # as the table shows the metric
        for group, e in result.items():
            for f in e["floors"]:
                print(f"{table:20s} {group:12s} {f['label']:55s} {f['value'] * times:7.2f} ({f['split']}, "
                      f"{f['seconds']:.1f} s{', cached' if e['cached'] else ''})")
        print(f"[floors] {table}: {time.perf_counter() - t:.1f} s -> {cache_path(args.results, args.scale, table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
