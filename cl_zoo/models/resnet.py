"""ResNet backbones: torchvision's layout, parameter names and initialisation, without torchvision.

Parameter names are torchvision's (``conv1``, ``bn1``, ``layer1``..``layer4``) with the classifier
removed, so weights move to torchvision, timm and detectron2 by renaming alone. Two stems:

* ``imagenet``: 7x7 stride-2 conv + 3x3 max-pool (the original ResNet);
* ``cifar``: 3x3 stride-1 conv and no max-pool, as SimCLR, DCL, CACR and every CIFAR benchmark
  (lightly, solo-learn) use for 32x32 inputs.

A width multiplier scales the residual stages (CMC's x0.5/x1/x2 encoders); the stem keeps
``stem_width`` channels (64 by default), as in CMC's own ResNet.

The two blocks are written out here rather than imported from ``torchvision.models.resnet``, for
a measured reason: importing any part of torchvision runs its ``__init__``, which imports
``torchvision.ops`` and through ``roi_align`` all of ``torch._dynamo``, about a third of the wall
time of ``cl-zoo embed examples/photos`` on 2 cores, for a command that needs no torchvision at all
(docs/benchmarks.md, "On an Intel Xeon with AMX"). They are torchvision 0.29's ``BasicBlock`` and
``Bottleneck`` (V1.5: the stride on the 3x3 conv), modules created in the same order, so a seed
gives bit-identical weights; ``tests/models/test_resnet_blocks.py`` checks that against torchvision
itself, and the forward pass.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn

from cl_zoo.registry import register_model

Stem = Literal["imagenet", "cifar"]


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs (ResNet-18/34); torchvision's names and module order."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (strided) -> 1x1 x4 (ResNet-50/101, "V1.5"); torchvision's names and module order."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


_DEPTHS: dict[int, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    18: (BasicBlock, [2, 2, 2, 2]),
    34: (BasicBlock, [3, 4, 6, 3]),
    50: (Bottleneck, [3, 4, 6, 3]),
    101: (Bottleneck, [3, 4, 23, 3]),
}


class ResNet(nn.Module):
    """A ResNet without its classifier, with a CIFAR stem and width options.

    ``forward`` and ``forward_features`` return globally pooled features ``[B, num_features]``;
    ``forward_stages`` returns the four stage outputs for detection.
    """

    def __init__(
        self,
        depth: int = 50,
        in_chans: int = 3,
        stem: Stem = "imagenet",
        width: float = 1.0,
        stem_width: int = 64,
        zero_init_residual: bool = False,
    ) -> None:
        if depth not in _DEPTHS:
            raise ValueError(f"unsupported ResNet depth {depth}; choose from {sorted(_DEPTHS)}")
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"unknown stem {stem!r}; choose 'imagenet' or 'cifar'")
        block, layers = _DEPTHS[depth]
        super().__init__()
        self.depth, self.in_chans, self.stem, self.width = depth, in_chans, stem, width
        self.inplanes = stem_width
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_chans, stem_width, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(in_chans, stem_width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(stem_width)
        self.relu = nn.ReLU(inplace=True)
        planes = [max(1, int(round(64 * width * 2**i))) for i in range(4)]
        self.layer1 = self._make_layer(block, planes[0], layers[0])
        self.layer2 = self._make_layer(block, planes[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, planes[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, planes[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.num_features = planes[3] * block.expansion
        self.stage_channels = [p * block.expansion for p in planes]
        if self.conv1.weight.is_meta:
            # A size-only build (the loader's check of a checkpoint's shapes): nothing to initialise,
            # and torch's meta normal_ goes through its reference ops, which import torch._dynamo.
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        """One stage, as torchvision builds it: the projection shortcut is created before the first block."""
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, planes * block.expansion, stride), nn.BatchNorm2d(planes * block.expansion))
        layers: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward_stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        c2 = self.layer1(x)
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        return [c2, c3, c4, c5]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.avgpool(self.forward_stages(x)[-1]), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


# The builders below are declared, with their configs and sizes, in cl_zoo/models/archs.py.


@register_model
def resnet18(**kwargs: object) -> ResNet:
    """ResNet-18, ImageNet stem (11.2M parameters without fc)."""
    return ResNet(depth=18, **kwargs)  # type: ignore[arg-type]


@register_model
def resnet34(**kwargs: object) -> ResNet:
    """ResNet-34, ImageNet stem (21.3M parameters without fc)."""
    return ResNet(depth=34, **kwargs)  # type: ignore[arg-type]


@register_model
def resnet50(**kwargs: object) -> ResNet:
    """ResNet-50, ImageNet stem (23.5M parameters without fc)."""
    return ResNet(depth=50, **kwargs)  # type: ignore[arg-type]


@register_model
def resnet18_cifar(**kwargs: object) -> ResNet:
    """ResNet-18 with the CIFAR stem (3x3 stride-1 conv, no max-pool), for 32x32 inputs."""
    return ResNet(depth=18, stem="cifar", **kwargs)  # type: ignore[arg-type]


@register_model
def resnet34_cifar(**kwargs: object) -> ResNet:
    """ResNet-34 with the CIFAR stem."""
    return ResNet(depth=34, stem="cifar", **kwargs)  # type: ignore[arg-type]


@register_model
def resnet50_cifar(**kwargs: object) -> ResNet:
    """ResNet-50 with the CIFAR stem."""
    return ResNet(depth=50, stem="cifar", **kwargs)  # type: ignore[arg-type]
