"""The mechanisms the paper recipes rely on: timm's cosine schedule with warm-up and min lr, torch's OneCycleLR as the
Nyströmformer LRA code builds it, timm's no-weight-decay rule with each model's names, the pre-LN Nyströmformer,
DETR's torchvision ResNet weights and TinyStories' tokenizer fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from condattn.engine.optim import build_optimizer, param_groups


def optim_cfg(**o):
    base = {"name": "adamw", "lr": 5e-4, "lr_ref_batch": 512, "weight_decay": 0.05, "betas": [0.9, 0.999],
            "eps": 1e-8, "warmup_steps": 0}
    return OmegaConf.create({"optim": {**base, **o}})


def lrs(opt, sched, steps, at):
    out = {}
    for i in range(steps):
        if i in at:
            out[i] = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
    return out


def test_timm_cosine_per_epoch_as_deit():
    """DeiT: warm-up from 1e-6 over 5 epochs, cosine to 1e-5, lr constant within an epoch (timm steps per epoch)."""
    from timm.scheduler import CosineLRScheduler

    cfg = optim_cfg(schedule="timm_cosine", warmup_steps=50, warmup_lr=1e-6, min_lr=1e-5, steps_per_epoch=10)
    opt, sched = build_optimizer(torch.nn.Linear(2, 2), cfg, 1024, 300)
    got = lrs(opt, sched, 300, {0, 9, 10, 50, 299})
    ref_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    ref = CosineLRScheduler(ref_opt, t_initial=30, lr_min=1e-5, warmup_t=5, warmup_lr_init=1e-6)
    for step, lr in got.items():
        ref.step(step // 10)
        assert lr == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-9), step
    assert got[0] == got[9] == pytest.approx(1e-6) and got[10] > got[9]
    assert 1e-5 < got[299] < 2e-5  # the last epoch, one step before the end of the cosine


def test_timm_cosine_per_step_as_swin_with_scaled_floors_and_cooldown():
    cfg = optim_cfg(schedule="timm_cosine", warmup_steps=20, warmup_lr=5e-7, min_lr=5e-6, scale_floors=True,
                    warmup_prefix=True, steps_per_epoch=None)
    opt, sched = build_optimizer(torch.nn.Linear(2, 2), cfg, 1024, 200)
    got = lrs(opt, sched, 200, {0, 1, 20, 199})
    assert got[0] == pytest.approx(1e-6) and got[1] > got[0]  # 5e-7 × 1024/512, updated every step
    assert got[20] == pytest.approx(1e-3)  # the cosine starts after the warm-up (warmup_prefix)
    assert got[199] == pytest.approx(1e-5, rel=0.01)  # 5e-6 × 2
    cfg = optim_cfg(schedule="timm_cosine", warmup_steps=10, warmup_lr=1e-6, min_lr=1e-5, cooldown_steps=50)
    opt, sched = build_optimizer(torch.nn.Linear(2, 2), cfg, 512, 200)
    got = lrs(opt, sched, 200, {150, 199})
    assert got[150] == got[199] == pytest.approx(1e-5)  # DaViT's cooldown epochs at min lr
    with pytest.raises(ValueError, match="cooldown_steps"):
        build_optimizer(torch.nn.Linear(2, 2), optim_cfg(schedule="timm_cosine", warmup_lr=0, min_lr=0,
                                                          cooldown_steps=200), 512, 200)


def test_onecycle_as_the_nystromformer_code():
    cfg = optim_cfg(schedule="onecycle", lr=1e-4, lr_ref_batch=None, weight_decay=0.0, eps=1e-6, warmup_steps=100,
                    anneal="linear")
    opt, sched = build_optimizer(torch.nn.Linear(2, 2), cfg, 32, 500)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4 / 25) and opt.param_groups[0]["betas"][0] == 0.95
    got = lrs(opt, sched, 500, {100, 300})
    assert got[100] == pytest.approx(1e-4, rel=0.01)
    assert got[300] == pytest.approx(1e-4 / 2, rel=0.01)  # linear anneal, halfway down
    assert opt.param_groups[0]["betas"][0] == pytest.approx(0.95, abs=1e-3)  # beta1 back up at the end
    opt, _ = build_optimizer(torch.nn.Linear(2, 2), cfg, 32, 4)  # shorter than the warm-up: still one up, one down
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-6)


def _decayed(model, names):
    groups = param_groups(model, 0.05, no_decay_names=names)
    ids = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_no_decay_names_follow_each_models_no_weight_decay():
    import timm

    with torch.device("meta"):
        deit = timm.create_model("deit_tiny_patch16_224", depth=1)
        xcit = timm.create_model("xcit_nano_12_p16_224", depth=1)
        swin = timm.create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1))
    d = _decayed(deit, ["pos_embed", "cls_token", "dist_token"])
    assert "cls_token" not in d and "pos_embed" not in d and "blocks.0.attn.qkv.weight" in d
    assert "blocks.0.attn.qkv.bias" not in d and "patch_embed.proj.weight" in d
    old = _decayed(deit, None)  # the default rule decays the class token
    assert "cls_token" in old and "pos_embed" not in old
    x = _decayed(xcit, ["pos_embed", "cls_token", "dist_token"])  # official XCiT: exact names
    assert "pos_embed.token_projection.weight" in x and "cls_token" not in x
    assert "pos_embed.token_projection.weight" not in _decayed(xcit, None)
    s = _decayed(swin, ["absolute_pos_embed", "*relative_position_bias_table"])
    tables = {n for n, _ in swin.named_parameters() if n.endswith("relative_position_bias_table")}
    assert tables and not tables & s and tables == set(swin.no_weight_decay()) & tables
    assert "layers.0.blocks.0.attn.qkv.weight" in s


def test_pre_norm_nystromformer_is_the_lra_arrangement():
    from condattn.models.lra import NystromformerClassifier, PreNormNystromformerLayer

    torch.manual_seed(0)
    m = NystromformerClassifier(vocab_size=19, num_classes=10, seq_len=64, num_landmarks=64).eval()
    post = NystromformerClassifier(vocab_size=19, num_classes=10, seq_len=64, num_landmarks=64, pre_norm=False)
    assert all(isinstance(layer, PreNormNystromformerLayer) for layer in m.backbone.encoder.layer)
    assert isinstance(m.backbone.embeddings.LayerNorm, torch.nn.Identity) and hasattr(m, "final_norm")
    assert not hasattr(post, "final_norm") and isinstance(post.backbone.embeddings.LayerNorm, torch.nn.LayerNorm)
    layer = m.backbone.encoder.layer[0]
    x = torch.randn(2, 64, 64)
    a = layer.attention
    mid = x + a.output.dense(a.self(a.output.LayerNorm(x))[0])
    want = mid + layer.output.dense(layer.intermediate(layer.output.LayerNorm(mid)))
    assert torch.allclose(layer(x)[0], want, atol=1e-5)
    ids = torch.randint(2, 19, (2, 64))
    assert m(ids, torch.ones_like(ids)).shape == (2, 10)


def test_detr_backbone_from_torchvision_weights(tmp_path, monkeypatch):
    import torchvision

    from condattn.models.detection import build_detr, torchvision_backbone_weights

    sd = torchvision.models.resnet18(weights=None).state_dict()
    torch.save(sd, tmp_path / "r18.pth")
    m = build_detr(num_classes=3, backbone="resnet18", backbone_weights=str(tmp_path / "r18.pth"), d_model=32,
                   encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=5,
                   config={"attention_dropout": 0.1, "activation_dropout": 0.1})
    feats = m.model.backbone.model.state_dict()
    assert torch.equal(feats["layer3.0.conv1.weight"], sd["layer3.0.conv1.weight"])
    assert m.config.attention_dropout == 0.1 and m.config.activation_dropout == 0.1
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="resnet50-0676ba61.pth"):
        torchvision_backbone_weights("torchvision")
    with pytest.raises(ValueError, match="choose one"):
        build_detr(num_classes=3, backbone="resnet18", use_pretrained_backbone=True, backbone_weights="x")


def test_tinystories_tokenizer_fallback_is_recorded(tmp_path):
    from condattn.data.lm_text import _tokenizer_choice

    d = OmegaConf.create({"tokenizer": str(tmp_path / "gpt2"), "tokenizer_if_missing": "train"})
    path, note = _tokenizer_choice(d)
    assert path is None and "not found" in note and str(tmp_path / "gpt2") in note
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "vocab.json").write_text("{}")
    (tmp_path / "gpt2" / "merges.txt").write_text("#version: 0.2\n")
    assert _tokenizer_choice(d) == (str(tmp_path / "gpt2"), "")
    stop = OmegaConf.create({"tokenizer": str(tmp_path / "none"), "tokenizer_if_missing": "stop"})
    assert _tokenizer_choice(stop) == (str(tmp_path / "none"), "")  # the builder then names the missing files


@pytest.mark.slow
def test_crammed_data_trash_removal_and_sentence_length_curriculum(tmp_path):
    import numpy as np

    from condattn.config import compose
    from condattn.data.mlm_text import curriculum_order
    from condattn.data.registry import build_datasets

    base = ["task=mlm_crammed", "scale=smoke", "logger=none", f"paths.runs={tmp_path / 'runs'}",
            f"paths.cache={tmp_path / 'cache'}", "data.vocab_size=512", "data.val_max_blocks=4"]
    plain = build_datasets(compose(base))
    assert plain.info["ordering"] == "randomized" and plain.info["trash_removal"] is None
    assert plain.sampler_factory is None
    cur = build_datasets(compose([*base, "data.trash_cutoff=0.4", "data.ordering=sentence-length-curriculum"]))
    kept, dropped = cur.info["docs"]["train"], cur.info["trash_removal"]["docs_dropped"]["train"]
    assert kept + dropped == plain.info["docs"]["train"]  # tokens < cutoff × chars (0.32-0.42 here)
    strict = build_datasets(compose([*base, "data.trash_cutoff=0.37"]))
    assert strict.info["trash_removal"]["docs_dropped"]["train"] > dropped
    from tokenizers import Tokenizer

    period = Tokenizer.from_file(str(Path(cur.info["cache"]) / "tokenizer.json")).token_to_id(".")
    counts = [int((cur.train[i]["input_ids"] == period).sum()) for i in range(len(cur.train))]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    sampler = cur.sampler_factory(len(cur.train), 0, 0, 1, block=4)
    assert list(sampler)[:8] == list(range(8))  # read in curriculum order, not shuffled
    toy = np.array([5, 1, 1, 1, 5, 5, 1, 1, 5, 5, 5, 1, 2], dtype=np.uint16)
    assert curriculum_order(toy, 4, 5).tolist() == [2, 1, 0]
