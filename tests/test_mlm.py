"""crammed BERT + MLM pretraining: our crammed-BERT module (shapes, tied and bias-free weights, pre-LN, GLU, sparse
decoder, padding), SCA/CET on it, the `mlm` task's masking and evaluation, the `mlm_text` data (offline stand-in,
paper-scale layouts, missing data), the wall-clock budget (schedule, ramp, stop, resume) and tiny training runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from condattn.conditioning import find_attention, find_tokens
from condattn.config import compose
from condattn.data.registry import build_datasets
from condattn.engine.budget import Budget, budget_triangle
from condattn.engine.trainer import TrainingInterrupted, train
from condattn.models import build_model
from condattn.models.crammed_bert import CrammedBertForMLM
from condattn.tasks.mlm import IGNORE_INDEX, MLMTask, mask_tokens
from condattn.utils.io import read_jsonl

D, HEADS, VOCAB, N = 32, 2, 97, 24
SPECIAL = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK], as the mlm_text WordPiece lays them out


def bert(num_layers: int = 2, **kw) -> CrammedBertForMLM:
    torch.manual_seed(0)
    cfg = {"builder": "crammed_bert", "vocab_size": VOCAB, "seq_len": 32, "hidden_size": D, "num_layers": num_layers,
           "num_heads": HEADS, "intermediate_size": 4 * D, **kw}
    return build_model(cfg).eval()


def batch(b: int = 3, n: int = N) -> dict[str, torch.Tensor]:
    """Right-padded MLM batches (sample 0 unpadded, then 5 and 10 padded positions), [SEP] every 7 tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (b, n), generator=g)
    ids[:, 6::7] = 3
    mask = torch.ones(b, n, dtype=torch.long)
    for i in range(1, b):
        mask[i, n - 5 * i:] = 0
        ids[i, n - 5 * i:] = 0
    return {"input_ids": ids, "attention_mask": mask, "special_tokens_mask": torch.isin(ids, torch.tensor(SPECIAL)),
            "mask_token_id": torch.full((b,), 4), "tokenizer_size": torch.full((b,), VOCAB),
            "sample_index": torch.arange(b)}


def logits(model, ids, mask=None, labels=None) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, mask, labels)


# ---------------------------------------------------------------------------------------------------- the module


def test_shapes_tied_embedding_and_no_biases():
    model, inp = bert(), batch()
    assert logits(model, inp["input_ids"], inp["attention_mask"]).shape == (3, N, VOCAB)
    word = model.encoder.embedding.word_embedding
    assert model.decoder_weight is word.weight  # tied: the decoder IS the input embedding
    assert "encoder.embedding.word_embedding.weight" in model.state_dict()
    assert not any("decoder" in k for k in model.state_dict())  # stored once
    assert torch.equal(word.weight[0], torch.zeros(D))  # the padding row
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(linears) == 2 * 4 and len(norms) == 1 + 2 * 2 + 1  # embedding, 2 per block, final
    assert all(m.bias is None for m in linears + norms)
    assert all(m.bias is not None for m in bert(norm_bias=True).modules() if isinstance(m, torch.nn.LayerNorm))
    attn = model.encoder.layers[0].attn
    assert (attn.qkv.in_features, attn.qkv.out_features, attn.num_heads, attn.head_dim) == (D, 3 * D, 2, 16)
    # the output embedding's gradient includes the decoder's
    model.train()
    model(inp["input_ids"]).logsumexp(-1).sum().backward()
    assert word.weight.grad is not None and word.weight.grad.abs().sum() > 0


def test_pre_ln_order_glu_and_embedding():
    model = bert()
    enc, layer = model.encoder, model.encoder.layers[0]
    x = torch.randn(2, N, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        h = x + layer.attn(layer.norm1(x))  # pre-LN: the norm inside the residual branch
        want = h + layer.ffn(layer.norm2(h))
        assert torch.allclose(layer(x), want, atol=1e-6)
        ffn = layer.ffn
        assert ffn.dense_in.out_features == 4 * D and ffn.dense_out.in_features == 2 * D  # GLU halves 128 -> 64
        u = ffn.dense_in(x)
        a, gate = u[..., : 2 * D], u[..., 2 * D:]
        assert torch.allclose(ffn(x), ffn.dense_out(F.gelu(gate) * a), atol=1e-6)
        ids = batch()["input_ids"][:1]
        emb = enc.embedding
        pos = emb.pos_embedding.scale_factor * emb.pos_embedding.pe[:N]
        assert float(emb.pos_embedding.scale_factor) == pytest.approx(D**-0.5)
        e = emb.norm(emb.word_embedding(ids) + pos)  # word + scaled sinusoid, then LayerNorm
        assert torch.allclose(emb(ids), e, atol=1e-6)
        y = e
        for lay in enc.layers:
            y = lay(y)
        assert torch.allclose(enc(ids), enc.final_norm(y), atol=1e-6)  # final LayerNorm after the last block


def test_attention_is_block_stacked_qkv_softmax():
    """The fused qkv's output columns are [Q; K; V], head-major inside each block (what SCA and diagnostics read)."""
    attn = bert().encoder.layers[0].attn
    x = torch.randn(2, N, D, generator=torch.Generator().manual_seed(4))
    keep = torch.ones(2, N, dtype=torch.bool)
    keep[1, -6:] = False
    w = attn.qkv.weight
    d = attn.head_dim
    with torch.no_grad():
        outs = []
        for h in range(HEADS):
            q, k, v = (x @ w[r * D + h * d: r * D + (h + 1) * d].T for r in range(3))
            s = (q @ k.transpose(1, 2)) / math.sqrt(d)
            s = s.masked_fill(~keep[:, None, :], float("-inf"))
            outs.append(s.softmax(-1) @ v)
        want = attn.dense(torch.cat(outs, -1))
        assert torch.allclose(attn(x, keep[:, None, None, :]), want, atol=1e-5)


def test_sparse_prediction_equals_dense_at_masked_positions_and_padding_is_ignored():
    model, inp = bert(), batch()
    labels = torch.full_like(inp["input_ids"], IGNORE_INDEX)
    pick = torch.rand(inp["input_ids"].shape, generator=torch.Generator().manual_seed(5)) < 0.3
    pick &= inp["attention_mask"].bool()
    labels[pick] = inp["input_ids"][pick]
    dense = logits(model, inp["input_ids"], inp["attention_mask"])
    sparse = logits(model, inp["input_ids"], inp["attention_mask"], labels)
    assert sparse.shape == (int(pick.sum()), VOCAB)
    assert torch.allclose(sparse, dense[pick], atol=1e-5)
    # padded positions never influence real ones
    other = inp["input_ids"].clone()
    other[~inp["attention_mask"].bool()] = 7
    again = logits(model, other, inp["attention_mask"])
    real = inp["attention_mask"].bool()
    assert torch.allclose(again[real], dense[real], atol=1e-5)


# ---------------------------------------------------------------------------------------------------- conditioning


def test_token_site_and_attention_sites():
    model = bert(num_layers=3)
    site = find_tokens(model)
    assert site.layout == "crammed_bert" and site.mask_owner is model.encoder
    assert site.mask_arg == ("attention_mask", 1) and site.num_prefix_tokens == 0
    assert site.first_block is model.encoder.layers[0] and site.embed is model.encoder.embedding.word_embedding
    assert [n for n, _ in site.blocks] == [f"encoder.layers.{i}" for i in range(3)]
    sites = find_attention(model)
    assert [s.layout for s in sites] == ["crammed_bert"] * 3
    qkv = model.encoder.layers[1].attn.qkv
    assert [(s.proj[r].linear, s.proj[r].cols) for s in sites[1:2] for r in "qkv"] == [
        (qkv, slice(0, D)), (qkv, slice(D, 2 * D)), (qkv, slice(2 * D, 3 * D))]


# ---------------------------------------------------------------------------------------------------- the mlm task


def test_masking_statistics_80_10_10_and_no_special_token_masked():
    g = torch.Generator().manual_seed(0)
    b, n, v = 64, 128, 1000
    ids = torch.randint(5, v, (b, n), generator=g)
    ids[:, ::16] = 3  # [SEP]s
    ids[:, 0] = 2  # [CLS]
    attn = torch.ones(b, n, dtype=torch.long)
    attn[::2, 100:] = 0
    ids[attn == 0] = 0
    special = torch.isin(ids, torch.tensor(SPECIAL))
    inp = {"input_ids": ids, "attention_mask": attn, "special_tokens_mask": special,
           "mask_token_id": torch.full((b,), 4), "tokenizer_size": torch.full((b,), v)}
    task = MLMTask({"mlm_probability": 0.25})
    torch.manual_seed(123)
    out = task.mask(inp, task.train_uniform(inp))
    torch.manual_seed(123)
    assert torch.equal(task.mask(inp, task.train_uniform(inp))["input_ids"], out["input_ids"])  # seeded
    sel = out["labels"] != IGNORE_INDEX
    maskable = attn.bool() & ~special
    assert not (sel & ~maskable).any()  # never a special token, never padding
    assert torch.equal(out["input_ids"][~sel], ids[~sel])  # only selected positions change
    assert torch.equal(out["labels"][sel], ids[sel])
    frac = sel.sum() / maskable.sum()
    assert abs(float(frac) - 0.25) < 0.015
    new = out["input_ids"][sel]
    to_mask = (new == 4).float().mean()
    kept = (new == ids[sel]).float().mean()
    rand = ((new != 4) & (new != ids[sel])).float().mean()
    assert abs(float(to_mask) - 0.8) < 0.03 and abs(float(kept) - 0.1) < 0.02 and abs(float(rand) - 0.1) < 0.02
    # the random replacements come from the tokenizer's vocabulary
    assert int(out["input_ids"].max()) < v


def test_mask_tokens_by_hand():
    ids = torch.tensor([[10, 11, 12, 13, 3, 0]])
    maskable = torch.tensor([[True, True, True, True, False, False]])
    u = torch.tensor([[[0.1, 0.5, 0.0], [0.1, 0.85, 0.5], [0.1, 0.95, 0.0], [0.9, 0.0, 0.0], [0.0, 0.0, 0.0],
                       [0.0, 0.0, 0.0]]])
    new, labels = mask_tokens(ids, maskable, 4, 20, u, p=0.25)
    assert new.tolist() == [[4, 10, 12, 13, 3, 0]]  # [MASK], random (floor(0.5·20) = 10), kept, unselected
    assert labels.tolist() == [[10, 11, 12, -100, -100, -100]]


def test_eval_masks_depend_only_on_the_sample():
    task = MLMTask({"eval_seed": 7})
    full = batch(b=3)
    alone = {k: v[2:3] for k, v in full.items()}
    assert torch.equal(task.eval_uniform(full)[2], task.eval_uniform(alone)[0])
    assert not torch.equal(task.eval_uniform(full)[2], MLMTask({"eval_seed": 8}).eval_uniform(alone)[0])


class _Acc:
    @staticmethod
    def gather_for_metrics(x):
        return x


def test_evaluate_is_token_weighted_over_the_split():
    model, task = bert(), MLMTask({"mlm_probability": 0.4})
    full = batch(b=3)
    loader = [{k: v[:2] for k, v in full.items()}, {k: v[2:] for k, v in full.items()}]
    nll, hits = [], []
    for bt in loader:
        masked = task.mask(bt, task.eval_uniform(bt))
        dense = logits(model, masked["input_ids"], bt["attention_mask"])  # the dense decoder, by hand
        sel = masked["labels"] != IGNORE_INDEX
        lp = dense[sel].log_softmax(-1)
        nll += (-lp.gather(1, masked["labels"][sel][:, None]))[:, 0].tolist()
        hits += (lp.argmax(-1) == masked["labels"][sel]).tolist()
    out = task.evaluate(model, loader, _Acc())
    assert task.metric == "loss" and task.higher_is_better is False
    assert out["n"] == len(nll) > 5 and out["loss"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert out["acc"] == pytest.approx(sum(hits) / len(hits)) and out["ppl"] == pytest.approx(math.exp(out["loss"]))
    loss, logs = task.loss(model, full)
    assert torch.isfinite(loss) and 0 <= float(logs["acc"]) <= 1


# ---------------------------------------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mlm_cache")


def smoke(tmp: Path, cache: Path, *extra: str) -> list[str]:
    return ["task=mlm_crammed", "scale=smoke", "logger=none", f"paths.runs={tmp / 'runs'}", f"paths.cache={cache}",
            "data.vocab_size=512", "data.val_max_blocks=4", "diagnostics.batch_size=2", *extra]


@pytest.mark.slow
def test_data_builder_offline_stand_in(tmp_path, cache):
    bundle = build_datasets(compose(smoke(tmp_path, cache, "data.val_max_blocks=null")))
    info = bundle.info
    assert info["stand_in"] and "stand-in" in info["source"] and len(bundle.checksum) == 64 and bundle.test is None
    assert info["docs"] == {"train": 170, "val": 19}  # 10 % of the 189 speeches held out
    assert info["tokenizer"]["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert info["tokenizer"]["vocab_size"] <= 512 and len(info["tokenizer"]["sha256"]) == 64
    n = info["seq_len"]
    assert n == 128 and len(bundle.train) == info["tokens"]["train"] // n
    assert info["blocks"]["val"] == -(-info["tokens"]["val"] // n)
    stream = torch.cat([bundle.train[i]["input_ids"] for i in range(len(bundle.train))])
    assert int((stream == 3).sum()) <= 170 and int((stream == 2).sum()) == 0  # one [SEP] per document, no [CLS]
    item = bundle.train[0]
    assert bool(item["attention_mask"].all()) and torch.equal(item["special_tokens_mask"], item["input_ids"] < 5)
    assert int(item["mask_token_id"]) == 4 and int(item["tokenizer_size"]) == info["tokenizer"]["vocab_size"]
    last = bundle.val[len(bundle.val) - 1]  # the partial last validation block: right-padded with [PAD]
    real = int(last["attention_mask"].sum())
    assert real == info["tokens"]["val"] % n and bool((last["input_ids"][real:] == 0).all())
    assert bool(last["special_tokens_mask"][real:].all()) and int(last["sample_index"]) == len(bundle.val) - 1
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(info["cache"]) / "tokenizer.json"))
    assert " the " in tok.decode(item["input_ids"].tolist())  # real (lower-cased) English
    assert tok.encode("hello there").ids[0] == 2 and tok.encode("hello there").ids[-1] == 3  # [CLS] A [SEP]
    again = build_datasets(compose(smoke(tmp_path, tmp_path / "fresh", "data.val_max_blocks=null")))
    assert again.checksum == bundle.checksum and torch.equal(again.train[5]["input_ids"], bundle.train[5]["input_ids"])


def _write_corpus(root: Path, kind: str) -> None:
    docs = [f"The {w} of the {v} was {a} and everyone saw it." for w in ("cat", "dog", "bird", "fish", "horse")
            for v in ("house", "town", "farm", "river") for a in ("quiet", "loud")]
    if kind == "json":
        (root / "train").mkdir(parents=True)
        (root / "train" / "00.jsonl").write_text("\n".join(json.dumps({"text": t, "meta": {}}) for t in docs[:30]))
        (root / "val.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in docs[30:36]))
        (root / "test.jsonl").write_text(json.dumps({"text": "ignored"}))
    elif kind == "text":
        root.mkdir(parents=True)
        (root / "corpus.txt").write_text("\n".join(docs) + "\n\n")
    else:
        import datasets

        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs[:30]}),
                              "validation": datasets.Dataset.from_dict({"text": docs[30:36]})}).save_to_disk(root)


@pytest.mark.parametrize("kind", ["json", "hf_disk", "text"])
def test_paper_scale_layouts(tmp_path, kind):
    root = tmp_path / "pile"
    _write_corpus(root, kind)
    cfg_args = ["task=mlm_crammed", "scale=paper", f"paths.cache={tmp_path / 'cache'}", f"data.root={root}",
                "data.vocab_size=200", "data.seq_len=16", "data.val_fraction=0.25",
                "data.trash_cutoff=null"]  # the layouts, every document kept (trash removal: test_official_recipes)
    cfg = compose(cfg_args)
    bundle = build_datasets(cfg)
    info = bundle.info
    assert not info["stand_in"] and kind in info["source"] and info["checksum_kind"] in ("content", "fingerprint")
    if kind == "text":  # no validation split: each streamed line held out by a coin seeded with data.split_seed
        import numpy as np

        docs = info["docs"]  # 40 non-empty lines (+ one empty, never a document)
        held = int((np.random.default_rng(0).random(40) < 0.25).sum())
        assert docs == {"train": 40 - held, "val": held} and "seeded 0.25 of the streamed" in info["val_split"]
        whole = build_datasets(compose([*cfg_args, "data.max_train_docs=null"])).info  # converted whole, then split
        assert whole["docs"]["train"] + whole["docs"]["val"] == 40 and whole["docs"]["val"] in (10, 11)
    else:
        assert info["docs"] == {"train": 30, "val": 6} and info["val_split"] == "the source's validation split"
    assert len(bundle.train) > 0 and len(bundle.val) > 0


def test_paper_scale_without_data_names_the_path_and_layouts(tmp_path):
    nowhere = tmp_path / "nowhere"
    cfg = compose(["task=mlm_crammed", "scale=paper", f"data.root={nowhere}"])
    with pytest.raises(FileNotFoundError, match=str(nowhere)) as e:
        build_datasets(cfg)
    assert "dataset_dict.json" in str(e.value) and "jsonl" in str(e.value) and "parquet" in str(e.value)
    from condattn.engine.preflight import preflight

    assert any(p.kind == "data" and str(nowhere) in p.message for p in preflight(cfg, check_run_dir=False))


# ---------------------------------------------------------------------------------------------------- budget


def test_budget_triangle_and_batch_ramp_rules():
    assert [budget_triangle(p) for p in (0.0, 0.5, 0.75, 0.875, 1.0)] == pytest.approx([0.25, 0.75, 1.0, 0.5, 0.0])
    code = Budget(None, steps=100, ramp=0.6, ramp_rule="cramming")
    assert code.accumulation(0, 8192, 128) == 1
    assert code.accumulation(100, 8192, 128) * 128 == 4992  # cramming's formula: 0.6·8192 by the end (mbs 128)
    reach = Budget(None, steps=100, ramp=0.6, ramp_rule="reach")
    assert reach.accumulation(30, 8192, 128) == 33 and reach.accumulation(60, 8192, 128) == 64
    assert Budget(None, steps=100).accumulation(0, 8192, 128) == 64  # no ramp: the full batch
    timed = Budget(1.0, steps=1000)
    timed.bind(type("S", (), {"train_time": 1800.0})())
    assert timed.progress(10) == pytest.approx(0.5) and not timed.exhausted()  # time dominates step / steps
    timed.state.train_time = 3600.0
    assert timed.exhausted() and timed.progress(10) == 1.0
    with pytest.raises(ValueError, match="budget_hours"):
        Budget(-1, steps=10)
    from condattn.engine.preflight import preflight

    bad = compose(["task=mlm_crammed", "scale=smoke", "task.budget_hours=-2", "task.batch_size_ramp_rule=x"])
    msgs = " ".join(p.message for p in preflight(bad, check_data=False, check_run_dir=False))
    assert "budget_hours" in msgs
    assert not preflight(compose(["task=mlm_crammed", "scale=smoke"]), check_data=False, check_run_dir=False)


@pytest.mark.slow
def test_train_tiny_mlm_end_to_end(tmp_path, cache):
    s = train(compose(smoke(tmp_path, cache, "conditioning=spectral+embedded", "conditioning.lam=2", "task.steps=6",
                            "task.eval_every=3", "task.log_every=1", "impl.checkpoint_every=6")))
    assert s["status"] == "finished" and s["steps"] == 6 and s["global_batch"] == 16
    assert s["patch"]["counts"] == {"spectral:crammed_bert": 2, "embedded:crammed_bert": 1}
    m = s["metrics"]
    rows = read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")
    val = [r for r in rows if r["split"] == "val"]
    assert [r["step"] for r in val] == [3, 6] and m["val_loss"] == pytest.approx(min(r["loss"] for r in val))
    assert m["final_val_ppl"] == pytest.approx(math.exp(m["final_val_loss"])) and 0 < m["final_val_acc"] < 1
    assert 0 < m["final_val_loss"] < 10 and s["data"]["stand_in"] and s["train_tokens_per_s"] > 0
    # bert-o4's budget triangle over progress = step / steps (no budget here), lr 1e-3
    lrs = {r["step"]: r["lr"] for r in rows if r["split"] == "train"}
    assert lrs[3] == pytest.approx(1e-3 * budget_triangle(0.5)) and lrs[6] == pytest.approx(0.0, abs=1e-12)
    # bert-o4's relative batch ramp (0.6, rule `reach`, micro-batches of 8): one micro-batch, then two once
    # 2·p/0.6 ≥ 1, i.e. from step 2 of 6 on
    assert s["train_samples"] == sum(8 * Budget(None, 6, 0.6, "reach").accumulation(i, 16, 8) for i in range(6)) == 80
    assert s["budget"]["hours"] is None and not s["budget"]["stopped_by_budget"]
    d0 = s["diagnostics"]["step0"]
    assert d0["kappa_x/b0"] <= 2.05 and d0["kappa_wq/l0"] < 3  # CET at layers.0's input; SCA's λ = 2 on W_Q


@pytest.mark.slow
def test_interrupted_mlm_run_resumes_bit_identical(tmp_path, cache):
    """Training masks come from the global RNG, which accelerate checkpoints: a resumed run masks as an
    uninterrupted one (no budget: everything is a function of the step)."""
    base = ["task.steps=4", "task.eval_every=2", "impl.checkpoint_every=2", "conditioning=embedded"]
    full = train(compose(smoke(tmp_path, cache, *base, "run.name=full")))
    with pytest.raises(TrainingInterrupted):
        train(compose(smoke(tmp_path, cache, *base, "run.name=cut", "debug.interrupt_at_step=2")))
    resumed = train(compose(smoke(tmp_path, cache, *base, "run.name=cut")))
    assert resumed["launch"]["resumed_at_steps"] == [2] and resumed["metrics"] == full["metrics"]


@pytest.mark.slow
def test_budget_stops_the_run_and_summary_says_so(tmp_path, cache):
    hours = 0.4 / 3600  # 0.4 s of training
    s = train(compose(smoke(tmp_path, cache, f"task.budget_hours={hours}", "task.steps=10000",
                            "task.eval_every=10000", "impl.checkpoint_every=10000")))
    b = s["budget"]
    assert s["status"] == "finished" and b["stopped_by_budget"] and b["hours"] == pytest.approx(hours)
    assert 1 <= s["steps"] == b["steps_reached"] < 10000 and b["train_time_s"] >= 0.4
    val = [r for r in read_jsonl(Path(s["run_dir"]) / "metrics.jsonl") if r["split"] == "val"]
    assert [r["step"] for r in val] == [s["steps"]]  # evaluated where the budget stopped it
    assert (Path(s["run_dir"]) / "checkpoints" / f"step_{s['steps']:07d}").is_dir()
    assert s["train_tokens_per_s"] > 0 and s["train_samples"] > 0


@pytest.mark.slow
def test_kill_and_resume_finishes_within_its_budget(tmp_path, cache):
    """The budget counts training time across resumes: a resumed run spends only what is left of it."""
    budget_s = 0.6
    args = [f"task.budget_hours={budget_s / 3600}", "task.steps=10000", "task.eval_every=10000",
            "impl.checkpoint_every=10000", "run.name=budget"]
    with pytest.raises(TrainingInterrupted):
        train(compose(smoke(tmp_path, cache, *args, "debug.interrupt_at_step=2")))
    s = train(compose(smoke(tmp_path, cache, *args)))
    assert s["launch"]["resumed_at_steps"] == [2] and s["budget"]["stopped_by_budget"] and s["steps"] > 2
    assert s["budget"]["train_time_s"] >= budget_s
    # the budget is part of what a run is: an interrupted run is never resumed under another budget (that would mix
    # two configs in one run); the refusal names the key
    from condattn.engine.preflight import PreflightError

    with pytest.raises(TrainingInterrupted):
        train(compose(smoke(tmp_path, cache, "task.steps=10000", "impl.checkpoint_every=10000", "run.name=spent",
                            "debug.interrupt_at_step=2")))
    with pytest.raises(PreflightError, match="task.budget_hours"):
        train(compose(smoke(tmp_path, cache, "task.budget_hours=1e-7", "task.steps=10000",
                            "impl.checkpoint_every=10000", "run.name=spent")))


def test_small_mlm_reads_only_the_training_movies_of_the_small_glue_split():
    """Domain-adaptive pretraining (table 3, small): the MLM corpus's glue_split is the GLUE stand-in's own split, so
    no validation or test movie's snippet is pretrained on."""
    from condattn.config import compose

    mlm = compose(["task=mlm_crammed", "scale=small"]).data.generate
    glue = compose(["task=glue", "task.glue_task=rotten_tomatoes", "scale=small"]).data
    assert "rotten_tomatoes_train" in mlm.corpus.split("+")
    assert (mlm.glue_split.seed, mlm.glue_split.val_fraction, mlm.glue_split.test_fraction) == (
        glue.split_seed, glue.val_fraction, glue.test_fraction)
