"""Floors (condattn/floors/): the majority class and classical models on a table's own data split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import experiment_raw, plan_of, typed
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from condattn.data.registry import DataBundle
from condattn.floors import compute as floors
from condattn.floors import fit
from condattn.reporting import floors as view

VIT_SMOKE = {"table": "tfloors", "metric": "final_val_acc", "methods": ["none"],
             "rows": {"vit": {"overrides": ["task=imagenet_vit", "data.source=digits", "data.name=digits",
                                          "data.holdout_per_class=30"]}}, "scales": {"smoke": {"seeds": [0]}}}


class Tokens(Dataset):
    def __init__(self, ids, labels):
        self.ids, self.labels = torch.tensor(ids), torch.tensor(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": (self.ids[i] != 0).long(), "labels": self.labels[i]}


def test_majority_floor_is_the_hand_count():
    rng = np.random.default_rng(0)
    train_y, test_y = [2, 2, 2, 1, 0, 2, 1] * 10, [0, 1, 2, 2, 1, 1, 1, 0, 0, 0]
    make = lambda y: Tokens(rng.integers(1, 9, size=(len(y), 12)), y)  # noqa: E731
    bundle = DataBundle(make(train_y), make([0, 1, 2] * 4), make(test_y), "x")
    cfg = OmegaConf.create({"data": {"builder": "listops"}})
    out = floors.compute(cfg, bundle, "test_acc")
    majority = next(f for f in out if f["label"] == "floor: majority class")
    assert majority["class"] == 2 and majority["split"] == "test" and majority["value"] == pytest.approx(2 / 10)
    bag = next(f for f in out if "bag of tokens" in f["label"])
    assert bag["tuned_on"] == "val" and 0.0 <= bag["value"] <= 1.0


def test_kneser_ney_is_a_distribution_and_beats_uniform():
    rng = np.random.default_rng(0)
    stream = np.tile(rng.integers(0, 20, size=50), 40)  # a repeated pattern: a trigram predicts it well
    p = fit.kneser_ney(stream, vocab=30)
    for context in ([int(stream[3])], [int(stream[3]), int(stream[4])], [25, 26]):  # seen, seen, unseen
        assert sum(p(context, w) for w in range(30)) == pytest.approx(1.0)
    loss, n = fit.kneser_ney_loss(stream, [stream[:64], stream[100:110]], vocab=30)
    assert n == 63 + 9 and loss < np.log(30) / 4


@pytest.mark.slow  # fits an MLP
def test_image_floors_beat_majority_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(floors, "_COMPUTED", {})
    first = floors.table_floors(typed(VIT_SMOKE), "smoke", tmp_path, log=lambda *_: None)["vit"]
    assert not first["cached"] and first["data"] == "digits"
    by = {f["label"]: f for f in first["floors"]}
    majority = by["floor: majority class"]["value"]
    assert majority == pytest.approx(0.1)  # digits: 30 held out per class
    for label in ("floor: logistic regression (pixels)", "floor: kNN, k = 3 (pixels)",
                  "floor: MLP, one hidden layer of 256 (pixels)"):
        assert by[label]["value"] > majority + 0.5 and by[label]["split"] == "val", label
    assert by["floor: logistic regression (pixels)"]["tuned_on"] == "train tenth"  # val is the reported split

    def refuse(*a, **k):
        raise AssertionError("recomputed a cached floor")

    monkeypatch.setattr(floors, "compute", refuse)
    second = floors.table_floors(typed(VIT_SMOKE), "smoke", tmp_path, log=lambda *_: None)["vit"]
    assert second["cached"] and second["floors"] == first["floors"]
    monkeypatch.undo()
    monkeypatch.setattr(floors, "_COMPUTED", {})  # nothing remembered from the first call
    again = floors.table_floors(typed(VIT_SMOKE), "smoke", tmp_path, force=True, log=lambda *_: None)["vit"]
    assert [f["value"] for f in again["floors"]] == [f["value"] for f in first["floors"]]  # deterministic
    lines = view.floor_table("tfloors", "smoke", tmp_path)
    assert "| vit | floor: kNN, k = 3 (pixels) |" in lines and view.floor_table("tfloors", "paper", tmp_path) == ""


def test_floors_refuse_paper_scale(tmp_path):
    with pytest.raises(ValueError, match="offline scales"):
        floors.table_floors(typed(VIT_SMOKE), "paper", tmp_path)


def test_renderers_print_the_cached_floors_under_small_tables(tmp_path):
    """Table 9 shows its task's floors as rows of each task's readings; the other renderers as a block under the
    table; none at paper scale."""
    import shutil
    from pathlib import Path

    from condattn.reporting import readings, tables

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "small" / "floors").mkdir(parents=True)
    for t in ("table9_readings", "table1_imagenet"):
        shutil.copy(root / "results" / "small" / "floors" / f"{t}.json", tmp_path / "small" / "floors")
    exp9 = experiment_raw("table9_readings")
    _, md = readings.write_table(plan_of(exp9, "small", tmp_path / "runs", tmp_path, [0]))
    assert "**listops**" not in md  # small trains the ViT half (its note says why)
    vit = md.split("**vit**")[1]
    # the small ViT reports its test split (3,500 / 500 / 1,000), so its floors are on test too
    assert "| floor: kNN, k = 3 (pixels) | – | 92.40 (test" in vit and "floor: majority class" in vit
    both = {**exp9, "scales": {**exp9["scales"], "small": {k: v for k, v in exp9["scales"]["small"].items()
                                                            if k != "rows"}}}
    _, md = readings.write_table(plan_of(both, "small", tmp_path / "runs", tmp_path, [0]))
    assert "floor: logistic regression (bag of tokens)" in md.split("**listops**")[1]
    exp1 = experiment_raw("table1_imagenet")
    _, md = tables.write_table(plan_of(exp1, "small", tmp_path / "runs", tmp_path, [0]))
    # small table 1: its ViT, XCiT and Swin rows share one split (reported on test), so one block of floors; the
    # hard stand-in (vit_hard) has a split of its own, so a block of its own
    assert md.count("floor: MLP, one hidden layer of 256 (pixels)") == 2
    assert "| vit_base, xcit_medium, swin_base | floor: kNN, k = 3 (pixels) | 92.40 | test |" in md
    assert "| vit_hard | floor: kNN, k = 3 (pixels) | 62.54 | test |" in md
    assert "vit_base: the baseline" not in md  # no runs, no verdict
    _, md = tables.write_table(plan_of(exp1, "paper", tmp_path / "runs", tmp_path, [0]))
    assert "floor:" not in md


def test_listops_rule_floors_on_generated_trees(tmp_path):
    """The outer-operator rule and the depth-1 evaluator: hand-checkable on a tiny split, exact rules otherwise."""
    from condattn.data import listops as L

    train = ["( ( [MAX 2 ) 9 ) ]", "( ( [MAX 1 ) 9 ) ]", "( ( [MIN 3 ) 4 ) ]"]
    train_y = [9, 9, 3]
    test = ["( ( ( [MAX 2 ) ( ( [MIN 7 5 ) ] ) ) ]", "( ( [MIN 1 ) 8 ) ]"]  # labels 5, 1
    pad = lambda rows: [r + [0] * (16 - len(r)) for r in rows]  # noqa: E731
    make = lambda src, y: Tokens(pad([L.encode(s) for s in src]), y)  # noqa: E731
    bundle = DataBundle(make(train, train_y), make(test, [5, 1]), make(test, [5, 1]), "x")
    cfg = OmegaConf.create({"data": {"builder": "listops", "tokenization": "lra"}})
    by = {f["label"]: f for f in floors.compute(cfg, bundle, "test_acc")}
    outer = by["floor: ListOps rule: outer operator → its most frequent label"]
    assert outer["rule"] == {"[MAX": 9, "[MIN": 3} and outer["value"] == 0.0 and outer["seconds"] >= 0
    depth1 = next(f for label, f in by.items() if "depth-1 evaluator" in label)
    # [MIN's most frequent value over the training lists is 3: max(2, 3) = 3 ≠ 5; min(1, 8) = 1 ✓
    assert depth1["guess"]["[MIN"] == 3 and depth1["value"] == 0.5


def test_kneser_ney_any_order_is_a_distribution_and_the_best_order_is_picked_on_validation():
    rng = np.random.default_rng(1)
    stream = np.tile(rng.integers(0, 12, size=40), 30)
    for order in (1, 2, 4, 5):
        p = fit.kneser_ney(stream, vocab=16, order=order)
        for context in ([], [int(stream[5])], [int(x) for x in stream[5:9]], [13, 14, 15, 13]):
            assert sum(p(context, w) for w in range(16)) == pytest.approx(1.0), (order, context)
    held = [stream[:50], stream[200:260]]
    loss, n, chosen = fit.best_kneser_ney(stream, held, held, vocab=16)
    tried = len(chosen["tuning_scores"]) // len(fit.KN_DISCOUNTS)
    assert n == 49 + 59 and chosen["tuned_on"] == "val" and 2 <= tried <= len(fit.KN_ORDERS)
    assert loss == pytest.approx(min(fit.kneser_ney_loss(stream, held, 16, d, o)[0]
                                     for o in fit.KN_ORDERS[:tried] for d in fit.KN_DISCOUNTS))


def test_floor_table_prints_fitting_time():
    assert view.fit_time({"seconds": 2.04}) == "2.0 s" and view.fit_time({}) == "–"


@pytest.mark.slow  # fits the real floors once (~20 s)
def test_rows_on_the_same_split_share_one_cached_fit(tmp_path, monkeypatch):
    """A row added later on a split another row's floors were fitted on reads those floors: one fit, one value."""
    import copy

    monkeypatch.setattr(floors, "_COMPUTED", {})
    first = floors.table_floors(typed(VIT_SMOKE), "smoke", tmp_path, log=lambda *_: None)["vit"]
    twin = copy.deepcopy(VIT_SMOKE)
    twin["rows"]["vit_again"] = copy.deepcopy(twin["rows"]["vit"])

    def refuse(*a, **k):
        raise AssertionError("refitted floors on a split whose floors are cached")

    monkeypatch.setattr(floors, "_COMPUTED", {})
    monkeypatch.setattr(floors, "compute", refuse)
    both = floors.table_floors(typed(twin), "smoke", tmp_path, log=lambda *_: None)
    assert both["vit_again"]["cached"] and both["vit_again"]["floors"] == first["floors"]
    other = {**copy.deepcopy(VIT_SMOKE), "table": "tother"}  # another table on the same split: the same fit
    other["rows"] = {"hard": copy.deepcopy(VIT_SMOKE["rows"]["vit"])}
    there = floors.table_floors(typed(other), "smoke", tmp_path, log=lambda *_: None)["hard"]
    assert there["cached"] and there["floors"] == first["floors"] and (tmp_path / "smoke/floors/tother.json").is_file()


def test_the_small_cnn_floor_trains_with_the_transformers_shifts():
    """The fair image floor: each training image moves by a random integer offset in [-k, k] per axis, filled with 0
    (the ±k-pixel shifts task.augment.shift_px gives the transformers); the pixels themselves are kept."""
    from condattn.floors.fit import SmallCNN

    cnn = SmallCNN(side=8, shift=2)
    x = torch.zeros(50, 1, 8, 8)
    x[:, 0, 3, 4] = 1.0  # one lit pixel per image
    out = cnn._shifted(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and torch.all(out.sum((1, 2, 3)) == 1.0)  # moved by ≤ 2 px: never off the 8×8 frame
    where = out[:, 0].flatten(1).argmax(1)
    rows, cols = where // 8, where % 8
    assert rows.min() >= 1 and rows.max() <= 5 and cols.min() >= 2 and cols.max() <= 6
    assert len(set(zip(rows.tolist(), cols.tolist()))) > 5  # the offsets vary from image to image


def _run(val: list[float], patience: int = 3, cap: int = 50, smooth: int = 1):
    """train_until_flat over a constructed validation curve: epoch() advances, tune_score() reads the curve."""
    at = [0]

    def epoch():
        at[0] += 1

    return fit.train_until_flat(epoch, lambda: val[at[0] - 1], lambda: at[0], patience, cap, smooth)


def test_a_trained_floors_length_is_chosen_on_its_tuning_curve_only():
    """Validation peaks at epoch 4, the test curve (never given to the chooser) at epoch 9: epoch 4 is kept, and
    training stops once the best lies max(patience, 4) epochs back."""
    val = [0.50, 0.70, 0.80, 0.90, 0.85, 0.90, 0.88, 0.86, 0.84, 0.83, 0.82, 0.81]
    test = [0.50, 0.60, 0.70, 0.75, 0.80, 0.85, 0.90, 0.92, 0.95, 0.90, 0.85, 0.80]
    scores, best = _run(val)
    assert best == 4 and scores == val[:8]  # epochs 5-8 no better than 0.90 (a tie is not better): stopped at 8
    assert int(np.argmax(test)) + 1 == 9 != best
    rec = fit.length_record(scores, 3, 1)
    assert rec["epochs"] == 4 and rec["epochs_trained"] == 8 and rec["window"] == 4 and rec["flat"]
    assert rec["end_gain"] == pytest.approx(0.0)
    assert view.length({**rec, "tuned_on": "val"}) == "epoch 4 of 8 (best mean of 1 on val), flat over the last 4"


def test_one_lucky_epoch_does_not_choose_the_length():
    """A one-epoch spike at epoch 3 on a curve that keeps rising: the trailing mean of 3 picks the plateau, and the
    run goes on until the best lies max(patience, its epoch) epochs back."""
    val = [0.80, 0.85, 0.97, 0.88, 0.90, 0.92, 0.93, 0.94, 0.95, 0.95, 0.95] + [0.94] * 20
    assert _run(val, patience=3)[1] == 3  # raw scores: the spike wins
    scores, best = _run(val, patience=3, smooth=3)
    assert best == 11 and len(scores) == 22  # the mean of epochs 9-11 (0.95) is the best; 11 more no better
    assert fit.length_record(scores, 3, 3)["flat"]


def test_a_curve_still_rising_at_the_cap_is_said_to_be():
    val = [0.1 * i for i in range(1, 21)]
    scores, best = _run(val, patience=3, cap=8)
    rec = fit.length_record(scores, 3, 1)
    assert best == 8 and rec["epochs_trained"] == 8 and not rec["flat"] and rec["end_gain"] is None  # window 8
    assert view.length({**rec, "tuned_on": "train tenth"}) == ("epoch 8 of 8 (best mean of 1 on train tenth), still "
                                                              "rising at the cap")
    rec = fit.length_record([0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.5, 0.6, 0.7, 0.8, 0.96], 3, 1)  # window max(3, 11)
    assert not rec["flat"] and rec["window"] == 11 and rec["end_gain"] is None
    rec = fit.length_record([0.9, 0.5, 0.6, 0.7, 0.8], 1, 1)  # the best is epoch 1: window 1, the last epoch lower
    assert rec["flat"] and rec["end_gain"] == pytest.approx(-0.1)
    assert not fit.flat([0.5, 0.6, 0.7], 3, 1)  # too short to say


def test_the_tuning_split_is_validation_or_a_tenth_of_training_never_test():
    x = {s: np.arange(n)[:, None] + off for s, n, off in (("train", 50, 0), ("val", 7, 1000), ("test", 9, 2000))}
    y = {s: x[s][:, 0] % 3 for s in x}
    fx, fy, (tx, ty) = fit.tuning_data(x, y, tune_on_val=True)
    assert fx is x["train"] and tx is x["val"] and ty is y["val"]
    fx, fy, (tx, ty) = fit.tuning_data(x, y, tune_on_val=False)
    assert len(tx) == 5 and len(fx) == 45 and not set(tx[:, 0]) & set(fx[:, 0]) and tx.max() < 1000


def test_a_solver_floor_records_whether_it_converged():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(60, 4)), rng.integers(0, 2, 60)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=1 warns that it did not converge: the record says so
        short = fit.solver_record(LogisticRegression(max_iter=1).fit(xs, ys))
    done = fit.solver_record(fit.logreg(1.0).fit(xs, ys))
    assert short == {"iterations": 1, "converged": False} and done["converged"] and done["iterations"] > 1
    assert view.length(done) == f"converged in {done['iterations']} iterations" and view.length({}) == "–"


def test_a_small_training_split_gets_as_many_samples_as_the_mnist_split():
    """The epoch cap keeps 150 epochs on the 3,500-image split and larger ones, and grows on a smaller split until it
    is MAX_SAMPLES samples (500 images: 1,050 epochs), so a floor there is not stopped while it is still rising."""
    assert fit.cap_for(3500) == fit.MAX_EPOCHS == 150
    assert fit.cap_for(60000) == 150
    assert fit.cap_for(500) == 1050
    assert fit.cap_for(499) * 499 >= fit.MAX_SAMPLES > (fit.cap_for(499) - 1) * 499
