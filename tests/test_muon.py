"""optim=muon: torch.optim.Muon on the hidden layers' 2-D weights, AdamW on the rest, behind one optimizer that the
schedule, the trainer and checkpoints use; and one table's smoke cell trained with it through the real entry point."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from condattn.engine.muon import muon_available, muon_ids
from condattn.engine.optim import build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]


def _vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                             num_heads=2, depth=2, num_classes=10)


def _cfg(**optim):
    base = OmegaConf.load(REPO / "configs" / "optim" / "muon.yaml")
    return OmegaConf.create({"optim": OmegaConf.merge(base, {"lr": 1e-3, "weight_decay": 0.05, **optim})})


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = _vit()
    names = {n for n, p in model.named_parameters() if id(p) in muon_ids(model)}
    assert names == {f"blocks.{i}.{m}.weight" for i in range(2)
                     for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    opt, sched = build_optimizer(model, _cfg(schedule="linear", warmup_steps=2), 8, 10)
    assert type(opt.muon).__name__ == "Muon" and type(opt.adamw).__name__ == "AdamW"
    muon_params = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    assert muon_params == muon_ids(model)
    assert {id(p) for g in opt.adamw.param_groups for p in g["params"]} == \
        {id(p) for p in model.parameters()} - muon_params
    assert all(g["weight_decay"] == 0.05 for g in opt.muon.param_groups)  # (2-D weights: decayed)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):
        model(x).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters() if p.ndim == 2)
    # the schedule's lr reaches both optimizers (warmup: step 2 of 2 → the full lr)
    assert opt.muon.param_groups[0]["lr"] == opt.adamw.param_groups[0]["lr"] == pytest.approx(1e-3)
    state = opt.state_dict()
    other, _ = build_optimizer(_vit(), _cfg(), 8, 10)
    other.load_state_dict(state)
    assert other.muon.state_dict()["state"].keys() == opt.muon.state_dict()["state"].keys()


def test_muon_refuses_in_one_line_where_torch_lacks_it(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    why = muon_available()
    assert why.startswith("optim=muon needs torch.optim.Muon") and "\n" not in why
    with pytest.raises(ValueError, match="needs torch.optim.Muon"):
        build_optimizer(_vit(), _cfg(), 8, 10)


def test_muon_refuses_an_unknown_lr_adjustment():
    with pytest.raises(ValueError, match="optim.muon_adjust_lr='rms': choose one of"):
        build_optimizer(_vit(), _cfg(muon_adjust_lr="rms"), 8, 10)


@pytest.mark.slow
def test_a_smoke_cell_trains_with_muon(tmp_path):
    """Table 4's Image baseline smoke cell with optim=muon, through the trainer (6 of its 60 steps, with an
    evaluation, a checkpoint and the test pass: the pipeline, not the number): it finishes, and its science config
    (the run identity's hash) differs from the AdamW cell's."""
    from condattn.config import compose_cell
    from condattn.engine.identity import config_hash, science_config
    from condattn.engine.trainer import train
    from condattn.experiment import load
    from condattn.reproduce import cells

    exp = load(REPO / "experiments" / "table4_lra.yaml")
    (name, overrides), = [c for c in cells(exp, "smoke", [0], [], only_rows=["image"]) if "_none_" in c[0]]
    extra = ["logger=none", f"paths.runs={tmp_path / 'runs'}", f"paths.cache={tmp_path / 'cache'}", "task.steps=6",
             "task.eval_every=6", "impl.checkpoint_every=3", "optim.warmup_steps=1"]
    cfg = compose_cell([*overrides, "optim=muon", *extra])
    assert cfg.optim.name == "muon" and cfg.optim.lr == compose_cell([*overrides, *extra]).optim.lr
    s = train(cfg)
    assert s["status"] == "finished" and s["steps"] == 6 and 0.0 <= s["metrics"]["test_acc"] <= 1.0
    adamw = compose_cell([*overrides, *extra])
    assert config_hash(science_config(cfg)) != config_hash(science_config(adamw))
