"""The small AlexNet that CMC (Table 10) and CACR (following Wang & Isola 2020) use on CIFAR/STL.

Five 3x3 conv blocks with BN (96, 192, 384, 384, 192 channels; max-pool after 1, 2 and 5) and two
BN'd fully connected layers of 4096 units (fc6, fc7). The feature is fc7's output; the projection
(fc8, 128-d) belongs to the method's head, not the backbone. ``width=0.5`` gives the halves CMC
splits across the L and ab views.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from cl_zoo.registry import register_model


def _conv_block(cin: int, cout: int, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]
    if pool:
        layers.append(nn.MaxPool2d(kernel_size=3, stride=2))
    return nn.Sequential(*layers)


def _spatial_after(size: int) -> int:
    for _ in range(3):  # three 3x3 stride-2 max-pools without padding
        size = (size - 3) // 2 + 1
    return size


class SmallAlexNet(nn.Module):
    def __init__(self, in_chans: int = 3, width: float = 1.0, input_size: int = 32) -> None:
        super().__init__()
        c = [int(round(ch * width)) for ch in (96, 192, 384, 384, 192)]
        fc = int(round(4096 * width))
        self.features = nn.Sequential(
            _conv_block(in_chans, c[0], pool=True),
            _conv_block(c[0], c[1], pool=True),
            _conv_block(c[1], c[2], pool=False),
            _conv_block(c[2], c[3], pool=False),
            _conv_block(c[3], c[4], pool=True),
        )
        spatial = _spatial_after(input_size)
        if spatial < 1:
            raise ValueError(f"input size {input_size} is too small for SmallAlexNet")
        self.input_size = input_size
        self.fc6 = nn.Sequential(
            nn.Flatten(), nn.Linear(c[4] * spatial * spatial, fc, bias=False), nn.BatchNorm1d(fc), nn.ReLU(inplace=True)
        )
        self.fc7 = nn.Sequential(nn.Linear(fc, fc, bias=False), nn.BatchNorm1d(fc), nn.ReLU(inplace=True))
        self.num_features = fc

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_size or x.shape[-2] != self.input_size:
            raise ValueError(
                f"SmallAlexNet was built for {self.input_size}x{self.input_size} inputs, got "
                f"{x.shape[-2]}x{x.shape[-1]}"
            )
        return self.fc7(self.fc6(self.features(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


@register_model  # declared, with its config, in cl_zoo/models/archs.py
def alexnet_cifar(**kwargs: object) -> SmallAlexNet:
    """Small AlexNet for 32x32 inputs (4096-d fc7 features)."""
    return SmallAlexNet(**kwargs)  # type: ignore[arg-type]
