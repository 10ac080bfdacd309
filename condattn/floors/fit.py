"""The classical models a floor fits: logistic regression (plain, scaled, tf-idf), an RBF SVM, a small CNN,
Kneser-Ney n-grams and the ListOps rules; each picks its hyper-parameter on a tuning split."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import numpy as np

C_GRID = (0.1, 1.0, 10.0)


TEXT_C_GRID = (0.1, 1.0, 10.0, 100.0)  # tf-idf floors: their pick sat at C = 10, the edge of C_GRID


SVM_GRID = tuple((c, g) for c in (1.0, 10.0) for g in (1.0, 2.0, 4.0))  # (C, gamma as a multiple of "scale")


# A trained floor (the small CNN, the MLP) trains epoch by epoch, scored on its tuning split (validation, or a seeded
# tenth of the training split when validation is the reported split) after each. Its length is the epoch whose
# trailing mean over SMOOTH epochs is best (a tuning split of 350-500 samples moves about a point from epoch to epoch
# by chance: one lucky epoch must not pick it), and it trains until that best lies at least max(PATIENCE, its own
# epoch) epochs back (the curve flat over a window as long as the length chosen); it keeps that epoch's weights. One
# that reaches MAX_EPOCHS first says its curve was still rising.
PATIENCE = 10
SMOOTH = 5
MAX_EPOCHS = 150
# ... and at least MAX_SAMPLES samples: on a small training split (the hard stand-in's 500 images) 150 epochs are
# fewer samples than the transformers see (4,000 x 64), and such a floor would stop while still rising. 150 epochs of
# the MNIST 5k split's 3,500 images, so every floor there keeps its 150 epochs.
MAX_SAMPLES = 150 * 3500


def cap_for(n_train: int, cap: int = MAX_EPOCHS) -> int:
    """The epoch cap of a trained floor on `n_train` samples: `cap` epochs, or more when they are under MAX_SAMPLES."""
    return max(int(cap), -(-MAX_SAMPLES // max(int(n_train), 1)))
SOLVER_MAX_ITER = 5000  # logistic regression's lbfgs: iterations allowed to reach its own tolerance (converged)


KN_ORDERS = (2, 3, 4, 5, 6, 7, 8)  # the n-gram floor: the order (upwards while validation improves) and discount


KN_DISCOUNTS = (0.75, 0.9)


def smoothed(scores: list[float], smooth: int = SMOOTH) -> list[float]:
    """Each epoch's trailing mean over up to `smooth` epochs (fewer at the start)."""
    return [float(np.mean(scores[max(0, i - smooth + 1):i + 1])) for i in range(len(scores))]


def best_epoch(scores: list[float], smooth: int = SMOOTH) -> int:
    """The epoch (1-based) whose trailing mean is highest, the earliest of ties."""
    return int(np.argmax(smoothed(scores, smooth))) + 1


def window(scores: list[float], patience: int = PATIENCE, smooth: int = SMOOTH) -> int:
    """How far back the best must lie for the curve to count as flat: max(patience, the best epoch)."""
    return max(patience, best_epoch(scores, smooth)) if scores else patience


def flat(scores: list[float], patience: int = PATIENCE, smooth: int = SMOOTH) -> bool:
    """The curve is flat at its end: its trailing means over the last `window` epochs do not beat the best before
    them (the best lies at least max(patience, its own epoch) epochs back)."""
    w = window(scores, patience, smooth)
    s = smoothed(scores, smooth)
    return len(s) > w and max(s[-w:]) <= max(s[:-w])


def train_until_flat(epoch, tune_score, snapshot, patience: int = PATIENCE, cap: int = MAX_EPOCHS,
                     smooth: int = SMOOTH):
    """Run `epoch()` then `tune_score()` (the tuning split's score; nothing else is read) until the curve is flat
    (`flat`) or `cap` epochs; returns (scores, the `snapshot()` taken after `best_epoch`)."""
    scores: list[float] = []
    best, kept = None, -np.inf
    while len(scores) < cap and not flat(scores, patience, smooth):
        epoch()
        scores.append(float(tune_score()))
        if (mean := smoothed(scores, smooth)[-1]) > kept:
            best, kept = snapshot(), mean
    return scores, best


def length_record(scores: list[float], patience: int = PATIENCE, smooth: int = SMOOTH) -> dict:
    """What a trained floor records of its length: the epoch kept (best trailing mean on the tuning split), the
    epochs trained, the flatness window, whether the curve ended flat, and the window's best trailing mean over the
    best before it (≤ 0 when flat)."""
    w, s = window(scores, patience, smooth), smoothed(scores, smooth)
    return {"epochs": best_epoch(scores, smooth), "epochs_trained": len(scores), "window": w, "smooth": smooth,
            "flat": flat(scores, patience, smooth), "end_gain": (max(s[-w:]) - max(s[:-w])) if len(s) > w else None,
            "epoch_scores": {str(i + 1): v for i, v in enumerate(scores)}}


def solver_record(model) -> dict:
    """A convex fit's length: its solver's iterations (the most over its classes) and whether it stopped at its own
    tolerance (converged: the objective's curve is flat by the solver's criterion) before its iteration cap."""
    est = model.steps[-1][1] if hasattr(model, "steps") else model
    n_iter = getattr(est, "n_iter_", None)
    cap = getattr(est, "max_iter", -1)
    if n_iter is None:
        return {}
    iters = int(np.max(n_iter))
    return {"iterations": iters, "converged": cap is None or cap < 0 or iters < cap}


def tuning_data(x: dict, y: dict, tune_on_val: bool) -> tuple:
    """(fit x, fit y, (tune x, tune y)) of a trained floor: all of the training split and validation when the report
    is on test; else a seeded nine tenths of the training split and its other tenth (validation is reported)."""
    if tune_on_val:
        return x["train"], y["train"], (x["val"], y["val"])
    a, b = _tuning_split(len(y["train"]))
    return _rows(x["train"], a), y["train"][a], (_rows(x["train"], b), y["train"][b])


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
    return float((model.predict(report_x) == report_y).mean()), {**chosen, **solver_record(model)}


def logreg(c):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=SOLVER_MAX_ITER)


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
    64, seed 0, one thread, trained until its curve on `tune` (x, y) is flat (`train_until_flat`): the epoch kept is
    the one that scores best there."""

    def __init__(self, side: int, shift: int = 0, patience: int = PATIENCE, cap: int = MAX_EPOCHS):
        self.side, self.shift, self.patience, self.cap = side, int(shift), int(patience), int(cap)

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

            def epoch():
                self.net.train()
                for idx in torch.randperm(len(y), generator=gen).split(64):
                    xb = self._shifted(x[idx], gen) if self.shift else x[idx]
                    loss = torch.nn.functional.cross_entropy(self.net(xb), y[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()

            self.scores, best = train_until_flat(epoch, lambda: (self.predict(tune[0]) == np.asarray(tune[1])).mean(),
                                                 lambda: copy.deepcopy(self.net.state_dict()), self.patience,
                                                 cap_for(len(y), self.cap))
            self.net.load_state_dict(best)
        finally:
            torch.set_num_threads(threads)
        return self

    def predict(self, x):
        import torch

        self.net.eval()
        with torch.no_grad():
            return torch.cat([self.net(b).argmax(-1) for b in self._x(x).split(512)]).numpy()


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


class MLP:
    """One hidden layer of 256 (scikit-learn's MLPClassifier: Adam, batch 200, seed 0), trained one epoch at a time
    (partial_fit) until its curve on `tune` is flat (`train_until_flat`); the best epoch is kept."""

    def __init__(self, hidden: int = 256, patience: int = PATIENCE, cap: int = MAX_EPOCHS):
        self.hidden, self.patience, self.cap = hidden, int(patience), int(cap)

    def fit(self, x, y, tune: tuple):
        import copy

        from sklearn.neural_network import MLPClassifier

        net = MLPClassifier((self.hidden,), random_state=0)
        classes = np.unique(y)
        self.scores, self.model = train_until_flat(lambda: net.partial_fit(x, y, classes=classes),
                                                   lambda: (net.predict(tune[0]) == np.asarray(tune[1])).mean(),
                                                   lambda: copy.deepcopy(net), self.patience, cap_for(len(y), self.cap))
        return self

    def predict(self, x):
        return self.model.predict(x)


VERSION = 5  # bump when a floor's definition changes (the cache then recomputes)

def _floor(label: str, value: float, split: str, seconds: float, **extra) -> dict:
    return {"label": f"floor: {label}", "value": value, "split": split, "seconds": round(seconds, 2), **extra}
