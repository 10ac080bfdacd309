"""COCO instance detection (tables 2 and 7): Mask R-CNN (torchvision) and DETR (transformers) losses, and COCO AP
through pycocotools.

Batches come from condattn/data/coco.py: {"images": [float (3, H, W) in [0, 1]], "targets": [{boxes XYXY, labels
1..K, masks, image_id, orig_size}]}. The detector is recognised by its type:
- torchvision `GeneralizedRCNN` (Mask R-CNN): the model normalises, resizes at evaluation and pads to 32 itself; its
  training forward returns the loss dict (RPN objectness / box, RoI class / box / mask), summed as the loss.
- transformers `DetrForObjectDetection`: the task does what DETR's own data pipeline does: at evaluation the short side
  is resized to `task.augment.eval_size` (long ≤ `eval_max_size`); images are normalised (ImageNet mean / std), padded
  with zeros to the largest in the batch with a `pixel_mask`; labels become 0..K-1 and boxes normalised (cx, cy, w,
  h). The loss is DETR's Hungarian loss (transformers: class 1, L1 5, GIoU 2, no-object 0.1, auxiliary decoder
  losses when the config asks).

Evaluation: every image's detections in its original coordinates (Mask R-CNN: torchvision's postprocess; DETR: the
normalised boxes × the original size; all 100 queries ranked by their best non-"no object" probability, as DETR
evaluates) become COCO results (boxes as [x, y, w, h], masks binarised at 0.5 and RLE-encoded), are gathered across
processes (`gather_object`; images repeated by uneven sharding counted once) and scored on rank 0 by pycocotools'
COCOeval over every image of the split (`coco_evaluate`), the result broadcast to every rank. Keys: ap, ap50, ap75,
aps, apm, apl with suffix _box (bbox) and, for Mask R-CNN, _mask (segm), as fractions (the table shows × 100);
pycocotools' -1 (no ground truth in that size range) is kept. The selection metric is ap_box, higher is better.
"""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

import numpy as np
import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn

from .base import Task, evaluation_mode

STATS = ("ap", "ap50", "ap75", "aps", "apm", "apl")  # COCOeval.stats[0:6]
IOU_SUFFIX = {"bbox": "box", "segm": "mask"}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def private_copy(coco_gt):
    """A pycocotools COCO object over a deep copy of `coco_gt`'s dataset (images, annotations, categories)."""
    from pycocotools.coco import COCO

    gt = COCO()
    gt.dataset = copy.deepcopy(coco_gt.dataset)
    gt.createIndex()
    return gt


def coco_evaluate(coco_gt, results: list[dict], iou_types: tuple[str, ...] = ("bbox", "segm"),
                  img_ids: list[int] | None = None) -> dict[str, float]:
    """pycocotools' COCOeval (evaluate, accumulate, summarize) of `results` (COCO result dicts: image_id, category_id,
    score, bbox [x, y, w, h], and segmentation RLE for segm) against `coco_gt`, over `img_ids` (default: every image
    of coco_gt). Returns {ap_box, ap50_box, ..., apl_mask}. Without any result the scores are those of an empty
    detection set (0, or -1 where the split has no ground truth), computed by COCOeval as well."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    out: dict[str, float] = {}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and the summary table
        # COCOeval's mask evaluation rewrites the ground truth's segmentations in place (polygons and uncompressed
        # crowd RLE become compressed RLE with bytes counts), and the dataset reads those same annotations for its
        # next epoch: evaluate against a private copy
        coco_gt = private_copy(coco_gt)
        if results:
            coco_dt = coco_gt.loadRes(copy.deepcopy(results))  # loadRes adds keys (area, id) to the dicts it gets
        else:
            coco_dt = COCO()
            coco_dt.dataset = {"images": list(coco_gt.dataset["images"]), "annotations": [],
                               "categories": copy.deepcopy(coco_gt.dataset["categories"])}
            coco_dt.createIndex()
        for iou_type in iou_types:
            ev = COCOeval(coco_gt, coco_dt, iou_type)
            if img_ids is not None:
                ev.params.imgIds = sorted(int(i) for i in img_ids)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            for name, v in zip(STATS, ev.stats[: len(STATS)]):
                out[f"{name}_{IOU_SUFFIX[iou_type]}"] = float(v)
    return out


def detections_to_coco(image_id: int, det: dict[str, torch.Tensor], cat_ids: list[int]) -> list[dict]:
    """One image's detections {boxes (N, 4) XYXY in original pixels, scores (N,), labels (N,) 1..K, optional masks
    (N, 1, H, W) probabilities or (N, H, W)} as COCO result dicts (segmentation: RLE of mask > 0.5)."""
    boxes = det["boxes"].detach().float().cpu()
    if boxes.numel() == 0:
        return []
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
    scores = det["scores"].detach().float().cpu().tolist()
    labels = det["labels"].detach().cpu().tolist()
    res = [{"image_id": int(image_id), "category_id": int(cat_ids[int(lab) - 1]), "bbox": [float(v) for v in b],
            "score": float(s)} for b, s, lab in zip(xywh, scores, labels)]
    if det.get("masks") is not None:
        from pycocotools import mask as mask_util

        m = det["masks"].detach().cpu()
        if m.dim() == 4:
            m = m[:, 0]
        binary = np.asfortranarray((m > 0.5).numpy().transpose(1, 2, 0).astype(np.uint8))
        for r, rle in zip(res, mask_util.encode(binary)):
            r["segmentation"] = {"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")}
    return res


def detector_kind(model: nn.Module) -> str:
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN

    m = extract_model_from_parallel(model)  # DDP / torch.compile wrappers
    if isinstance(m, GeneralizedRCNN):
        return "rcnn"
    from transformers import DetrForObjectDetection

    if isinstance(m, DetrForObjectDetection):
        return "detr"
    raise TypeError(f"task.kind=detection runs torchvision's GeneralizedRCNN (Mask R-CNN) or transformers' "
                    f"DetrForObjectDetection; got {type(m).__name__} (model={type(m).__module__})")


class DetectionTask(Task):
    higher_is_better = True
    metric = "ap_box"

    def __init__(self, cfg: Any):
        self.cfg = cfg
        aug = cfg.get("augment") if hasattr(cfg, "get") else getattr(cfg, "augment", None)
        self.eval_size = int(aug["eval_size"]) if aug is not None else 800
        self.eval_max_size = int(aug["eval_max_size"]) if aug is not None else 1333

    # ------------------------------------------------------------ DETR's input pipeline
    def detr_inputs(self, images: list[torch.Tensor], targets: list[dict] | None = None,
                    resize: bool = False) -> dict[str, Any]:
        """pixel_values (B, 3, H, W) normalised and zero-padded to the batch's largest image, pixel_mask (B, H, W)
        (1 = image), and DETR labels (class 0..K-1, boxes cx, cy, w, h / image size) when `targets` are given."""
        from torchvision.ops import box_convert
        from torchvision.transforms.v2 import functional as F

        if resize:
            images = [F.resize(im, [self.eval_size], max_size=self.eval_max_size, antialias=True) for im in images]
        h = max(im.shape[-2] for im in images)
        w = max(im.shape[-1] for im in images)
        x = images[0].new_zeros(len(images), 3, h, w)
        mask = torch.zeros(len(images), h, w, dtype=torch.long, device=x.device)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device, dtype=x.dtype)[:, None, None]
        std = torch.tensor(IMAGENET_STD, device=x.device, dtype=x.dtype)[:, None, None]
        for i, im in enumerate(images):
            x[i, :, : im.shape[-2], : im.shape[-1]] = (im - mean) / std
            mask[i, : im.shape[-2], : im.shape[-1]] = 1
        out: dict[str, Any] = {"pixel_values": x, "pixel_mask": mask}
        if targets is not None:
            labels = []
            for im, t in zip(images, targets):
                ih, iw = im.shape[-2:]
                scale = torch.tensor([iw, ih, iw, ih], dtype=torch.float32, device=x.device)
                boxes = box_convert(t["boxes"].float(), "xyxy", "cxcywh") / scale
                labels.append({"class_labels": t["labels"] - 1, "boxes": boxes})
            out["labels"] = labels
        return out

    # ------------------------------------------------------------ the task interface
    def forward(self, model: nn.Module, batch: dict[str, Any]):
        """The inference forward as the evaluation runs it (the diagnostics probes run it once, in eval mode)."""
        if detector_kind(model) == "rcnn":
            return model(batch["images"])
        return model(**self.detr_inputs(batch["images"], resize=True))

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        if detector_kind(model) == "rcnn":
            keys = ("boxes", "labels", "masks")
            targets = [{k: t[k] for k in keys if k in t} for t in batch["targets"]]
            if extract_model_from_parallel(model).roi_heads.has_mask() and any("masks" not in t for t in targets):
                raise ValueError("Mask R-CNN needs instance masks: set data.masks=true")
            losses = model(batch["images"], targets)
            loss = sum(losses.values())
            return loss, {k: v.detach() for k, v in losses.items()}
        out = model(**self.detr_inputs(batch["images"], batch["targets"]))
        return out.loss, {k: v.detach() for k, v in (out.loss_dict or {}).items() if torch.is_tensor(v)}

    @torch.no_grad()
    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
        """Per image {boxes XYXY (original pixels), scores, labels 1..K[, masks (N, 1, H, W)]}."""
        if detector_kind(model) == "rcnn":
            return model(batch["images"])
        from torchvision.ops import box_convert

        out = self.forward(model, batch)
        prob = out.logits.float().softmax(-1)[..., :-1]  # the last class is DETR's "no object"
        scores, labels = prob.max(-1)
        preds = []
        for i, t in enumerate(batch["targets"]):
            h, w = (float(v) for v in t["orig_size"])
            scale = torch.tensor([w, h, w, h], device=scores.device)
            boxes = box_convert(out.pred_boxes[i].float(), "cxcywh", "xyxy") * scale
            preds.append({"boxes": boxes, "scores": scores[i], "labels": labels[i] + 1})
        return preds

    def evaluate(self, model: nn.Module, loader, accelerator) -> dict[str, float]:
        """COCO results of every image (not per-sample tensors: gathered as objects), scored once on rank 0."""
        from accelerate.utils import broadcast_object_list, gather_object

        ds = loader.dataset
        kind = detector_kind(model)
        masks = kind == "rcnn" and extract_model_from_parallel(model).roi_heads.has_mask()
        iou_types = ("bbox", "segm") if masks else ("bbox",)
        local: list[tuple[int, list[dict]]] = []
        with evaluation_mode(model):
            for batch in loader:
                for t, det in zip(batch["targets"], self.predict(model, batch)):
                    if kind == "rcnn" and "segm" not in iou_types:
                        det = {k: v for k, v in det.items() if k != "masks"}
                    local.append((int(t["image_id"]), detections_to_coco(int(t["image_id"]), det, ds.cat_ids)))
        everything = gather_object(local) if accelerator.num_processes > 1 else local
        metrics: dict[str, float] = {}
        if accelerator.is_main_process:
            seen: set[int] = set()
            results: list[dict] = []
            for image_id, res in everything:
                if image_id not in seen:  # padding of the last batch repeats images on some ranks
                    seen.add(image_id)
                    results += res
            metrics = coco_evaluate(ds.coco, results, iou_types, ds.ids)
            metrics["n"] = len(seen)
        if accelerator.num_processes > 1:
            metrics = broadcast_object_list([metrics])[0]
        return metrics
