"""torchvision Faster R-CNN on a zoo ResNet, in the two layouts of the transfer protocols.

* ``c4`` (MoCo's VOC/COCO R50-C4): the backbone runs the stem and ``layer1..layer3`` (stride 16);
  the RPN sits on that map; RoIAlign pools 14x14 boxes, which go through ``layer4`` (res5, stride
  2) and then one extra BatchNorm: detectron2's ``Res5ROIHeadsExtraNorm`` from MoCo's
  ``train_net.py``, which adds a norm after the last res5 block because a self-supervised
  backbone's features are scaled differently from a supervised one's. Its anchors (one level,
  sizes 32..512, ratios 0.5/1/2) and proposal counts (12000/2000 train, 6000/1000 test) follow
  detectron2's Base-RCNN-C4.
* ``fpn`` (JCL/EqCo's COCO R50-FPN): ``layer1..layer4`` feed an FPN (optionally with BatchNorm,
  the protocol's "SyncBN in the FPN"; it becomes SyncBN under DDP), torchvision's standard heads.

Backbone normalisation: ``norm="bn"`` keeps BatchNorm trainable with batch statistics (the
protocol's SyncBN; convert with ``nn.SyncBatchNorm.convert_sync_batchnorm`` for multi-GPU runs);
``norm="frozen"`` swaps every backbone BN for torchvision's ``FrozenBatchNorm2d`` (the classic
supervised fine-tuning recipe). ``freeze_at`` freezes the stem (1) and the first stages (2..5)
as detectron2's ``BACKBONE.FREEZE_AT`` does; the protocol uses 0.
"""

from __future__ import annotations

import copy
from typing import Literal, Sequence

import torch
import torch.nn as nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from cl_zoo.errors import ClZooError

Head = Literal["c4", "fpn"]
Norm = Literal["bn", "frozen"]

_STAGES = ("layer1", "layer2", "layer3", "layer4")


def _is_resnet(model: nn.Module) -> bool:
    return all(hasattr(model, n) for n in ("conv1", "bn1", "maxpool", *_STAGES))


def check_detection_backbone(backbone: nn.Module) -> None:
    """Refuse, in one line, a backbone the ResNet detectors cannot take (checked before any training)."""
    if _is_resnet(backbone):
        return
    arch = getattr(backbone, "arch_name", None) or type(backbone).__name__
    if hasattr(backbone, "patch_embed"):
        raise ClZooError(f"{arch} is a Vision Transformer: ViT backbones are not supported by detect yet "
                         "(it needs a ResNet backbone: conv1/bn1/layer1..4)")
    raise ClZooError(f"detection needs a ResNet backbone (conv1/bn1/layer1..4); got {arch} ({type(backbone).__name__})")


def freeze_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm2d by a FrozenBatchNorm2d carrying the same statistics."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, eps=child.eps)
            frozen.weight.copy_(child.weight.detach())
            frozen.bias.copy_(child.bias.detach())
            frozen.running_mean.copy_(child.running_mean)
            frozen.running_var.copy_(child.running_var)
            setattr(module, name, frozen)
        else:
            freeze_batchnorm(child)
    return module


def _freeze(modules: Sequence[nn.Module]) -> None:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)


class _C4Trunk(nn.Module):
    """Stem + res2..res4 of a ResNet; ``out_channels`` is what the RPN sees."""

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu, self.maxpool = resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool
        self.layer1, self.layer2, self.layer3 = resnet.layer1, resnet.layer2, resnet.layer3
        self.out_channels = int(resnet.stage_channels[2]) if hasattr(resnet, "stage_channels") else _width(resnet.layer3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return {"0": self.layer3(self.layer2(self.layer1(x)))}


class Res5ExtraNormHead(nn.Module):
    """res5 on pooled RoIs, then the extra norm of ``Res5ROIHeadsExtraNorm``, then global pooling."""

    def __init__(self, layer4: nn.Module, channels: int, norm: Norm) -> None:
        super().__init__()
        self.res5 = layer4
        self.norm = nn.BatchNorm2d(channels) if norm == "bn" else FrozenBatchNorm2d(channels)
        self.out_channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.res5(x)).mean(dim=(2, 3))


def _to_float32(output: object) -> object:
    if isinstance(output, torch.Tensor):
        return output.float()
    if isinstance(output, (list, tuple)):
        return type(output)(_to_float32(o) for o in output)
    return output


def keep_box_deltas_float32(model: FasterRCNN) -> FasterRCNN:
    """Make the RPN head and the box predictor hand float32 to the box coder under bf16/fp16 autocast.

    torchvision's ``BoxCoder.decode`` casts the anchors (or proposals) to the deltas' dtype, so bf16
    deltas put box corners on bf16's grid: 2 px steps at 256-512 px, 4 px beyond. Small proposals
    then collapse to zero width and the next box-regression target is ``log(w / 0)``: on BCCD at a
    256 px short side the loss became NaN 57-189 iterations into every bf16 run, at any learning
    rate. Casting the two heads' outputs keeps the convolutions in bf16 (where the time goes) and the
    box arithmetic in float32. A forward hook, not a wrapper module, so parameter names (and
    checkpoints to resume) stay torchvision's.
    """
    for head in (model.rpn.head, model.roi_heads.box_predictor):
        head.register_forward_hook(lambda _module, _inputs, output: _to_float32(output))
    return model


def _width(stage: nn.Module) -> int:
    last = list(stage.children())[-1]
    for name in ("conv3", "conv2"):
        if hasattr(last, name):
            return int(getattr(last, name).out_channels)
    raise ClZooError("cannot tell the output width of a ResNet stage")


def default_head(backbone: nn.Module) -> Head:
    """The head a run gets when none is named: FPN for a basic-block ResNet (18/34), C4 otherwise.

    It agrees with the detectron2 launcher (``default_preset``), which must pick FPN there because
    detectron2's C4 head builds res5 from bottleneck blocks. For a ResNet-18 the FPN head is also the
    one to run on a CPU: C4 runs res5 once per sampled RoI (512 per image by default), which made
    its iterations 4-9 times as long as FPN's (docs/benchmarks.md, "Detection heads on a CPU")."""
    last = list(backbone.layer4.children())[-1] if _is_resnet(backbone) else None
    return "c4" if last is not None and hasattr(last, "conv3") else "fpn"


def build_faster_rcnn(
    backbone: nn.Module,
    num_classes: int,
    *,
    head: Head = "c4",
    norm: Norm = "bn",
    freeze_at: int = 0,
    fpn_norm: bool = True,
    min_size: int | Sequence[int] = 800,
    max_size: int = 1333,
    image_mean: Sequence[float] | None = None,
    image_std: Sequence[float] | None = None,
    rois_per_image: int = 512,
    proposals_test: int = 1000,
) -> FasterRCNN:
    """Faster R-CNN whose backbone is (a copy of) ``backbone``, a zoo/torchvision ResNet.

    ``num_classes`` counts object classes; background is added here. ``image_mean``/``image_std``
    default to the backbone's ``pretrained_cfg`` (RGB in [0, 1]), which for ImageNet models are
    the protocol's torchvision statistics (123.675/58.395... on the 0..255 scale).
    ``rois_per_image`` (sampled RoIs per training image, detectron2's 512) and ``proposals_test``
    (RoIs per test image, 1000) dominate the C4 head's cost, since every RoI runs res5: lower both
    for quick CPU runs, never for numbers to compare with the papers.
    """
    check_detection_backbone(backbone)
    if head not in ("c4", "fpn"):
        raise ClZooError(f"unknown detection head {head!r}; choose c4 or fpn")
    if norm not in ("bn", "frozen"):
        raise ClZooError(f"unknown backbone norm {norm!r}; choose bn or frozen")
    if not 0 <= freeze_at <= 5:
        raise ClZooError(f"freeze_at must be 0..5, got {freeze_at}")
    resnet = copy.deepcopy(backbone).train()
    if hasattr(resnet, "fc"):
        resnet.fc = nn.Identity()
    if norm == "frozen":
        freeze_batchnorm(resnet)
    cfg = getattr(backbone, "pretrained_cfg", None)
    mean = list(image_mean or (cfg.mean if cfg is not None else (0.485, 0.456, 0.406)))
    std = list(image_std or (cfg.std if cfg is not None else (0.229, 0.224, 0.225)))
    stem = [resnet.conv1, resnet.bn1]
    stages = [getattr(resnet, n) for n in _STAGES]
    _freeze(([nn.ModuleList(stem)] if freeze_at >= 1 else []) + stages[: max(0, freeze_at - 1)])
    common = dict(min_size=min_size, max_size=max_size, image_mean=mean, image_std=std,
                  box_batch_size_per_image=rois_per_image, rpn_post_nms_top_n_test=proposals_test)
    if head == "c4":
        trunk = _C4Trunk(resnet)
        res5_channels = _width(resnet.layer4)
        anchors = AnchorGenerator(sizes=((32, 64, 128, 256, 512),), aspect_ratios=((0.5, 1.0, 2.0),))
        pooler = MultiScaleRoIAlign(featmap_names=["0"], output_size=14, sampling_ratio=0)
        model = FasterRCNN(
            trunk,
            num_classes=None,
            rpn_anchor_generator=anchors,
            box_roi_pool=pooler,
            box_head=Res5ExtraNormHead(resnet.layer4, res5_channels, norm),
            box_predictor=FastRCNNPredictor(res5_channels, num_classes + 1),
            rpn_pre_nms_top_n_train=12000,
            rpn_post_nms_top_n_train=2000,
            rpn_pre_nms_top_n_test=6000,
            **common,
        )
    else:
        channels = list(getattr(resnet, "stage_channels", [_width(s) for s in stages]))
        body = BackboneWithFPN(
            resnet,
            return_layers={n: str(i) for i, n in enumerate(_STAGES)},
            in_channels_list=channels,
            out_channels=256,
            extra_blocks=LastLevelMaxPool(),
            norm_layer=nn.BatchNorm2d if fpn_norm else None,
        )
        model = FasterRCNN(body, num_classes=num_classes + 1, **common)
    model.head_kind = head  # type: ignore[assignment]
    return keep_box_deltas_float32(model)
