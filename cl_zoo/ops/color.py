"""sRGB -> CIE Lab conversion on batched tensors (differentiable, any device).

CMC splits an image into L and ab. Doing the conversion inside the model (and on the GPU in the
training pipeline) keeps one implementation for training, embedding and evaluation. The formula is
skimage's ``rgb2lab`` (D65 white point, 2-degree observer), so numbers match the authors' pipeline,
which converted with skimage on the CPU.
"""

from __future__ import annotations

import torch

# sRGB (linear) -> XYZ, D65. On the CPU explicitly: this module is imported on a model's first build,
# which may run under ``with torch.device("meta")`` (a size-only build), and must not make these meta.
_RGB_TO_XYZ = torch.tensor(
    [
        [0.412453, 0.357580, 0.180423],
        [0.212671, 0.715160, 0.072169],
        [0.019334, 0.119193, 0.950227],
    ],
    dtype=torch.float64,
    device="cpu",
)
_D65_WHITE = torch.tensor([0.95047, 1.0, 1.08883], dtype=torch.float64, device="cpu")

# CMC's normalisation of Lab channels to roughly [-1, 1] (its data loader's Normalize).
LAB_MEAN = ((0 + 100) / 2, (-86.183 + 98.233) / 2, (-107.857 + 94.478) / 2)
LAB_STD = ((100 - 0) / 2, (86.183 + 98.233) / 2, (107.857 + 94.478) / 2)


def rgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """Convert ``[B, 3, H, W]`` sRGB in [0, 1] to Lab (L in [0, 100], a/b roughly [-128, 127])."""
    if rgb.dim() != 4 or rgb.shape[1] != 3:
        raise ValueError(f"expected [B, 3, H, W] RGB, got shape {tuple(rgb.shape)}")
    dtype = rgb.dtype if rgb.dtype in (torch.float32, torch.float64) else torch.float32
    x = rgb.to(dtype).clamp(0.0, 1.0)
    # sRGB gamma -> linear; clamp inside pow keeps the gradient finite at 0.
    linear = torch.where(x > 0.04045, ((x.clamp_min(0.04045) + 0.055) / 1.055) ** 2.4, x / 12.92)
    m = _RGB_TO_XYZ.to(device=x.device, dtype=dtype)
    xyz = torch.einsum("ij,bjhw->bihw", m, linear)
    xyz = xyz / _D65_WHITE.to(device=x.device, dtype=dtype).view(1, 3, 1, 1)
    eps = 0.008856
    f = torch.where(xyz > eps, xyz.clamp_min(eps) ** (1.0 / 3.0), 7.787 * xyz + 16.0 / 116.0)
    fx, fy, fz = f[:, 0], f[:, 1], f[:, 2]
    lightness = 116.0 * fy - 16.0
    # skimage: L = 903.3 * y for y <= eps (continuous with the branch above).
    lightness = torch.where(xyz[:, 1] > eps, lightness, 903.3 * xyz[:, 1])
    a = 500.0 * (fx - fy)
    b = 200.0 * (fy - fz)
    return torch.stack([lightness, a, b], dim=1)


def normalize_lab(lab: torch.Tensor) -> torch.Tensor:
    """Scale Lab channels to about [-1, 1] with CMC's constants."""
    mean = torch.tensor(LAB_MEAN, device=lab.device, dtype=lab.dtype).view(1, 3, 1, 1)
    std = torch.tensor(LAB_STD, device=lab.device, dtype=lab.dtype).view(1, 3, 1, 1)
    return (lab - mean) / std
