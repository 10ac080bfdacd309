"""The four remaining LRA tasks end to end on tiny stand-in data, the two-tower Retrieval model under both
conditioning methods, paper-scale configs without data, and table 4's rows at every scale."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

import condattn
from condattn.conditioning.embedded import polar_correction
from condattn.config import compose
from condattn.engine.trainer import train
from condattn.models import build_model
from condattn.utils.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "experiments" / "table4_lra.yaml"
ROWS = yaml.safe_load(EXP.read_text())["rows"]

# Per task: (row overrides, tiny-data overrides). Sequences of 64 tokens (= the 64 landmarks), global batch 8.
TASKS = {
    "text": (ROWS["text"]["overrides"], [
        "data.generate.train=64", "data.generate.test=16", "data.max_length=60", "data.seq_len=64",
    ]),
    "retrieval": (ROWS["retrieval"]["overrides"], [
        "data.generate.train=48", "data.generate.val=16", "data.generate.test=16", "data.max_length=60",
        "data.seq_len=64", "impl.micro_batch_size=4",
    ]),
    "image": (ROWS["image"]["overrides"], [
        "data.generate.source=digits", "data.generate.n=120", "data.image_size=8", "data.seq_len=64",
        "impl.micro_batch_size=4",
    ]),
    "pathfinder": (ROWS["pathfinder"]["overrides"], [
        "data.generate.n=60", "data.variant=curv_baseline", "data.image_size=8", "data.seq_len=64",
        "impl.micro_batch_size=4",
    ]),
}


def tiny(task: str, tmp: Path, cache: Path, *extra: str) -> list[str]:
    row, data = TASKS[task]
    return [
        *row, "scale=smoke", "logger=none", f"paths.runs={tmp}", f"paths.cache={cache}", *data,
        "task.batch_size=8", "task.steps=4", "task.eval_every=2", "task.log_every=1", "impl.checkpoint_every=2",
        "diagnostics.batch_size=2", *extra,
    ]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lra_cache")


# ---------------------------------------------------------------------------------------------------- end to end

CASES = [  # (task, method, expected patch counts)
    ("text", "embedded", {"embedded:hf_encoder": 1}),
    ("retrieval", "spectral+embedded", {"spectral:hf_separate_qkv": 2, "embedded:hf_encoder": 1}),
    ("image", "spectral", {"spectral:hf_separate_qkv": 2}),
    ("pathfinder", "none", {}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("task", "method", "counts"), CASES, ids=[c[0] for c in CASES])
def test_task_trains_and_evaluates_end_to_end(tmp_path, cache, task, method, counts):
    s = train(compose(tiny(task, tmp_path, cache, f"conditioning={method}")))
    assert s["status"] == "finished" and s["steps"] == 4 and s["global_batch"] == 8
    assert s["grad_accum"] == (1 if task == "text" else 2) and s["micro_batch"] == (8 if task == "text" else 4)
    assert s["patch"]["counts"] == counts
    assert 0.0 <= s["metrics"]["test_acc"] <= 1.0 and s["metrics"]["best_step"] in (2, 4)
    d = s["data"]
    assert d["stand_in"] and "stand-in" in d["source"] and len(d["checksum"]) == 64
    assert all(n > 0 for n in d["sizes"].values())
    if task == "pathfinder":  # the variant is recorded twice: the data info and the resolved config
        assert d["variant"] == "curv_baseline" and s["config"]["data"]["variant"] == "curv_baseline"
    if task == "text":
        assert not d["val_is_test"] and d["val_source"] == "holdout"  # selection never sees the test set
    rows = read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "val"] == [2, 4]
    assert {"diag", "grad"} <= {r["split"] for r in rows}
    assert json.loads((Path(s["run_dir"]) / "summary.json").read_text())["metrics"] == s["metrics"]


@pytest.mark.parametrize("task", list(TASKS))
def test_paper_scale_without_data_names_the_path(tmp_path, task):
    row, _ = TASKS[task]
    nowhere = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(nowhere)):
        train(compose([*row, "scale=paper", "logger=none", f"paths.runs={tmp_path}", f"data.root={nowhere}"]))


# ---------------------------------------------------------------------------------------------------- retrieval model


def dual_model(seq_len: int = 128, *extra: str):
    cfg = compose(["model=nystromformer_lra_dual", "data=lra_retrieval", f"data.seq_len={seq_len}", *extra])
    torch.manual_seed(0)
    return build_model(cfg.model).eval()


def pair_batch(b: int = 3, n: int = 128) -> dict[str, torch.Tensor]:
    """Two towers with different padding (tower 0: lengths n, n-20, ...; tower 1: n-7, n-40, ...)."""
    g = torch.Generator().manual_seed(3)
    out = {}
    for k, (first, step) in enumerate(((n, 20), (n - 7, 33))):
        ids = torch.randint(1, 257, (b, n), generator=g)
        mask = torch.zeros(b, n, dtype=torch.long)
        for i in range(b):
            mask[i, : first - step * i] = 1
        out[f"input_ids_{k}"], out[f"attention_mask_{k}"] = ids * mask, mask
    return out


def test_dual_encoder_is_two_shared_towers_and_the_lra_head():
    model = dual_model()
    batch = pair_batch()
    assert model.head[0].in_features == 4 * 64
    u = model.encode(batch["input_ids_0"], batch["attention_mask_0"])
    v = model.encode(batch["input_ids_1"], batch["attention_mask_1"])
    with torch.no_grad():
        out = model(**batch)
        assert torch.allclose(out, model.head(torch.cat([u, v, u * v, u - v], -1)))
    assert out.shape == (3, 2)


@pytest.mark.parametrize(("method", "counts"), [
    ("spectral", {"spectral:hf_separate_qkv": 2}),
    ("embedded", {"embedded:hf_encoder": 1}),
    ("spectral+embedded", {"spectral:hf_separate_qkv": 2, "embedded:hf_encoder": 1}),
])
def test_dual_encoder_is_patched_once_for_both_towers(method, counts):
    model = dual_model()
    keys = set(model.state_dict())
    report = condattn.apply_conditioning(model, method)
    assert report.counts == counts
    report.check(attention_layers=2)  # what the trainer asserts against model.attention_layers
    assert all(m.startswith(("spectral:hf_separate_qkv backbone.encoder.layer.", "embedded:hf_encoder backbone"))
               for m in report.to_dict()["modules"])
    assert set(model.state_dict()) == keys
    with torch.no_grad():
        assert torch.isfinite(model(**pair_batch())).all()


def test_cet_conditions_each_tower_with_its_own_padding_mask():
    """The shared encoder runs once per tower; CET's pre-hook must use that tower's mask each time."""
    plain, patched = dual_model(), dual_model()
    condattn.apply_conditioning(patched, "embedded", solver="svd")
    seen = {"plain": [], "patched": []}
    for name, model in (("plain", plain), ("patched", patched)):

        def record(module, args, kwargs, name=name):
            seen[name].append((args[0] if args else kwargs["hidden_states"]).clone())

        model.backbone.encoder.layer[0].register_forward_pre_hook(record, with_kwargs=True)
    batch = pair_batch()
    with torch.no_grad():
        plain(**batch)
        patched(**batch)
    assert len(seen["plain"]) == len(seen["patched"]) == 2  # one pass per tower
    for k in range(2):
        mask = batch[f"attention_mask_{k}"].bool()
        expected = polar_correction(seen["plain"][k], mask)
        assert torch.allclose(seen["patched"][k], expected, atol=1e-5)
        assert torch.equal(seen["patched"][k][~mask], seen["plain"][k][~mask])  # padding untouched
        other = polar_correction(seen["plain"][k], batch[f"attention_mask_{1 - k}"].bool())
        assert not torch.allclose(seen["patched"][k], other, atol=1e-3)  # the other tower's mask would differ
        s = torch.linalg.svdvals(seen["patched"][k][0][mask[0]])
        assert float(s[0] / s[-1]) <= 2.0 + 1e-3


# ---------------------------------------------------------------------------------------------------- table 4


@pytest.mark.parametrize("scale", ["smoke", "small", "paper"])
@pytest.mark.slow
def test_table4_rows_compose_at_every_scale(scale):
    expected_steps = {"listops": 5000, "text": 20000, "retrieval": 30000, "image": 35000, "pathfinder": 62400}
    for row, spec in ROWS.items():
        cfg = compose([*spec["overrides"], f"scale={scale}"])
        assert cfg.model.seq_len == cfg.data.seq_len and cfg.data.seq_len % cfg.model.num_landmarks == 0
        batch, micro = int(cfg.task.batch_size), cfg.impl.micro_batch_size
        assert micro is None or batch % int(micro) == 0
        if scale == "paper":
            assert cfg.data.generate is None and int(cfg.task.steps) == expected_steps[row]
            assert float(cfg.optim.lr) == 1e-4 and float(cfg.optim.weight_decay) == 0.0
            if row in ("image", "pathfinder"):
                assert batch == 256 and micro == 128  # the Nyströmformer code's 2 × 128 on one GPU
        else:
            assert cfg.data.generate is not None  # offline stand-in
        if scale == "smoke" and row != "listops":
            assert cfg.data.seq_len == 256 and int(cfg.task.steps) <= 60


def test_table4_has_the_papers_numbers():
    exp = yaml.safe_load(EXP.read_text())
    assert list(exp["rows"]) == ["listops", "text", "retrieval", "image", "pathfinder"]
    # the papers' Nyströmformer LRA tables (test accuracy, %), baseline and conditioned per task
    papers = {"cet": ([37.1, 63.8, 79.8, 39.9, 72.9], [37.9, 64.9, 80.9, 40.1, 73.3]),
              "sca": ([37.1, 63.8, 79.8, 39.9, 72.9], [37.8, 64.8, 80.6, 40.2, 73.7])}
    for method, (baseline, conditioned) in papers.items():
        for i, row in enumerate(["listops", "text", "retrieval", "image", "pathfinder"]):
            assert exp["paper"][row][f"{method}_baseline"] == baseline[i]
            assert exp["paper"][row][method] == conditioned[i]


def test_diagnostics_read_each_towers_mask_from_the_model():
    """TokenProbe / AttentionProbe take the mask the encoder receives on each call: CET's κ(X) ≤ 2 shows in
    the diagnostics of both towers, and padded keys get no attention."""
    from condattn.diagnostics import cheap_diagnostics

    model = dual_model(128, "model.num_landmarks=128")  # exact softmax: the probe reads its probabilities
    condattn.apply_conditioning(model, "embedded")
    batch = pair_batch()
    out = cheap_diagnostics(model, lambda m, b: m(**b), batch)
    b0 = out["blocks"][0]
    assert len(b0["kappa"]) == 6  # 3 pairs × 2 towers
    assert b0["kappa_max"] <= 2.05  # the default (newton_schulz) solver's bound
    n_valid = [int(batch[f"attention_mask_{k}"][i].sum()) for k in range(2) for i in range(3)]
    expected_uniform = sum(n * math.log(n) for n in n_valid) / sum(n_valid)
    assert out["attention"][0]["entropy_uniform"] == pytest.approx(expected_uniform)


def test_small_listops_model_is_exact_softmax_without_conv():
    """The small ListOps recipe's Nyströmformer (landmarks = seq_len, conv_kernel_size null): no conv module, and its
    attention is softmax(q kᵀ / √d) v over the non-padded keys."""
    import torch

    from condattn.models.lra import NystromformerClassifier

    torch.manual_seed(0)
    m = NystromformerClassifier(vocab_size=20, num_classes=10, seq_len=18, num_landmarks=18, conv_kernel_size=None,
                                num_layers=3, dropout=0.0).eval()
    assert not [n for n, _ in m.named_modules() if n.endswith(".conv")] and len(m.backbone.encoder.layer) == 3
    att = m.backbone.encoder.layer[0].attention.self
    x, keep = torch.randn(2, 18, 64), torch.ones(2, 18)
    keep[1, 12:] = 0
    additive = ((1.0 - keep) * torch.finfo(torch.float32).min)[:, None, None, :]
    heads = lambda t: t.view(2, 18, 2, 32).transpose(1, 2)  # noqa: E731
    q, k, v = heads(att.query(x)), heads(att.key(x)), heads(att.value(x))
    want = (torch.softmax(q @ k.transpose(-1, -2) / 32 ** 0.5 + additive, -1) @ v).transpose(1, 2).reshape(2, 18, 64)
    assert torch.allclose(att(x, additive)[0], want, atol=1e-5)
