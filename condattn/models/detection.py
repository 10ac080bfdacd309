"""Detectors for tables 2 and 7: torchvision Mask R-CNN over an XCiT backbone (XCiT's detection recipe) and
transformers DETR with a timm ResNet backbone. Random init unless weights are asked for; nothing downloads.

Mask R-CNN + XCiT (facebookresearch/xcit, detection/backbone/xcit.py and configs/xcit/mask_rcnn_xcit_*_3x_coco.py):
- backbone: timm's `Xcit` (conv patch embedding, Fourier positions computed for any Hp × Wp, XCA blocks) pruned with
  timm's own `prune_intermediate_layers`: the class-attention blocks, class token, final norm and head are dropped
  (detection never uses them; the PatchReport then counts exactly `depth` XCA layers). Features after blocks
  `out_indices` (XCiT: [3, 5, 7, 11] for 12 layers; its M24/16 config uses [7, 11, 15, 23]) come out of timm's
  `forward_intermediates` as (B, C, Hp, Wp) maps and are brought to strides 4/8/16/32 by XCiT's adapter (patch 16:
  ConvTranspose2d-BN-GELU-ConvTranspose2d / ConvTranspose2d / identity / max-pool 2; patch 8: ConvTranspose2d /
  identity / max-pool 2 / max-pool 4). XCiT used SyncBatchNorm there and in the patch embedding / LPI: with
  `sync_bn: auto` the BatchNorms become SyncBatchNorm when training on several CUDA processes.
- neck and heads: torchvision's `FeaturePyramidNetwork` (256 channels, an extra max-pooled level: 5 levels, as
  mmdetection's FPN num_outs=5) and `MaskRCNN` with its default RPN (anchors 32–512, ratios 0.5/1/2), RoIAlign 7 / 14
  box / mask heads (TwoMLPHead 1024, 4 × 256 mask convs), test-time score 0.05, NMS 0.5, 100 detections: the values
  of XCiT's mmdetection config. Differences we keep from torchvision: smooth-L1 (β = 1/9) box losses where
  mmdetection uses L1, RoIAlign sampling ratio 2 where it uses 0 (adaptive).
- `min_size` / `max_size` are the evaluation resize (800 / 1333); training images come already augmented from the
  data (condattn/data/coco.py), so the model's GeneralizedRCNNTransform only normalises and pads them to a multiple
  of 32 (`_skip_resize`).
- weights: `backbone_checkpoint` = a table-1 run (its directory or run name: its final weights, as
  condattn.models.pretrained reads them), a best_model.pt, or a timm / official XCiT state dict; `pretrained: true` =
  timm's ImageNet weights from the local Hugging Face cache only.

DETR (transformers `DetrForObjectDetection`, `use_timm_backbone=True`): the timm backbone's BatchNorms frozen
(transformers) and its stem + layer1 not trained (here; DETR's `train_backbone` rule), sine positions, auxiliary
decoding losses.
`use_pretrained_backbone: true` loads timm's ImageNet weights of the backbone from the local Hugging Face cache
(transformers 5 builds the timm backbone without weights in any case).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

XCIT_DROP_KEYS = ("head.", "cls_attn_blocks.", "cls_token", "norm.", "fc_norm.", "head_drop.")


def cached_timm_weights(model_name: str) -> str:
    """Path of timm's pretrained weights of `model_name` in the local Hugging Face cache, or RuntimeError saying how
    to provide them. Never touches the network, so an offline machine fails at once instead of hanging."""
    from huggingface_hub import try_to_load_from_cache
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(model_name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if hub_id:
        for fname in ("model.safetensors", "pytorch_model.bin"):
            path = try_to_load_from_cache(hub_id, fname)
            if isinstance(path, str):
                return path
    where = f"the Hugging Face hub repo {hub_id!r}" if hub_id else "no known hub repo"
    raise RuntimeError(
        f"pretrained weights for timm model {model_name!r} ({where}) are not in the local Hugging Face cache, and "
        "nothing is downloaded here. On a machine with access run `python -c \"import timm; timm.create_model("
        f"'{model_name}', pretrained=True)\"` and copy the cache (HF_HOME), or give a local state dict instead "
        "(model.backbone_checkpoint=PATH for Mask R-CNN); or train from random init (pretrained=false)."
    )


# ---------------------------------------------------------------- Mask R-CNN + XCiT


# torchvision's ImageNet ResNet-50 (IMAGENET1K_V1, what `resnet50(pretrained=True)` gave DETR), as torch.hub caches it
TORCHVISION_RESNET50 = "resnet50-0676ba61.pth"


def torchvision_backbone_weights(spec: str) -> str:
    """Path of a torchvision ImageNet ResNet-50 state dict: `spec` a file, or `torchvision` = torch.hub's cache
    (<torch.hub.get_dir()>/checkpoints/resnet50-0676ba61.pth). FileNotFoundError saying how to supply it; never
    downloads."""
    if spec != "torchvision":
        if not Path(spec).is_file():
            raise FileNotFoundError(f"model.backbone_weights={spec}: no such file (a torchvision ResNet-50 state dict)")
        return spec
    path = Path(torch.hub.get_dir()) / "checkpoints" / TORCHVISION_RESNET50
    if not path.is_file():
        raise FileNotFoundError(
            f"model.backbone_weights=torchvision: {path} is missing (offline: nothing is downloaded). Copy "
            f"torchvision's ImageNet ResNet-50 weights ({TORCHVISION_RESNET50}, ResNet50_Weights.IMAGENET1K_V1) "
            "there, or pass model.backbone_weights=<file>, or model.backbone_weights=null for random init.")
    return str(path)


def _read_state_dict(path: str | Path, what: str, runs_root: str | Path = "runs") -> dict[str, torch.Tensor]:
    """A state dict from a weights file, or a run's final weights (a run dir or a run name under runs_root/*/:
    condattn.models.pretrained.load_state); errors name `what`."""
    from .pretrained import load_state

    try:
        return load_state(str(path), runs_root)[0]
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{what}: {e}") from e
    except ValueError as e:
        raise RuntimeError(f"{what}: {e}") from e


def load_xcit_backbone(xcit: nn.Module, path: str | Path, depth: int, runs_root: str | Path = "runs") -> None:
    """Load a classification XCiT's weights into the pruned detection backbone `xcit` (built with `depth` blocks).
    Dropped: classifier head, class-attention blocks, class token, final norm, and blocks after the last feature index
    (unused here). Everything else must match name for name and shape for shape."""
    what = "model.backbone_checkpoint"
    sd = _read_state_dict(path, what, runs_root)
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        for prefix in ("module.", "_orig_mod.", "backbone.xcit."):  # DDP / compile wrappers; our detection runs
            if k.startswith(prefix):
                k = k[len(prefix):]
        k = k.replace("pos_embeder.", "pos_embed.")  # the official XCiT name (timm renames it the same way)
        if k.startswith(XCIT_DROP_KEYS):
            continue
        if k.startswith("blocks."):
            i = int(k.split(".")[1])
            if len(xcit.blocks) <= i < depth:
                continue
        out[k] = v
    target = xcit.state_dict()
    missing = sorted(set(target) - set(out))
    extra = sorted(set(out) - set(target))
    shapes = [f"{k}: checkpoint {tuple(out[k].shape)} vs model {tuple(target[k].shape)}"
              for k in sorted(set(out) & set(target)) if out[k].shape != target[k].shape]
    if missing or extra or shapes:
        parts = []
        if shapes:
            parts.append(f"{len(shapes)} shape mismatches ({'; '.join(shapes[:3])})")
        if missing:
            parts.append(f"{len(missing)} missing keys ({', '.join(missing[:4])})")
        if extra:
            parts.append(f"{len(extra)} unexpected keys ({', '.join(extra[:4])})")
        raise ValueError(f"{what}={path} does not fit the backbone (embed_dim {xcit.embed_dim}, depth {depth}, patch "
                         f"{xcit.patch_embed.patch_size}): " + "; ".join(parts) + ". Is it a checkpoint of the same "
                         "XCiT variant (model.backbone / model.backbone_kwargs)?")
    xcit.load_state_dict(out, strict=True)


class XcitFPNBackbone(nn.Module):
    """torchvision detection backbone: XCiT features at 4 depths -> strides 4/8/16/32 (XCiT's adapters) -> FPN.
    forward(images (B, 3, H, W)) -> OrderedDict of 5 maps ("0".."3", "pool"), `out_channels` each."""

    def __init__(self, xcit: nn.Module, out_indices: list[int], fpn_channels: int = 256):
        super().__init__()
        from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork, LastLevelMaxPool

        if len(out_indices) != 4:
            raise ValueError(f"model.out_indices={out_indices}: XCiT's detection adapter takes 4 block indices")
        self.xcit = xcit
        self.out_indices = [int(i) for i in out_indices]
        c, p = xcit.embed_dim, xcit.patch_embed.patch_size
        if p == 16:
            adapters = [
                nn.Sequential(nn.ConvTranspose2d(c, c, 2, 2), nn.BatchNorm2d(c), nn.GELU(),
                              nn.ConvTranspose2d(c, c, 2, 2)),
                nn.Sequential(nn.ConvTranspose2d(c, c, 2, 2)),
                nn.Identity(),
                nn.MaxPool2d(2, 2),
            ]
        elif p == 8:
            adapters = [nn.Sequential(nn.ConvTranspose2d(c, c, 2, 2)), nn.Identity(), nn.MaxPool2d(2, 2),
                        nn.MaxPool2d(4, 4)]
        else:
            raise ValueError(f"XCiT patch size {p}: the detection adapter exists for 8 and 16")
        self.adapters = nn.ModuleList(adapters)
        self.fpn = FeaturePyramidNetwork([c] * 4, int(fpn_channels), extra_blocks=LastLevelMaxPool())
        self.out_channels = int(fpn_channels)

    def forward(self, x: torch.Tensor) -> OrderedDict:
        feats = self.xcit.forward_intermediates(x, indices=self.out_indices, intermediates_only=True, stop_early=True)
        return self.fpn(OrderedDict((str(i), a(f)) for i, (a, f) in enumerate(zip(self.adapters, feats))))


def _want_sync_bn(sync_bn: str | bool) -> bool:
    if sync_bn == "auto":
        dist = torch.distributed
        return (torch.cuda.is_available() and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)
    if not isinstance(sync_bn, bool):
        raise ValueError(f"model.sync_bn={sync_bn!r}: choose auto, true or false")
    return sync_bn


def build_maskrcnn_xcit(
    *,
    backbone: str,
    num_classes: int,
    out_indices: list[int],
    backbone_kwargs: dict | None = None,
    drop_path_rate: float = 0.0,
    fused_attn: int | None = 1,
    pretrained: bool = False,
    backbone_checkpoint: str | None = None,
    runs_root: str = "runs",
    fpn_channels: int = 256,
    anchor_sizes: list[int] | tuple[int, ...] | None = None,
    box_head_dim: int = 1024,
    mask_head_dims: list[int] | tuple[int, ...] = (256, 256, 256, 256),
    min_size: int = 800,
    max_size: int = 1333,
    image_mean: list[float] | tuple[float, ...] = (0.485, 0.456, 0.406),
    image_std: list[float] | tuple[float, ...] = (0.229, 0.224, 0.225),
    sync_bn: str | bool = "auto",
    rcnn: dict | None = None,
) -> nn.Module:
    """torchvision `MaskRCNN` over `XcitFPNBackbone` (module docstring). `num_classes` object classes (+ background);
    `backbone_kwargs` override the timm entrypoint's architecture (embed_dim, depth, num_heads, patch_size: the reduced
    smoke/small members); `anchor_sizes` one anchor size per FPN level (5; None: torchvision's 32..512), ratios
    0.5/1/2; `rcnn` extra MaskRCNN keyword arguments (rpn_* / box_* sampling and test settings)."""
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor

    from .timm_models import create_timm

    if pretrained and backbone_checkpoint:
        raise ValueError("model.pretrained=true and model.backbone_checkpoint are both set; choose one source of "
                         "backbone weights")
    kw = dict(backbone_kwargs or {})
    kw.update(num_classes=0, drop_path_rate=float(drop_path_rate))
    if pretrained:
        kw["pretrained_cfg_overlay"] = {"file": cached_timm_weights(backbone)}
    xcit = create_timm(backbone, pretrained=bool(pretrained), fused_attn=fused_attn, **kw)
    depth = len(xcit.blocks)
    bad = [i for i in out_indices if not 0 <= int(i) < depth]
    if bad or list(out_indices) != sorted(set(int(i) for i in out_indices)):
        raise ValueError(f"model.out_indices={list(out_indices)}: give 4 increasing block indices in [0, {depth - 1}]")
    xcit.prune_intermediate_layers([int(i) for i in out_indices], prune_norm=True, prune_head=True)
    on_meta = any(p.is_meta for p in xcit.parameters())  # preflight's shape probe: no weights to load
    if backbone_checkpoint and not on_meta:
        load_xcit_backbone(xcit, backbone_checkpoint, depth, runs_root)
    body = XcitFPNBackbone(xcit, list(out_indices), fpn_channels)
    mask_dims = [int(c) for c in mask_head_dims]
    anchors = None
    if anchor_sizes is not None:
        from torchvision.models.detection.anchor_utils import AnchorGenerator

        if len(anchor_sizes) != 5:
            raise ValueError(f"model.anchor_sizes={list(anchor_sizes)}: give 5 sizes, one per FPN level (4 + pool)")
        anchors = AnchorGenerator(tuple((int(a),) for a in anchor_sizes), ((0.5, 1.0, 2.0),) * 5)
    model = MaskRCNN(
        body,
        num_classes=None,
        min_size=int(min_size),
        max_size=int(max_size),
        image_mean=list(image_mean),
        image_std=list(image_std),
        box_head=TwoMLPHead(body.out_channels * 7 * 7, int(box_head_dim)),
        box_predictor=FastRCNNPredictor(int(box_head_dim), int(num_classes) + 1),
        mask_head=MaskRCNNHeads(body.out_channels, mask_dims, 1),
        mask_predictor=MaskRCNNPredictor(mask_dims[-1], mask_dims[-1], int(num_classes) + 1),
        rpn_anchor_generator=anchors,
        _skip_resize=True,  # training images arrive augmented and resized by the data pipeline
        **(rcnn or {}),
    )
    if _want_sync_bn(sync_bn):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


# ---------------------------------------------------------------- DETR


def build_detr(
    *,
    num_classes: int,
    backbone: str = "resnet50",
    use_pretrained_backbone: bool = False,
    backbone_weights: str | None = None,
    d_model: int = 256,
    encoder_layers: int = 6,
    decoder_layers: int = 6,
    encoder_attention_heads: int = 8,
    decoder_attention_heads: int = 8,
    encoder_ffn_dim: int = 2048,
    decoder_ffn_dim: int = 2048,
    num_queries: int = 100,
    dropout: float = 0.1,
    auxiliary_loss: bool = True,
    attn_implementation: str = "sdpa",
    config: dict | None = None,
) -> nn.Module:
    """transformers `DetrForObjectDetection` with a timm backbone, random init; `num_classes` object classes (labels
    0..K-1, DETR adds the "no object" class). `config` extra DetrConfig keys (loss coefficients, costs, ...).
    `backbone_weights`: a torchvision ResNet state dict (a file, or `torchvision` = torch.hub's cache) loaded into the
    timm ResNet (the same parameter names), as DETR starts from torchvision's ImageNet ResNet-50."""
    import timm
    from transformers import DetrConfig, DetrForObjectDetection

    if backbone not in timm.list_models():
        raise ValueError(f"model.backbone={backbone!r} is not a timm model; see timm.list_models()")
    cfg = DetrConfig(
        use_timm_backbone=True, backbone=backbone, num_labels=int(num_classes), d_model=int(d_model),
        encoder_layers=int(encoder_layers), decoder_layers=int(decoder_layers),
        encoder_attention_heads=int(encoder_attention_heads), decoder_attention_heads=int(decoder_attention_heads),
        encoder_ffn_dim=int(encoder_ffn_dim), decoder_ffn_dim=int(decoder_ffn_dim), num_queries=int(num_queries),
        dropout=float(dropout), auxiliary_loss=bool(auxiliary_loss), **(config or {}),
    )
    cfg._attn_implementation = attn_implementation
    if use_pretrained_backbone and backbone_weights:
        raise ValueError("model.use_pretrained_backbone (timm's weights) and model.backbone_weights (torchvision's) "
                         "both set: choose one")
    weights = cached_timm_weights(backbone) if use_pretrained_backbone else None  # fail before building
    if backbone_weights:
        weights = torchvision_backbone_weights(str(backbone_weights))
    model = DetrForObjectDetection(cfg)
    features = model.model.backbone.model
    if weights is not None and not any(p.is_meta for p in model.parameters()):
        _load_timm_backbone(features, weights, backbone)
    names = [n for n, _ in features.named_parameters()]
    if any(n.startswith("layer4.") for n in names):  # a ResNet: DETR trains layer2-4 only (stem and layer1 frozen);
        for n, prm in features.named_parameters():  # transformers does this for its own ResNet config, not for timm's
            if not n.startswith(("layer2.", "layer3.", "layer4.")):
                prm.requires_grad_(False)
    return model


def _load_timm_backbone(features: nn.Module, path: str, name: str) -> None:
    """timm ImageNet weights into DETR's features-only backbone (its BatchNorms are frozen copies with the same
    buffer names); the classifier is dropped, every backbone tensor must be there."""
    sd = _read_state_dict(path, f"pretrained weights of {name}")
    target = features.state_dict()
    missing = sorted(set(target) - set(sd))
    shapes = [k for k in target if k in sd and sd[k].shape != target[k].shape]
    if missing or shapes:
        raise ValueError(f"timm weights {path} do not fit DETR's {name} backbone: missing {missing[:4]}, shape "
                         f"mismatches {shapes[:4]}")
    features.load_state_dict({k: sd[k] for k in target}, strict=True)
