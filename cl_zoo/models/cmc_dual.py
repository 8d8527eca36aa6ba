"""CMC's dual encoder: one network on L, one on ab, features concatenated.

The model takes RGB in [0, 1] (its pretrained config has mean 0 / std 1) and converts to Lab
itself, so any caller that feeds the zoo's standard preprocessing gets the CMC input without a
special path. ``forward_views`` returns the two views' features separately for the CMC loss;
``forward_features`` concatenates them (the representation CMC evaluates).

Each view's encoder is a :class:`cl_zoo.models.resnet.ResNet` with a width multiplier; as in CMC's
code the stem keeps 64 channels, so "ResNet-50 x0.5 per view" is 2 x 1024 = 2048 features and about
12M parameters for both.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from cl_zoo.models.alexnet import SmallAlexNet
from cl_zoo.models.resnet import ResNet
from cl_zoo.ops.color import normalize_lab, rgb_to_lab
from cl_zoo.precision import autocast_off
from cl_zoo.registry import register_model


def normalized_lab(rgb: torch.Tensor) -> torch.Tensor:
    """RGB [0, 1] -> Lab ``[B, 3, H, W]`` scaled to about [-1, 1] (float32 inputs; autocast still applies)."""
    return normalize_lab(rgb_to_lab(rgb.float()))


def float32_lab(rgb: torch.Tensor) -> torch.Tensor:
    """:func:`normalized_lab` in float32 even under autocast.

    a = 500 (fx - fy) and b = 200 (fy - fz) are differences of nearly equal cube roots: in bf16 they
    cancel. Under bf16 autocast the RGB -> XYZ product alone runs in bf16 and moves a by up to 1.2
    (of +-128), so autocast is turned off for the conversion, where it is on (a meta-device forward
    has no autocast to turn off).
    """
    with autocast_off(rgb):
        return normalized_lab(rgb)


class LabSplit(nn.Module):
    """RGB [0, 1] -> (L [B,1,H,W], ab [B,2,H,W]), each scaled to about [-1, 1], in float32.

    The CPU tier's CMC checkpoints (its three seeds and the shared-crop control) were trained with
    this conversion under autocast, the RGB -> XYZ product in bf16; they are kept as one set so
    their seeds stay comparable. Training runs it in float32.
    """

    def forward(self, rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lab = float32_lab(rgb)
        return lab[:, :1], lab[:, 1:]


class CMCDualEncoder(nn.Module):
    """Two encoders, L and ab, whose pooled features are concatenated."""

    def __init__(self, l_encoder: nn.Module, ab_encoder: nn.Module) -> None:
        super().__init__()
        self.to_lab = LabSplit()
        self.l_encoder = l_encoder
        self.ab_encoder = ab_encoder
        self.view_features = [l_encoder.num_features, ab_encoder.num_features]
        self.num_features = sum(self.view_features)

    def forward_views(self, rgb: torch.Tensor, ab_rgb: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(L features, ab features) of one crop, or with ``ab_rgb`` L of ``rgb`` and ab of ``ab_rgb``:
        two crops of an image, so the pair also contrasts in space (CMC supplement: "random
        jittering and cropping between views"), each encoder still run once."""
        l_view, ab_view = self.to_lab(rgb)
        if ab_rgb is not None:
            ab_view = self.to_lab(ab_rgb)[1]
        return self._encode(l_view, ab_view)

    def _encode(self, l_view: torch.Tensor, ab_view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = next(self.l_encoder.parameters()).dtype
        return (
            self.l_encoder.forward_features(l_view.to(dtype)),
            self.ab_encoder.forward_features(ab_view.to(dtype)),
        )

    def float32_input_transform(self, rgb: torch.Tensor) -> torch.Tensor:
        """Normalised Lab ``[B, 3, H, W]`` of RGB in [0, 1], in float32 even under autocast
        (:func:`float32_lab`). An OpenVINO graph under the bf16 hint would run all of the conversion
        in bf16 (the tier CMC's features fell to cosine 0.980 of float32), so engines that lower
        precision run this on the host in float32 and convert only :meth:`forward_transformed`
        (:mod:`cl_zoo.backends.openvino`).
        """
        return float32_lab(rgb)

    def forward_transformed(self, lab: torch.Tensor) -> torch.Tensor:
        """Features of :meth:`float32_input_transform`'s output (the rest of :meth:`forward_features`)."""
        return torch.cat(self._encode(lab[:, :1], lab[:, 1:]), dim=1)

    def forward_features(self, rgb: torch.Tensor) -> torch.Tensor:
        return self.forward_transformed(self.float32_input_transform(rgb))

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        return self.forward_features(rgb)


def _resnet_pair(depth: int, width: float, stem: str) -> CMCDualEncoder:
    return CMCDualEncoder(
        ResNet(depth=depth, in_chans=1, stem=stem, width=width),  # type: ignore[arg-type]
        ResNet(depth=depth, in_chans=2, stem=stem, width=width),  # type: ignore[arg-type]
    )


# The builders below are declared, with their configs and sizes, in cl_zoo/models/archs.py.


@register_model
def cmc_resnet50x05_lab(width: float = 0.5) -> CMCDualEncoder:
    """CMC L+ab, ResNet-50 at width 0.5 per view (2048-d, ~12M parameters)."""
    return _resnet_pair(50, width, "imagenet")


@register_model
def cmc_resnet50x1_lab(width: float = 1.0) -> CMCDualEncoder:
    """CMC L+ab, ResNet-50 at width 1 per view (4096-d)."""
    return _resnet_pair(50, width, "imagenet")


@register_model
def cmc_resnet50x2_lab(width: float = 2.0) -> CMCDualEncoder:
    """CMC L+ab, ResNet-50 at width 2 per view (8192-d)."""
    return _resnet_pair(50, width, "imagenet")


@register_model
def cmc_resnet18_lab(width: float = 0.71) -> CMCDualEncoder:
    """CMC L+ab with ImageNet-stem ResNet-18s; width 0.71 makes the pair 11.32M parameters, the
    nearest to one ResNet-18 (11.18M without fc; 0.70 gives 10.96M), so CMC competes at equal size."""
    return _resnet_pair(18, width, "imagenet")


@register_model
def cmc_resnet18_cifar_lab(width: float = 0.75) -> CMCDualEncoder:
    """CMC L+ab with CIFAR-stem ResNet-18s; width 0.75 keeps both near one ResNet-18 (~12.6M)."""
    return _resnet_pair(18, width, "cifar")


@register_model
def cmc_alexnet_cifar_lab() -> CMCDualEncoder:
    """CMC L+ab with the two halves of the small AlexNet (CMC Table 10 / Wang & Isola)."""
    return CMCDualEncoder(SmallAlexNet(in_chans=1, width=0.5), SmallAlexNet(in_chans=2, width=0.5))
