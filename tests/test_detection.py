"""Detection (tables 2 and 7): Mask R-CNN + XCiT and DETR build, patch with the counts their architectures define,
keep the foundation properties (none bit-identical, state_dict keys unchanged, κ(X + C) ≤ 2 on CET's tokens), train;
the COCO-format data (generated shapes, COCO layout errors), the COCO evaluation (exactly pycocotools'), the
multistep schedule / lr groups, backbone weights and the detection table."""

import copy
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import condattn
from condattn.conditioning import find_attention, find_tokens
from condattn.config import compose
from condattn.diagnostics import batch_condition_numbers, cheap_diagnostics, grad_diagnostics
from condattn.models import build_model
from condattn.tasks.detection import DetectionTask, coco_evaluate, detections_to_coco

MASKRCNN = "coco_maskrcnn_xcit_small"
DETR = "coco_detr_r50"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


def cfg_for(task: str, cache, *extra: str):
    return compose([f"task={task}", "scale=smoke", f"paths.cache={cache}", "logger=none", *extra])


def build(cfg, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg.model).eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def bundle(cache):
    from condattn.data.registry import build_datasets

    return build_datasets(cfg_for(MASKRCNN, cache))


def images(sizes=((96, 160), (128, 112)), seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, h, w, generator=g) for h, w in sizes]


# ---------------------------------------------------------------- data


def test_generated_shapes_are_deterministic_coco(tmp_path):
    from pycocotools import mask as mask_util
    from pycocotools.coco import COCO

    from condattn.data.standins import shapes

    params = {"train": 3, "val": 2, "seed": 7, "min_size": 64, "max_size": 96, "classes": ["circle", "rectangle",
              "triangle"], "min_objects": 2, "max_objects": 4, "min_object_frac": 0.25, "max_object_frac": 0.5,
              "min_area": 20}
    a = shapes.ensure_generated(tmp_path / "a", params)
    b = shapes.ensure_generated(tmp_path / "b", params)
    c = shapes.ensure_generated(tmp_path / "c", {**params, "seed": 8})
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert [p.relative_to(b) for p in sorted(b.rglob("*")) if p.is_file()] == files
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)  # byte-identical
    ann = a / "annotations" / "instances_train.json"
    assert ann.read_text() != (c / "annotations" / "instances_train.json").read_text()
    coco = COCO(str(ann))
    assert [x["name"] for x in coco.loadCats(coco.getCatIds())] == ["circle", "rectangle", "triangle"]
    assert len(coco.getImgIds()) == 3 and len(coco.getAnnIds()) >= 3
    for a_ in coco.loadAnns(coco.getAnnIds()):
        m = coco.annToMask(a_)
        assert m.sum() == a_["area"] and mask_util.area(coco.annToRLE(a_)) == a_["area"]
        ys, xs = np.nonzero(m)
        assert a_["bbox"] == [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()]


def test_coco_loader_augments_boxes_masks_together(bundle):
    from condattn.data.coco import collate

    tr, va = bundle.train, bundle.val
    assert bundle.collate_fn is collate and bundle.info["stand_in"] and bundle.info["num_classes"] == 3
    torch.manual_seed(0)
    for i in range(6):
        img, t = tr[i]
        h, w = img.shape[-2:]
        assert img.dtype == torch.float32 and 0 <= img.min() and img.max() <= 1
        assert t["masks"].shape == (len(t["labels"]), h, w) and t["masks"].dtype == torch.uint8
        assert t["boxes"].shape == (len(t["labels"]), 4) and ((t["labels"] >= 1) & (t["labels"] <= 3)).all()
        assert (t["boxes"][:, 2:] > t["boxes"][:, :2]).all() and (t["boxes"][:, 2] <= w).all()
        assert 96 <= min(h, w) <= 128 or max(h, w) == 213  # the smoke recipe's scales (short side) / long-side cap
        for box, m in zip(t["boxes"], t["masks"]):  # the mask lies inside its (resized / cropped / flipped) box
            ys, xs = torch.nonzero(m, as_tuple=True)
            if len(xs):
                assert xs.min() >= box[0] - 3 and xs.max() <= box[2] + 2  # (nearest-neighbour mask resize)
    img, t = va[0]
    assert tuple(t["orig_size"].tolist()) == tuple(img.shape[-2:])  # validation: the file as it is
    b = collate([va[0], va[1]])
    assert len(b["images"]) == 2 and b["targets"][1]["image_id"] == va.ids[1]


def test_missing_coco_names_the_path_and_layout(tmp_path):
    from condattn.data.registry import build_datasets
    from condattn.engine.preflight import preflight

    cfg = compose([f"task={MASKRCNN}", f"paths.data_root={tmp_path}"])
    with pytest.raises(FileNotFoundError) as e:
        build_datasets(cfg)
    msg = str(e.value)
    assert str(tmp_path / "coco" / "val2017") in msg and "instances_train2017.json" in msg and "data.root" in msg
    assert any(p.kind == "data" and "COCO not found" in p.message for p in preflight(cfg, 1, check_run_dir=False))


# ---------------------------------------------------------------- models: counts, identity, keys, CET


@pytest.mark.parametrize("task,expected", [(MASKRCNN, {"spectral:timm_xca": 12}),
                                           ("coco_maskrcnn_xcit_medium", {"spectral:timm_xca": 24}),
                                           (DETR, {"spectral:hf_detr": 18})])
def test_paper_entries_patch_every_attention_layer(task, expected):
    cfg = compose([f"task={task}", *(["model.backbone_weights=null"] if task == DETR else [])])  # no torchvision file
    with torch.device("meta"):  # the architecture only: no memory, no init
        model = build_model(cfg.model)
    rep = condattn.apply_conditioning(model, "spectral+embedded")
    assert rep.counts == {**expected, f"embedded:{'hf_detr' if task == DETR else 'timm_xcit'}": 1}
    rep.check(attention_layers=cfg.model.attention_layers)
    assert not any("cls_attn" in n for n, _ in model.named_modules())  # class attention dropped for detection


@pytest.mark.slow
def test_maskrcnn_xcit_patch_identity_keys_and_cet(cache):
    cfg = cfg_for(MASKRCNN, cache)
    base = build(cfg)
    keys = list(base.state_dict())
    x = images()  # non-square, not multiples of 16 or 224: Fourier positions and padding to 32 handle them
    with torch.no_grad():
        ref = base(x)
        feats = base.backbone(torch.rand(1, 3, 96, 160))
    assert [f.shape[-2:] for f in feats.values()] == [(24, 40), (12, 20), (6, 10), (3, 5), (2, 3)]  # strides 4..64

    same = build(cfg)
    assert condattn.apply_conditioning(same, "none").counts == {}
    with torch.no_grad():
        out = same(x)
    for a, b in zip(ref, out):  # conditioning=none: bit-identical detections
        assert all(torch.equal(a[k], b[k]) for k in a)

    for method in ("spectral", "embedded", "spectral+embedded"):
        m = build(cfg)
        rep = condattn.apply_conditioning(m, method, **({"solver": "svd"} if "embedded" in method else {}))
        rep.check(attention_layers=cfg.model.attention_layers)
        assert list(m.state_dict()) == keys
        if "spectral" in method:
            assert rep.counts["spectral:timm_xca"] == cfg.model.attention_layers == 4
        if "embedded" in method:
            site = find_tokens(m)
            assert site.layout == "timm_xcit" and site.first_block_name == "backbone.xcit.blocks.0"
            seen: list[torch.Tensor] = []
            h = site.first_block.register_forward_pre_hook(lambda mod, a, seen=seen: seen.append(a[0].detach()))
            with torch.no_grad():
                m(x)
            h.remove()
            kappa = batch_condition_numbers(seen[0].double())
            assert kappa.max() <= 2 + 1e-6, kappa  # κ(X + C) ≤ 2 (exact SVD)


@pytest.mark.slow
def test_detr_patch_kinds_identity_keys_and_padding(cache):
    cfg = cfg_for(DETR, cache)
    task = DetectionTask(cfg.task)
    base = build(cfg)
    keys = list(base.state_dict())
    inputs = task.detr_inputs(images(((96, 128), (64, 80))))  # the second image is padded
    assert inputs["pixel_mask"][1].sum() == 64 * 80  # (none bit-identical on DETR: tests/test_layouts.py)

    groups = [s.group for s in find_attention(base)]
    assert groups == ["encoder", "decoder_self", "decoder_cross", "decoder_self", "decoder_cross"]
    rep = condattn.apply_conditioning(build(cfg), "spectral")
    assert rep.counts == {"spectral:hf_detr": 5} and not rep.skipped
    m = build(cfg)
    rep = condattn.apply_conditioning(m, "spectral", detr_attention=["decoder_cross"])
    assert rep.counts == {"spectral:hf_detr": 2} and len(rep.skipped) == 3
    rep.check(attention_layers=cfg.model.attention_layers)  # 2 patched + 3 skipped = 5
    with pytest.raises(RuntimeError, match="skipped"):
        rep.check(attention_layers=4)
    assert sorted(n for n, mod in m.named_modules() if hasattr(mod, "_condattn_shift")) == [
        f"model.decoder.layers.{i}.encoder_attn.{p}_proj" for i in range(2) for p in "kqv"]
    assert list(m.state_dict()) == keys
    with pytest.raises(ValueError, match="detr_attention"):
        condattn.apply_conditioning(build(cfg), "spectral", detr_attention=["decoder"])

    m = build(cfg)
    rep = condattn.apply_conditioning(m, "embedded", solver="svd")
    rep.check()
    site = find_tokens(m)
    assert site.layout == "hf_detr" and site.first_block_name == "model.encoder.layers.0"
    before, after = [], []
    h1 = site.first_block.register_forward_pre_hook(lambda mod, a: before.append(a[0].detach()), prepend=True)
    h2 = site.first_block.register_forward_pre_hook(lambda mod, a: after.append(a[0].detach()))
    with torch.no_grad():
        m(**inputs)
    h1.remove()
    h2.remove()
    x, y = before[0], after[0]
    keep = torch.nn.functional.interpolate(inputs["pixel_mask"][None].float(), size=(3, 4))[0].bool().flatten(1)
    assert x.shape[1] == 12 and not keep[1].all()  # stride 32: 3 × 4 positions, some padded in image 1
    assert torch.equal(y[~keep], x[~keep])  # padded positions leave CET unchanged
    kappa = batch_condition_numbers(y.double(), keep)
    assert kappa.max() <= 2 + 1e-6, kappa


@pytest.mark.slow
def test_diagnostics_run_on_both_detectors(cache, bundle):
    from condattn.data.coco import collate

    batch = collate([bundle.val[i] for i in range(3)])  # images of different sizes: DETR pads
    for name, layers in ((MASKRCNN, 4), (DETR, 5)):
        cfg = cfg_for(name, cache)
        task = DetectionTask(cfg.task)
        m = build(cfg)
        condattn.apply_conditioning(m, "spectral", lam=2.0)
        flat = cheap_diagnostics(m, task.forward, batch)["flat"]
        assert all(f"entropy/l{i}" in flat and f"kappa_wq/l{i}" in flat for i in range(layers)), sorted(flat)
        assert "kappa_x/b0" in flat and np.isfinite(flat["entropy/mean"])
        m.train()
        loss, logs = task.loss(m, batch)
        loss.backward()
        grads = grad_diagnostics(m)
        assert all(f"gradnorm_wq/l{i}" in grads for i in range(layers))


# ---------------------------------------------------------------- training and evaluation


@pytest.mark.slow
def test_detectors_train_and_evaluate(cache, bundle):
    from types import SimpleNamespace

    from torch.utils.data import DataLoader

    from condattn.engine.optim import build_optimizer

    acc = SimpleNamespace(num_processes=1, is_main_process=True)
    val = DataLoader(bundle.val, batch_size=4, collate_fn=bundle.collate_fn)
    for name in (MASKRCNN, DETR):
        cfg = cfg_for(name, cache)
        task = DetectionTask(cfg.task)
        m = build(cfg)
        condattn.apply_conditioning(m, "spectral+embedded").check(attention_layers=cfg.model.attention_layers)
        opt, sched = build_optimizer(m, cfg, 4, 100)
        before = copy.deepcopy(m.state_dict())
        m.train()
        loader = DataLoader(bundle.train, batch_size=4, collate_fn=bundle.collate_fn, shuffle=False)
        torch.manual_seed(0)
        for _, batch in zip(range(3), loader):
            loss, logs = task.loss(m, batch)
            assert torch.isfinite(loss) and len(logs) >= 3
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        changed = [k for k, v in m.state_dict().items() if not torch.equal(v, before[k])]
        assert any(".blocks.0.attn.qkv" in k or "encoder.layers.0.self_attn.q_proj" in k for k in changed)
        out = task.evaluate(m, val, acc)
        keys = ["ap_box", "ap50_box", "ap75_box", "aps_box", "apm_box", "apl_box"]
        keys += [k.replace("box", "mask") for k in keys] if name == MASKRCNN else []
        assert sorted(out) == sorted([*keys, "n"]) and out["n"] == len(bundle.val)
        assert all(-1 <= out[k] <= 1 for k in keys) and m.training  # back in training mode


def test_detr_predictions_map_back_to_coco(cache, bundle):
    """DETR's outputs (normalised cx, cy, w, h of the resized, padded batch; class logits with "no object" last) come
    back in the original images' pixels and category ids: an oracle output built from the ground truth scores AP 1."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader
    from torchvision.ops import box_convert

    cfg = cfg_for(DETR, cache)
    task, model = DetectionTask(cfg.task), build(cfg)
    q = cfg.model.num_queries

    def oracle(_model, batch):
        logits = torch.full((len(batch["targets"]), q, 4), -10.0)
        boxes = torch.full((len(batch["targets"]), q, 4), 0.5)
        for i, t in enumerate(batch["targets"]):
            h, w = t["orig_size"].tolist()
            n = len(t["labels"])
            boxes[i, :n] = box_convert(t["boxes"], "xyxy", "cxcywh") / torch.tensor([w, h, w, h])
            logits[i, torch.arange(n), t["labels"] - 1] = 10.0
            logits[i, n:, -1] = 10.0  # the other queries: "no object"
        return SimpleNamespace(logits=logits, pred_boxes=boxes)

    task.forward = oracle
    acc = SimpleNamespace(num_processes=1, is_main_process=True)
    out = task.evaluate(model, DataLoader(bundle.val, batch_size=3, collate_fn=bundle.collate_fn), acc)
    assert out["ap_box"] == pytest.approx(1.0) and out["ap50_box"] == pytest.approx(1.0)


def test_coco_evaluation_equals_pycocotools_exactly(bundle):
    from pycocotools import mask as mask_util
    from pycocotools.cocoeval import COCOeval

    coco, ds = bundle.val.coco, bundle.val
    rng = np.random.default_rng(0)
    dets, direct = [], []
    for img_id in ds.ids:
        info = coco.loadImgs(img_id)[0]
        h, w = info["height"], info["width"]
        boxes, scores, labels, masks = [], [], [], []
        for a in coco.loadAnns(coco.getAnnIds(imgIds=img_id)):
            x, y, bw, bh = a["bbox"]
            jit = rng.normal(0, 2, 4)
            boxes.append([x + jit[0], y + jit[1], x + bw + jit[2], y + bh + jit[3]])
            scores.append(rng.uniform(0.05, 1))
            labels.append(ds.label_of[a["category_id"]] if rng.random() < 0.8 else int(rng.integers(1, 4)))
            masks.append(np.roll(coco.annToMask(a), int(rng.integers(-2, 3)), axis=1).astype(np.float32))
        for _ in range(2):  # false positives
            x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
            boxes.append([x0, y0, x0 + rng.uniform(5, w / 2), y0 + rng.uniform(5, h / 2)])
            scores.append(rng.uniform(0, 0.5))
            labels.append(int(rng.integers(1, 4)))
            mk = np.zeros((h, w), np.float32)
            mk[int(y0):int(y0) + 8, int(x0):int(x0) + 8] = 0.9
            masks.append(mk)
        det = {"boxes": torch.tensor(boxes, dtype=torch.float32), "scores": torch.tensor(scores, dtype=torch.float32),
               "labels": torch.tensor(labels), "masks": torch.from_numpy(np.stack(masks))[:, None]}
        dets += detections_to_coco(img_id, det, ds.cat_ids)
        for b, s, lab, mk in zip(det["boxes"].tolist(), det["scores"].tolist(), labels, masks):  # by hand
            rle = mask_util.encode(np.asfortranarray((mk > 0.5).astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            direct.append({"image_id": img_id, "category_id": ds.cat_ids[lab - 1], "score": s, "segmentation": rle,
                           "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]]})
    ours = coco_evaluate(coco, dets, ("bbox", "segm"))
    for iou_type, suffix in (("bbox", "box"), ("segm", "mask")):
        ev = COCOeval(coco, coco.loadRes(copy.deepcopy(direct)), iou_type)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
        got = [ours[f"{k}_{suffix}"] for k in ("ap", "ap50", "ap75", "aps", "apm", "apl")]
        assert got == [float(v) for v in ev.stats[:6]], (iou_type, got, ev.stats[:6])  # exactly
    assert 0.2 < ours["ap50_box"] < 1 and 0.2 < ours["ap50_mask"] < 1
    empty = coco_evaluate(coco, [], ("bbox",))
    assert empty["ap_box"] == 0.0


# ---------------------------------------------------------------- weights, optimizer, schedule


@pytest.mark.slow
def test_backbone_checkpoint_and_offline_pretrained(cache, tmp_path):
    import timm

    cfg = cfg_for(MASKRCNN, cache)
    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    clf = timm.create_model("xcit_nano_12_p16_224", num_classes=10, **mcfg["backbone_kwargs"])
    run = tmp_path / "run"
    run.mkdir()
    torch.save(clf.state_dict(), run / "best_model.pt")  # what a finished table-1 run leaves
    (run / "summary.json").write_text('{"status": "finished", "metrics": {}}')
    m = build_model({**mcfg, "backbone_checkpoint": str(run)})
    sd = m.backbone.xcit.state_dict()
    assert all(torch.equal(sd[k], clf.state_dict()[k]) for k in sd)

    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot read"):
        build_model({**mcfg, "backbone_checkpoint": str(tmp_path / "bad.pt")})
    with pytest.raises(FileNotFoundError, match="backbone_checkpoint: .*nope.pt.*no file or run dir"):
        build_model({**mcfg, "backbone_checkpoint": str(tmp_path / "nope.pt")})
    with pytest.raises(FileNotFoundError, match="has not finished"):
        build_model({**mcfg, "backbone_checkpoint": str(tmp_path / "run" / "..")})
    named = tmp_path / "runs" / "paper" / "table1_run"  # a run name, looked up under runs_root/<scale>/
    named.mkdir(parents=True)
    for f in ("best_model.pt", "summary.json"):
        (run / f).rename(named / f)
    m = build_model({**mcfg, "backbone_checkpoint": "table1_run", "runs_root": str(tmp_path / "runs")})
    assert all(torch.equal(v, clf.state_dict()[k]) for k, v in m.backbone.xcit.state_dict().items())
    wide = timm.create_model("xcit_nano_12_p16_224", num_classes=10, embed_dim=96, depth=4, num_heads=2)
    torch.save(wide.state_dict(), tmp_path / "wide.pt")
    with pytest.raises(ValueError, match="shape mismatches"):
        build_model({**mcfg, "backbone_checkpoint": str(tmp_path / "wide.pt")})

    t0 = time.time()
    for bad in ({**mcfg, "pretrained": True},
                {**OmegaConf.to_container(cfg_for(DETR, cache).model, resolve=True), "use_pretrained_backbone": True}):
        with pytest.raises(RuntimeError, match="not in the local Hugging Face cache"):
            build_model(bad)
    assert time.time() - t0 < 10  # fails fast, never waits on the network


def test_multistep_schedule_lr_groups_and_preflight(cache):
    from condattn.engine.optim import build_optimizer, multistep_factor
    from condattn.engine.preflight import preflight

    assert [multistep_factor(s, [4, 6], 0.1, 2, 0.001) for s in (0, 1, 2, 3, 4, 5, 6, 9)] == pytest.approx(
        [0.001, 0.5005, 1, 1, 0.1, 0.1, 0.01, 0.01])
    cfg = cfg_for(DETR, cache)
    m = build(cfg)
    opt, sched = build_optimizer(m, cfg, 4, 100)
    lrs = sorted({g["lr"] for g in opt.param_groups})
    assert lrs == pytest.approx([2e-5, 2e-4])  # backbone × 0.1 (the smoke lr is 2e-4)
    backbone = {id(p) for n, p in m.named_parameters() if "backbone" in n and p.requires_grad}
    assert {id(p) for g in opt.param_groups if g["lr"] < 1e-4 for p in g["params"]} == backbone
    assert not any(p.requires_grad for n, p in m.named_parameters() if "backbone.model.layer1" in n)  # frozen (DETR)
    for _ in range(80):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(2e-5)  # ×0.1 at the milestone (step 80)
    bad = cfg_for(DETR, cache, "optim.milestones=[500]")
    assert any("optim.milestones" in p.message for p in preflight(bad, 1, check_run_dir=False))


# ---------------------------------------------------------------- table


def test_detection_table_renders_papers_numbers(tmp_path):
    import yaml
    from helpers import plan_of

    from condattn.reporting.detection import write_table

    exp = yaml.safe_load((Path(__file__).resolve().parent.parent / "experiments" / "table2_coco.yaml").read_text())
    d = tmp_path / "runs" / "smoke" / "table2_coco_xcit_small_12_p16_spectral_smoke_s0"
    d.mkdir(parents=True)
    metrics = {"final_val_ap_box": 0.1234, "final_val_ap50_box": 0.3, "final_val_ap_mask": 0.1,
               "final_val_ap50_mask": 0.2}
    (d / "summary.json").write_text(json.dumps({"status": "finished", "metrics": metrics, "steps": 30,
                                                "wall_time_s": 12.0, "run_dir": str(d), "data": {"stand_in": True}}))
    path, md = write_table(plan_of(exp, "smoke", tmp_path / "runs", tmp_path / "results", [0]))
    row = next(line for line in md.splitlines() if "| xcit_small_12_p16 | SCA |" in line)
    assert "12.34, n = 1 (no spread)" in row and "SCA paper 45.6" in row and "CET paper" not in row
    base = next(line for line in md.splitlines() if "| xcit_small_12_p16 | baseline |" in line)
    assert "missing" in base and "CET paper 44.9 · SCA paper 44.9" in base
    assert "offline stand-in" in md and path.with_suffix(".csv").exists()
    written = path.read_text()  # the scale's note (why detection has no small scale) is printed once
    assert written.count("Note (smoke)") == 1 and "No small scale" in written


# ---------------------------------------------------------------- end to end


def tiny_run(tmp_path, cache, task: str, method: str) -> list[str]:
    return [f"task={task}", "scale=smoke", f"conditioning={method}", f"paths.cache={cache}",
            f"paths.runs={tmp_path / 'runs'}", "logger=none", "task.steps=4", "task.eval_every=2", "task.log_every=2",
            "optim.milestones=[3]", "data.generate.train=8", "data.generate.val=4", "diagnostics.batch_size=2"]


def check_summary(s: dict, attention_layers: int, masks: bool) -> None:
    assert s["status"] == "finished" and s["steps"] == 4 and s["data"]["stand_in"]
    keys = ["final_val_ap_box", "final_val_ap50_box", *(["final_val_ap_mask", "final_val_ap50_mask"] if masks else [])]
    assert all(-1 <= s["metrics"][k] <= 1 for k in keys) and "val_ap_box" in s["metrics"]
    assert ("final_val_ap_mask" in s["metrics"]) == masks
    assert sum(v for k, v in s["patch"]["counts"].items() if k.startswith("spectral")) == attention_layers
    d0 = s["diagnostics"]["step0"]
    assert "entropy/l0" in d0 and "kappa_x/b0" in d0 and "gradnorm_wq/l0" in d0
    assert d0["kappa_x/b0"] <= 2.05  # CET at the first block's input (Newton–Schulz bound)


@pytest.mark.slow
def test_maskrcnn_cli_end_to_end(tmp_path, cache):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "condattn.train", *tiny_run(tmp_path, cache, MASKRCNN, "spectral+embedded")]
    out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    (summary,) = (tmp_path / "runs" / "smoke").glob("*/summary.json")
    check_summary(json.loads(summary.read_text()), 4, masks=True)


@pytest.mark.slow
def test_detr_trainer_end_to_end(tmp_path, cache):
    from condattn.engine.trainer import train

    s = train(compose(tiny_run(tmp_path, cache, DETR, "spectral+embedded")))
    check_summary(s, 5, masks=False)
    rows = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "val"] == [2, 4]


def test_mask_evaluation_leaves_the_ground_truth_as_released():
    """Real COCO stores polygons (also multi-part) and uncompressed crowd RLE; pycocotools' mask evaluation rewrites
    them in place as compressed RLE, which the dataset can no longer decode for its next epoch. Every evaluation
    works on a private copy: the ground truth is unchanged, and a second and third evaluation score the same."""
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    h, w = 40, 50
    crowd = np.zeros((h, w), dtype=np.uint8, order="F")
    crowd[25:35, 5:20] = 1
    flat = crowd.flatten(order="F")  # uncompressed RLE: run lengths over the column-major mask, starting with 0s
    counts, value, run = [], 0, 0
    for px in flat:
        if px == value:
            run += 1
        else:
            counts.append(run)
            value, run = px, 1
    counts.append(run)
    dataset = {
        "images": [{"id": 7, "width": w, "height": h, "file_name": "a.jpg"}],
        "categories": [{"id": 3, "name": "a"}, {"id": 9, "name": "b"}],  # a gap in the ids, as COCO's
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 3, "iscrowd": 0, "area": 100.0, "bbox": [10, 5, 10, 10],
             "segmentation": [[10, 5, 20, 5, 20, 15, 10, 15]]},
            {"id": 2, "image_id": 7, "category_id": 9, "iscrowd": 0, "area": 50.0, "bbox": [30, 2, 15, 15],
             "segmentation": [[30, 2, 35, 2, 35, 7, 30, 7], [40, 12, 45, 12, 45, 17, 40, 17]]},
            {"id": 3, "image_id": 7, "category_id": 3, "iscrowd": 1, "area": 150.0, "bbox": [5, 25, 15, 10],
             "segmentation": {"size": [h, w], "counts": [int(c) for c in counts]}},
        ],
    }
    released = copy.deepcopy(dataset)
    coco = COCO()
    coco.dataset = dataset
    coco.createIndex()
    results = []
    for ann in released["annotations"][:2]:  # the non-crowd ground truth as predictions: AP 1
        rle = mask_utils.merge(mask_utils.frPyObjects(ann["segmentation"], h, w))
        rle["counts"] = rle["counts"].decode()
        results.append({"image_id": 7, "category_id": ann["category_id"], "bbox": ann["bbox"], "score": 0.9,
                        "segmentation": rle})
    scores = [coco_evaluate(coco, results, ("bbox", "segm")) for _ in range(3)]
    assert coco.dataset == released
    assert scores[0] == scores[1] == scores[2]
    assert scores[0]["ap_box"] == pytest.approx(1.0) and scores[0]["ap_mask"] == pytest.approx(1.0)
