"""GLUE fine-tuning (table 3): the official metrics against values computed by hand, the data layouts (the offline
stand-in, a saved DatasetDict, parquet files, a missing task), the classifier loading a pretraining run's encoder,
both methods on it, and the pretrain -> fine-tune pipeline through `reproduce`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import condattn
from condattn.config import compose
from condattn.data.glue_tasks import GLUE_TASKS
from condattn.data.registry import build_datasets
from condattn.models import build_model
from condattn.models.crammed_bert import CrammedBertForMLM
from condattn.tasks.glue import GlueTask, glue_metrics

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------------- metrics

def test_classification_metrics_by_hand():
    labels = np.array([1, 1, 0, 0, 1, 0])
    pred = np.array([1, 0, 0, 0, 1, 1])  # TP 2, TN 2, FP 1, FN 1
    m = glue_metrics(pred, labels, regression=False)
    assert m["acc"] == pytest.approx(4 / 6)
    assert m["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))  # 2TP / (2TP + FP + FN)
    assert m["mcc"] == pytest.approx((2 * 2 - 1 * 1) / np.sqrt(3 * 3 * 3 * 3))  # (TP·TN − FP·FN) / √(…)
    three = glue_metrics(np.array([0, 1, 2, 2, 1, 0]), np.array([0, 1, 2, 1, 1, 0]), regression=False)
    assert three["acc"] == pytest.approx(5 / 6) and "f1" not in three  # MNLI: 3 classes, accuracy
    assert glue_metrics(np.array([1, 1, 1]), np.array([1, 0, 1]), regression=False)["mcc"] == 0.0  # constant pred


def test_regression_metrics_by_hand():
    x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 5.0, 4.0])
    m = glue_metrics(x, y, regression=True)
    assert m["pearson"] == pytest.approx(3.5 / np.sqrt(5 * 4.75))  # Σdxdy / √(Σdx² Σdy²)
    assert m["spearman"] == pytest.approx(3.0 / np.sqrt(5 * 4.5))  # ranks of y: 1, 2.5, 4, 2.5 (ties averaged)
    assert glue_metrics(np.ones(4), y, regression=True) == {"pearson": 0.0, "spearman": 0.0}


def test_each_task_scores_its_official_metric():
    assert {k: v.metric for k, v in GLUE_TASKS.items() if k != "rotten_tomatoes"} == {
        "cola": "mcc", "sst2": "acc", "mrpc": "f1", "stsb": "pearson", "qqp": "f1", "mnli": "acc", "qnli": "acc",
        "rte": "acc"}
    assert GLUE_TASKS["stsb"].num_labels == 1 and GLUE_TASKS["mnli"].num_labels == 3
    assert GLUE_TASKS["mnli"].test == "validation_mismatched"


# ---------------------------------------------------------------------------------------------------- data

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    from condattn.data.mlm_text import train_wordpiece

    texts = ["the movie was good and the acting great", "a bad film , boring and long", "is it a question ?",
             "the premise holds the hypothesis"] * 50
    tok = train_wordpiece(iter([texts]), 300)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def glue_cfg(tmp: Path, tokenizer: Path, *extra: str):
    return compose(["task=glue", "scale=smoke", "logger=none", f"paths.runs={tmp / 'runs'}",
                    f"data.tokenizer={tokenizer}", "model.vocab_size=300", *extra])


@pytest.mark.slow
def test_stand_in_items_and_split_by_movie(tmp_path, tokenizer):
    from condattn.data.standins.rotten_tomatoes import rotten_tomatoes

    b = build_datasets(glue_cfg(tmp_path, tokenizer, "data.max_val_samples=null", "data.max_train_samples=null"))
    assert b.info["stand_in"] and b.info["glue_task"] == "rotten_tomatoes" and b.test is None
    item = b.train[0]
    assert item["input_ids"].shape == (64,) and item["input_ids"][0] == 2  # [CLS]
    n = int(item["attention_mask"].sum())
    assert item["input_ids"][n - 1] == 3 and (item["input_ids"][n:] == 0).all()  # [SEP], then [PAD]
    texts, labels, movies, _ = rotten_tomatoes()
    assert len(b.train) + len(b.val) == len(texts) and 0.05 < len(b.val) / len(texts) < 0.2
    assert set(torch.stack([b.train[i]["labels"] for i in range(200)]).tolist()) == {0, 1}


@pytest.mark.slow
def test_stand_in_test_fraction_holds_out_other_movies(tmp_path, tokenizer):
    from condattn.data.standins.rotten_tomatoes import stand_in_splits

    parts, _ = stand_in_splits(0, 0.1, 0.1)
    assert sorted(parts) == ["test", "train", "val"] and all(len(parts[k][0]) > 1000 for k in ("val", "test"))
    assert parts["val"][0][:3] != parts["test"][0][:3]
    with pytest.raises(ValueError, match="data.val_fraction=0.6 and data.test_fraction=0.5"):
        stand_in_splits(0, 0.6, 0.5)
    b = build_datasets(glue_cfg(tmp_path, tokenizer, "data.test_fraction=0.1", "data.max_val_samples=null"))
    assert b.test is not None and len(b.test) == len(parts["test"][0]) and "test_fraction" in b.info["splits"]["test"]
    assert b.info["sizes"]["test"] == len(b.test)


def _glue_rows(n: int, pair: tuple[str, str], regression: bool = False, classes: int = 2) -> dict:
    a = [f"the movie number {i} was good" for i in range(n)]
    b = [f"is it a question {i} ?" for i in range(n)]
    labels = [float(i % 5) for i in range(n)] if regression else [i % classes for i in range(n)]
    return {pair[0]: a, pair[1]: b, "label": labels, "idx": list(range(n))}


@pytest.mark.parametrize("layout", ["save_to_disk", "parquet"])
def test_paper_layouts(tmp_path, tokenizer, layout):
    import datasets

    root = tmp_path / "glue"
    splits = {"train": 40, "validation_matched": 9, "validation_mismatched": 7}
    data = {s: datasets.Dataset.from_dict(_glue_rows(n, ("premise", "hypothesis"), classes=3))
            for s, n in splits.items()}
    if layout == "save_to_disk":
        datasets.DatasetDict(data).save_to_disk(str(root / "mnli"))
    else:
        (root / "mnli").mkdir(parents=True)
        for s, ds in data.items():
            ds.to_parquet(str(root / "mnli" / f"{s}-00000-of-00001.parquet"))
    cfg = glue_cfg(tmp_path, tokenizer, "data.generate=null", f"data.root={root}", "task.glue_task=mnli")
    b = build_datasets(cfg)
    assert (len(b.train), len(b.val), len(b.test)) == (40, 9, 7) and not b.info["stand_in"]
    assert cfg.model.num_labels == 3
    ids = b.train[0]["input_ids"]
    n = int(b.train[0]["attention_mask"].sum())
    assert ids[0] == 2 and (ids[:n] == 3).sum() == 2  # [CLS] premise [SEP] hypothesis [SEP]


def test_missing_task_and_wrong_task_name(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="GLUE task 'rte' not found under .*dataset_dict.json"):
        build_datasets(glue_cfg(tmp_path, tokenizer, "data.generate=null", f"data.root={tmp_path}",
                                "task.glue_task=rte"))
    with pytest.raises(ValueError, match="task.glue_task='sst3' is not a GLUE task"):
        assert compose(["task=glue", "task.glue_task=sst3"]).model.num_labels


# ---------------------------------------------------------------------------------------------------- model

def classifier(num_labels: int = 2, init_from: str | None = None, **kw):
    torch.manual_seed(1)
    return build_model({"builder": "crammed_bert_classifier", "vocab_size": 97, "num_labels": num_labels,
                        "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 128,
                        "head_dim": 16, "init_from": init_from, **kw}).eval()


def test_classifier_loads_the_pretrained_encoder(tmp_path):
    torch.manual_seed(0)
    mlm = CrammedBertForMLM(vocab_size=97, seq_len=32, hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=128)
    torch.save(mlm.state_dict(), tmp_path / "best_model.pt")
    with pytest.raises(FileNotFoundError, match="has not finished"):  # an unfinished run's weights: only by file
        classifier(init_from=str(tmp_path))
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "metrics": {}}))
    model = classifier(init_from=str(tmp_path))
    for k, v in mlm.encoder.state_dict().items():
        assert torch.equal(model.encoder.state_dict()[k], v), k
    ids = torch.randint(5, 97, (3, 10))
    assert model(ids).shape == (3, 2) and classifier(1)(ids).shape == (3, 1)
    with pytest.raises(ValueError, match="not this crammed-BERT architecture .*hidden_size"):
        classifier(init_from=str(tmp_path), hidden_size=64, head_dim=16)
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read weights from .*bad.pt"):
        classifier(init_from=str(tmp_path / "bad.pt"))
    with pytest.raises(FileNotFoundError, match="init_from='nope'"):
        classifier(init_from="nope", runs_root=str(tmp_path))


@pytest.mark.parametrize("method,expected", [("spectral", {"spectral:crammed_bert": 2}),
                                             ("embedded", {"embedded:crammed_bert": 1})])
def test_both_methods_patch_the_classifier(method, expected):
    base = classifier()
    ids = torch.randint(5, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    ref = base(ids, mask)
    plain = classifier()
    condattn.apply_conditioning(plain, "none")
    assert torch.equal(plain(ids, mask), ref)
    model = classifier()
    keys = list(model.state_dict())
    report = condattn.apply_conditioning(model, method)
    assert report.counts == expected and list(model.state_dict()) == keys
    assert not torch.allclose(model(ids, mask), ref)


def test_task_loss_and_evaluate_regression():
    class Acc:
        @staticmethod
        def gather_for_metrics(x):
            return x

    cfg = compose(["task=glue", "task.glue_task=stsb"]).task
    task = GlueTask(cfg)
    model = classifier(1)
    batches = [{"input_ids": torch.randint(5, 97, (4, 10)), "attention_mask": torch.ones(4, 10, dtype=torch.long),
                "labels": torch.tensor([0.0, 1.5, 3.0, 5.0])} for _ in range(2)]
    loss, logs = task.loss(model, batches[0])
    assert loss.ndim == 0 and logs == {}
    out = task.evaluate(model, batches, Acc())
    assert out["n"] == 8 and out["score"] == out["pearson"] and "spearman" in out


# ---------------------------------------------------------------------------------------------------- recipe

def test_recipe_composes_cramming_glue_sane():
    cfg = compose(["task=glue", "task.glue_task=rte"])
    assert cfg.task.steps == 5 * (2490 // 16) and cfg.task.eval_every == 2490 // 16 and cfg.task.batch_size == 16
    assert (cfg.optim.lr, cfg.optim.schedule, cfg.optim.warmup_ratio, cfg.optim.weight_decay) == (4e-5, "cosine",
                                                                                                   0.1, 0.0)
    assert cfg.model.attention_layers == cfg.model.num_layers == 16 and cfg.model.num_labels == 2


@pytest.mark.slow
def test_reproduce_table3_pretrain_then_finetune(tmp_path):
    """The table-3 pipeline end to end on a shrunk smoke scale: one pretraining run per method, two fine-tuning seeds
    each starting from its method's pretraining weights, then the medians table."""
    from condattn import reproduce

    runs, results = tmp_path / "runs", tmp_path / "results"
    exp = yaml.safe_load((ROOT / "experiments/table3_glue.yaml").read_text())
    exp["methods"] = ["none", "embedded"]
    # shrunk as the experiment's own smoke overrides, so the cells keep their names (extra overrides that change a
    # result would name variant runs)
    shrink = ["task.steps=4", "task.eval_every=2", "diagnostics.batch_size=2"]
    exp["scales"]["smoke"]["overrides"] = [*(exp["scales"]["smoke"].get("overrides") or []), *shrink]
    exp["scales"]["smoke"]["seeds"] = [0, 1]  # the experiment's seeds: the default table (--seeds would name another)
    exp["pretrain"].setdefault("scales", {})["smoke"] = [*(exp["pretrain"].get("scales", {}).get("smoke") or []),
                                                         *shrink]
    exp_path = tmp_path / "table3_glue.yaml"
    exp_path.write_text(yaml.safe_dump(exp))
    code = reproduce.main([str(exp_path), "--scale", "smoke", "logger=none", f"paths.runs={runs}",
                           f"paths.results={results}", f"paths.cache={tmp_path / 'cache'}", "impl.checkpoint_every=4"])
    assert code == 0
    pre = json.loads((runs / "smoke/table3_glue_pretrain_embedded_smoke_s0/summary.json").read_text())
    ft = json.loads((runs / "smoke/table3_glue_rotten_tomatoes_embedded_smoke_s1/summary.json").read_text())
    assert pre["steps"] == 4 and ft["steps"] == 4 and ft["config"]["model"]["init_from"] == pre["run_name"]
    # the fine-tuning reads the pretraining run's own copy of its tokenizer, the one its data cache held
    tok = Path(ft["data"]["tokenizer"]["file"])
    assert ft["patch"]["counts"] == {"embedded:crammed_bert": 1} and tok == Path(pre["run_dir"]) / "tokenizer.json"
    assert tok.read_bytes() == (Path(pre["data"]["cache"]) / "tokenizer.json").read_bytes()
    assert 0 <= ft["metrics"]["final_val_score"] <= 1 and ft["metrics"]["final_val_score"] == ft["metrics"][
        "final_val_acc"]
    md = (results / "smoke/table3_glue.md").read_text()
    assert "SST-2 stand-in (Rotten Tomatoes)" in md and "(n=2)" in md and "paper CET: CET" in md
    assert "table3_glue_pretrain_none_smoke_s0 | 4 |" in md


@pytest.mark.slow
def test_slurm_submits_pretraining_first(tmp_path, capsys):
    """A job array has no order: the first call submits only the pretraining runs, the fine-tuning cells wait."""
    from condattn import reproduce

    code = reproduce.main(["experiments/table3_glue.yaml", "--scale", "smoke", "--launcher", "slurm", "--dry-run",
                           f"paths.runs={tmp_path / 'runs'}"])
    out = capsys.readouterr().out
    assert code == 0 and "3 cells to submit" in out
    assert "5 cells (table3_glue_rotten_tomatoes_embedded_smoke_s0 … table3_glue_rotten_tomatoes_embedded_smoke_s4) " \
           "wait for their pretraining run table3_glue_pretrain_embedded_smoke_s0" in out
