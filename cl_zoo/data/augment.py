"""Contrastive augmentations on whole batches of tensors, on whatever device the batch lives on.

One implementation serves tests (CPU), CI and training (GPU), so the augmentation a model was
trained with is the one that is tested. Each op follows the semantics of the torchvision
transform of the same name (parameter ranges, 10-try RandomResizedCrop sampling with its fallback,
grayscale weights, contrast mean, blur kernel, clamping), and the tests compare every op against
``torchvision.transforms.v2.functional`` on identical parameters.

Parameters are drawn per sample from a CPU ``torch.Generator``: the same seed gives the same
augmentation on CPU and GPU, and sampling never launches device kernels. Ops then run batched:
one ``roi_align`` crops and resizes every sample, colour ops are elementwise over the batch, and
the blur is one grouped separable convolution with a kernel per sample.

Colour jitter order: per-sample random order (``jitter_order="random"``), as torchvision's
``ColorJitter`` does; ``"fixed"`` applies brightness, contrast, saturation, hue in that order
(what some reimplementations do). The random order is realised step by step: at each of the four
steps the cheap ops (brightness, contrast, saturation) run over the whole batch with an identity
factor (exactly 1) for samples whose permutation does not put them there, and the costly hue
rotation runs only on the samples whose step it is.

Every choice that depends on the parameters (which samples a step selects, their factors) is
made on the CPU, where the parameters live, and reaches the device as a non-blocking copy: the
augmentation never waits for the device. Selecting the hue and blur subsets from device masks
(``nonzero``) would cost a host sync per subset, and constants built with
``torch.tensor(..., device=cuda)`` a blocking copy each; each sync drains the queue of the previous
step's backward before the host can launch the next kernels, and at 32 px those waits cost a large
share of the step (the H200 measurements are in docs/benchmarks.md, "``pretrain_throughput.py``
(GPU)"). ``tests/data/test_augment.py`` audits for host waits on the meta device.

With no waits, what bounds the loop is the host launching kernels: at 32 px each finishes in
microseconds, and the augmentation of two CIFAR views would otherwise take more device ops than a
DCL step's forward, backward and foreach SGD together. So on a GPU the views of one recipe go
through the ops as one batch (:func:`apply_views`; the same values bit for bit), the hue is one
fused computation (:func:`adjust_hue`) and a blend one ``lerp``; the ops a step are counted on the
meta device by ``test_two_cifar_views_take_few_device_kernels``. On a CPU, where the larger batch
falls out of cache, views stay one call each (:func:`batches_views`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

from cl_zoo.constants import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD

_GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma, as torchvision's rgb_to_grayscale


@dataclass(frozen=True)
class AugmentConfig:
    """One view's augmentation recipe; presets cite their source."""

    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    jitter_order: Literal["random", "fixed"] = "random"
    grayscale_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    blur_kernel: int | None = None  # None: the odd size nearest 10% of ``size`` (SimCLR)
    solarize_p: float = 0.0
    solarize_threshold: float = 0.5
    mean: tuple[float, float, float] | None = IMAGENET_MEAN  # None: output stays RGB in [0, 1]
    std: tuple[float, float, float] | None = IMAGENET_STD
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise ValueError(f"size must be positive, got {self.size}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio}")
        for name in ("flip_p", "jitter_p", "grayscale_p", "blur_p", "solarize_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability, got {getattr(self, name)}")
        if min(self.brightness, self.contrast, self.saturation) < 0 or not 0 <= self.hue <= 0.5:
            raise ValueError("jitter strengths must be >= 0 and hue in [0, 0.5]")
        if self.jitter_order not in ("random", "fixed"):
            raise ValueError(f"jitter_order must be 'random' or 'fixed', got {self.jitter_order!r}")
        if self.blur_kernel is not None and (self.blur_kernel <= 0 or self.blur_kernel % 2 == 0):
            raise ValueError(f"blur_kernel must be a positive odd int, got {self.blur_kernel}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must both be given or both be None")

    @property
    def kernel_size(self) -> int:
        if self.blur_kernel is not None:
            return self.blur_kernel
        return int(0.1 * self.size) // 2 * 2 + 1

    @property
    def colour_ops(self) -> bool:
        return self.jitter_p > 0 or self.grayscale_p > 0 or self.solarize_p > 0

    # ---- presets -------------------------------------------------------------------------
    @classmethod
    def simclr(cls, size: int = 224, strength: float = 1.0) -> "AugmentConfig":
        """SimCLR (Chen et al. 2020, App. A): jitter 0.8s/0.8s/0.8s/0.2s p0.8, gray 0.2, blur p0.5."""
        s = strength
        return cls(size=size, brightness=0.8 * s, contrast=0.8 * s, saturation=0.8 * s, hue=0.2 * s,
                   blur_p=0.5, name=f"simclr(s={s:g})")

    @classmethod
    def dcl(cls, size: int = 224) -> "AugmentConfig":
        """DCL appendix A.4: SimCLR's with colour jitter 0.8/0.8/0.8/0.2, blur sigma [0.1, 2]."""
        return replace(cls.simclr(size, 1.0), name="dcl")

    @classmethod
    def mocov2(cls, size: int = 224) -> "AugmentConfig":
        """MoCo v2 (Chen et al. 2020, its main_moco.py --aug-plus): crop scale 0.2-1, jitter 0.4/0.4/0.4/0.1."""
        return cls(size=size, scale=(0.2, 1.0), brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1,
                   blur_p=0.5, name="mocov2")

    @classmethod
    def mocov3(cls, size: int = 224) -> "AugmentConfig":
        """MoCo v3's first view (its main_moco.py, "follow BYOL's augmentation recipe"): crop scale
        0.08-1 (``--crop-min``), jitter 0.4/0.4/0.2/0.1 p0.8, gray 0.2, blur sigma [0.1, 2] p1.0."""
        return cls(size=size, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, blur_p=1.0, name="mocov3")

    @classmethod
    def mocov3_second(cls, size: int = 224) -> "AugmentConfig":
        """MoCo v3's second view: as the first but blur p0.1 and solarize p0.2 (PIL's threshold 128)."""
        return replace(cls.mocov3(size), blur_p=0.1, solarize_p=0.2, name="mocov3_second")

    @classmethod
    def cifar(cls, size: int = 32) -> "AugmentConfig":
        """SimCLR's CIFAR-10 setting (App. B.9): colour strength 0.5 (0.4/0.4/0.4/0.1), no blur."""
        return cls(size=size, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, blur_p=0.0,
                   mean=CIFAR10_MEAN, std=CIFAR10_STD, name="cifar")

    @classmethod
    def align_uniform(cls, size: int = 32) -> "AugmentConfig":
        """CACR's CIFAR-10 augmentation (its Algorithm 1, "exactly the same as the one used in Wang & Isola
        (2020)"; ../shared/seeds/004 lines 1565-1572): ``RandomResizedCrop(32, scale=(0.2, 1))``, flip,
        ``ColorJitter(0.4, 0.4, 0.4, 0.4)`` on every image (no ``RandomApply``), ``RandomGrayscale(p=0.2)``,
        ``Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))``; CACR and its CMC baseline use it."""
        return cls(size=size, scale=(0.2, 1.0), jitter_p=1.0, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.4,
                   grayscale_p=0.2, blur_p=0.0, mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010),
                   name="align_uniform")

    @classmethod
    def cmc(cls, size: int = 224, scale_min: float = 0.2) -> "AugmentConfig":
        """CMC: crop (scale 0.2-1, authors' --crop_low) + flip only; RGB [0,1] out, Lab is done in the model."""
        return cls(size=size, scale=(scale_min, 1.0), jitter_p=0.0, brightness=0.0, contrast=0.0,
                   saturation=0.0, hue=0.0, grayscale_p=0.0, blur_p=0.0, mean=None, std=None, name="cmc")


PRESETS = {"simclr": AugmentConfig.simclr, "dcl": AugmentConfig.dcl, "mocov2": AugmentConfig.mocov2,
           "cifar": AugmentConfig.cifar, "align_uniform": AugmentConfig.align_uniform, "cmc": AugmentConfig.cmc,
           "mocov3": AugmentConfig.mocov3, "mocov3_second": AugmentConfig.mocov3_second}


def preset(name: str, size: int | None = None) -> AugmentConfig:
    """A preset by name (for recipes); ``size`` defaults to the preset's own."""
    if name not in PRESETS:
        raise KeyError(f"unknown augmentation preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]() if size is None else PRESETS[name](size)


@dataclass
class AugmentParams:
    """Per-sample parameters of one view (all CPU tensors of length B)."""

    boxes: torch.Tensor  # [B, 4] int64 (top, left, height, width) in input pixels
    flip: torch.Tensor  # [B] bool
    jitter: torch.Tensor  # [B] bool
    factors: torch.Tensor  # [B, 4] float (brightness, contrast, saturation, hue)
    order: torch.Tensor  # [B, 4] int64: order[b, k] = op applied at step k
    gray: torch.Tensor  # [B] bool
    blur: torch.Tensor  # [B] bool
    sigma: torch.Tensor  # [B] float
    solarize: torch.Tensor  # [B] bool


# ---- parameter sampling (vectorised) ----------------------------------------------------------
def sample_crop_boxes(batch: int, height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                      generator: torch.Generator | None = None, tries: int = 10) -> torch.Tensor:
    """RandomResizedCrop boxes ``[B, 4]`` (top, left, h, w): torchvision's 10 tries, then its fallback."""
    area = float(height * width)
    u = torch.rand(4, batch, tries, generator=generator, dtype=torch.float64)
    target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[1])
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    top = torch.floor(u[2] * (height - h + 1).clamp_min(1))
    left = torch.floor(u[3] * (width - w + 1).clamp_min(1))
    first = ok.to(torch.int8).argmax(dim=1, keepdim=True)  # first successful try
    pick = lambda t: t.gather(1, first).squeeze(1)  # noqa: E731
    boxes = torch.stack([pick(top), pick(left), pick(h), pick(w)], dim=1).to(torch.int64)
    # Fallback (no try fitted): whole image clipped to the ratio range, centred.
    in_ratio = width / height
    if in_ratio < min(ratio):
        fw, fh = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fh, fw = height, int(round(height * max(ratio)))
    else:
        fw, fh = width, height
    fallback = torch.tensor([(height - fh) // 2, (width - fw) // 2, fh, fw], dtype=torch.int64)
    return torch.where(ok.any(dim=1, keepdim=True), boxes, fallback)


def _uniform(n: int, lo: float, hi: float, generator: torch.Generator | None) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=generator)


def sample_params(config: AugmentConfig, batch: int, height: int, width: int,
                  generator: torch.Generator | None = None) -> AugmentParams:
    """Draw every random choice of one view for a batch (cheap, vectorised, on the CPU)."""
    g = generator
    boxes = sample_crop_boxes(batch, height, width, config.scale, config.ratio, g)
    flip = torch.rand(batch, generator=g) < config.flip_p
    jitter = torch.rand(batch, generator=g) < config.jitter_p
    b, c, s, h = config.brightness, config.contrast, config.saturation, config.hue
    factors = torch.stack([
        _uniform(batch, max(0.0, 1 - b), 1 + b, g),
        _uniform(batch, max(0.0, 1 - c), 1 + c, g),
        _uniform(batch, max(0.0, 1 - s), 1 + s, g),
        _uniform(batch, -h, h, g),
    ], dim=1)
    if config.jitter_order == "random":
        order = torch.rand(batch, 4, generator=g).argsort(dim=1)
    else:
        order = torch.arange(4).expand(batch, 4).clone()
    gray = torch.rand(batch, generator=g) < config.grayscale_p
    blur = torch.rand(batch, generator=g) < config.blur_p
    sigma = _uniform(batch, config.blur_sigma[0], config.blur_sigma[1], g)
    solarize = torch.rand(batch, generator=g) < config.solarize_p
    return AugmentParams(boxes, flip, jitter, factors, order, gray, blur, sigma, solarize)


# ---- ops on float batches in [0, 1] ------------------------------------------------------------
def to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small CPU tensor (parameters, indices) on ``device`` without making the host wait.

    A blocking copy to CUDA synchronises the stream, and a non-blocking one from pageable memory
    may too: pinned memory makes it asynchronous (torch's caching host allocator keeps the block
    alive until the copy is done).
    """
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device=device, dtype=dtype, non_blocking=True)


@functools.lru_cache(maxsize=64)
def device_constant(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``values`` as a ``[1, C, 1, 1]`` tensor on ``device``, made once: ``torch.tensor(..., device=cuda)``
    is a blocking copy, a host sync each time. Shared and read-only: never modify it in place."""
    return torch.tensor(values, dtype=dtype).view(1, -1, 1, 1).to(device)


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 in [0, 1]; float input is taken to be in [0, 1] already."""
    if images.dtype == torch.uint8:
        return images.float().div_(255.0)
    if not images.is_floating_point():
        raise TypeError(f"expected uint8 or floating images, got {images.dtype}")
    return images


def resized_crop(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Crop ``boxes`` (top, left, h, w) and resize each to ``size``: one ``roi_align`` for the batch.

    ``aligned=True`` puts samples at the same pixel centres as bilinear ``interpolate``; the
    adaptive sampling grid (ceil(box/size) samples per output pixel) averages when shrinking, which
    plays the role of torchvision's antialiasing. ``boxes`` may hold ``k * B`` rows for ``B`` images:
    row ``i`` crops image ``i mod B`` (``k`` views in one call). The regions are built on the CPU,
    where the boxes are, and reach the device in one copy.
    """
    x = images if images.dtype in (torch.float32, torch.float64) else images.float()
    if boxes.shape[0] % x.shape[0]:
        raise ValueError(f"{boxes.shape[0]} crop boxes for {x.shape[0]} images: expected a multiple")
    b = boxes.to(torch.float64)
    source = torch.arange(boxes.shape[0], dtype=torch.float64).remainder_(x.shape[0])
    rois = torch.stack([source, b[:, 1], b[:, 0], b[:, 1] + b[:, 3], b[:, 0] + b[:, 2]], dim=1)
    out = roi_align(x, to_device(rois, x.device, x.dtype), output_size=(size, size), spatial_scale=1.0,
                    sampling_ratio=-1, aligned=True)
    return out.to(images.dtype)


def _per_sample(v: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_tensor(v):
        v = torch.tensor(v)
    return v.to(device=x.device, dtype=x.dtype).reshape(-1, 1, 1, 1)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma ``[B, 1, H, W]``."""
    w = device_constant(_GRAY_WEIGHTS, x.device, x.dtype)
    return (x * w).sum(dim=1, keepdim=True)


def _blend(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's ``ratio * a + (1 - ratio) * b``, clamped, as one ``lerp`` kernel instead of four.

    ``torch.lerp`` evaluates ``end - (end - start) * (1 - w)`` for ``w >= 0.5`` (ATen's Lerp.h, CPU and
    CUDA alike), so a ratio of exactly 1, the random-order jitter's identity, returns ``a`` bit for bit.
    """
    return torch.lerp(b, a, ratio).clamp_(0.0, 1.0)


def adjust_brightness(x: torch.Tensor, factor) -> torch.Tensor:
    return (x * _per_sample(factor, x)).clamp_(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, factor) -> torch.Tensor:
    mean = grayscale(x).mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean, _per_sample(factor, x))


def adjust_saturation(x: torch.Tensor, factor) -> torch.Tensor:
    return _blend(x, grayscale(x), _per_sample(factor, x))


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """``[B,3,H,W]`` RGB in [0,1] -> HSV, hue in [0, 1)."""
    r, g, b = x.unbind(dim=1)
    maxc = x.amax(dim=1)
    minc = x.amin(dim=1)
    delta = maxc - minc
    gray = delta == 0
    safe = torch.where(gray, torch.ones_like(delta), delta)
    sat = delta / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    # Hue in sixths: which channel is largest picks the sector (red wins ties, then green).
    h_r = (g - b) / safe
    h_g = (b - r) / safe + 2.0
    h_b = (r - g) / safe + 4.0
    is_r = maxc == r
    is_g = (maxc == g) & ~is_r
    hue6 = torch.where(is_r, h_r, torch.where(is_g, h_g, h_b))
    hue = torch.where(gray, torch.zeros_like(hue6), hue6).div_(6.0).remainder_(1.0)
    return torch.stack([hue, sat, maxc], dim=1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`: channel n uses k = (n + 6h) mod 6, c = v - v s clamp(min(k, 4-k), 0, 1)."""
    h, s, v = hsv[:, 0:1], hsv[:, 1:2], hsv[:, 2:3]
    n = device_constant((5.0, 3.0, 1.0), hsv.device, hsv.dtype)
    k = (n + 6.0 * h).remainder(6.0)
    return (v - v * s * torch.minimum(k, 4.0 - k).clamp(0.0, 1.0)).clamp_(0.0, 1.0)


_HUE_SECTORS = (0.0, 2.0, 4.0)  # hue in sixths starts at 0 (red max), 2 (green), 4 (blue)


def adjust_hue(x: torch.Tensor, shift) -> torch.Tensor:
    """Rotate hue by ``shift`` (fraction of the colour circle, in [-0.5, 0.5]) per sample.

    Fused form of ``hsv_to_rgb(rgb_to_hsv(x) + shift)``: value is the channel max and value times
    saturation is max - min, so only the hue needs computing (about a third of the tensor passes).
    Every channel's hue candidate is computed at once (channel c's numerator is channel c+1 minus
    channel c+2, cyclically: g - b, b - r, r - g) and the largest channel's is gathered. ``max``
    returns the first largest channel (red wins ties, then green, as in torchvision), though on a tie
    both candidates give the same hue up to rounding. Fewer kernels than a ``torch.where`` chain over
    the channels: on a GPU at 32 px each is a launch, and the host's launches, not the arithmetic,
    bound the loop.
    """
    maxc, largest = x.max(dim=1, keepdim=True)
    delta = maxc - x.amin(dim=1, keepdim=True)
    inv = delta.clamp_min(1e-12).reciprocal_()  # gray pixels: delta = 0, any hue gives back the same pixel
    numerator = x.roll(-1, dims=1) - x.roll(-2, dims=1)
    sectors = device_constant(_HUE_SECTORS, x.device, x.dtype)
    hue6 = torch.addcmul(sectors, numerator, inv).gather(1, largest)
    n = device_constant((5.0, 3.0, 1.0), x.device, x.dtype)
    k = (hue6 + (n + 6.0 * _per_sample(shift, x))).remainder_(6.0)
    return torch.addcmul(maxc, delta, torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0), value=-1.0).clamp_(0.0, 1.0)


def gaussian_kernels(sigma: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Normalised 1-D Gaussian kernels ``[B, K]`` (torchvision's sampling grid -(K-1)/2 .. (K-1)/2)."""
    half = (kernel_size - 1) * 0.5
    t = torch.linspace(-half, half, kernel_size, device=sigma.device, dtype=sigma.dtype)
    k = torch.exp(-0.5 * (t.view(1, -1) / sigma.view(-1, 1)) ** 2)
    return k / k.sum(dim=1, keepdim=True)


def gaussian_blur(x: torch.Tensor, sigma, kernel_size: int) -> torch.Tensor:
    """Per-sample Gaussian blur with reflect padding as one grouped separable convolution."""
    bsz, ch, hgt, wid = x.shape
    k = min(kernel_size, 2 * min(hgt, wid) - 1)  # reflect padding needs pad < side
    k -= 1 - k % 2
    sig = _per_sample(sigma, x).view(-1).expand(bsz)
    ker = gaussian_kernels(sig, k).repeat_interleave(ch, dim=0)  # [B*C, K]
    pad = k // 2
    y = F.pad(x.reshape(1, bsz * ch, hgt, wid), (pad, pad, pad, pad), mode="reflect")
    y = F.conv2d(y, ker.view(bsz * ch, 1, 1, k), groups=bsz * ch)
    y = F.conv2d(y, ker.view(bsz * ch, 1, k, 1), groups=bsz * ch)
    return y.view(bsz, ch, hgt, wid)


def solarize(x: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    return torch.where(x >= threshold, 1.0 - x, x)


_JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def _apply_subset(x: torch.Tensor, mask: torch.Tensor, fn, *args) -> torch.Tensor:
    """``x[mask] = fn(x[mask], *args[mask])`` computing ``fn`` only on the selected samples.

    ``mask`` is a CPU tensor (the parameters'), so the selection needs nothing back from the device.
    """
    idx = mask.nonzero().squeeze(1)
    if idx.numel() == 0:
        return x
    if idx.numel() == x.shape[0]:
        return fn(x, *args)
    idx = to_device(idx, x.device)
    sub_args = [a.index_select(0, idx) if torch.is_tensor(a) else a for a in args]
    return x.index_copy(0, idx, fn(x.index_select(0, idx), *sub_args))


def apply_params(images: torch.Tensor, config: AugmentConfig, params: AugmentParams) -> torch.Tensor:
    """One view of ``images`` (uint8 or float in [0,1], ``[B,3,H,W]``) with the given parameters."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [B, 3, H, W], got {tuple(images.shape)}")
    dev = images.device
    x = resized_crop(to_float(images), params.boxes, config.size)
    flip = to_device(params.flip, dev).view(-1, 1, 1, 1)
    x = torch.where(flip, x.flip(-1), x)
    if config.jitter_p > 0:
        enabled = (config.brightness > 0, config.contrast > 0, config.saturation > 0, config.hue > 0)
        ops = torch.arange(4).view(1, 4)
        # at_step[k, b, op]: sample b applies op at step k (CPU); the cheap ops' factors for every
        # step, 1 (an exact identity) where unselected, travel to the device in one copy
        at_step = torch.stack([params.jitter.unsqueeze(1) & (params.order[:, k : k + 1] == ops) for k in range(4)])
        cheap = torch.where(at_step[:, :, :3], params.factors[:, :3].unsqueeze(0), 1.0)
        cheap = to_device(cheap, dev, x.dtype)
        shifts = to_device(params.factors[:, 3], dev, x.dtype)
        for step in range(4):
            for op in range(3):  # cheap ops: whole batch
                if enabled[op]:
                    x = _JITTER_OPS[op](x, cheap[step, :, op])
            if enabled[3]:  # hue is costly: compute it only for the samples whose step this is
                x = _apply_subset(x, at_step[step, :, 3], adjust_hue, shifts)
    if config.grayscale_p > 0:
        gray = to_device(params.gray, dev).view(-1, 1, 1, 1)
        x = torch.where(gray, grayscale(x).expand_as(x), x)
    if config.blur_p > 0:
        sigma = to_device(params.sigma, dev, x.dtype)
        x = _apply_subset(x, params.blur, gaussian_blur, sigma, config.kernel_size)
    if config.solarize_p > 0:
        sol = to_device(params.solarize, dev).view(-1, 1, 1, 1)
        x = torch.where(sol, solarize(x, config.solarize_threshold), x)
    return normalize(x, config)


def slice_params(params: AugmentParams, start: int, stop: int) -> AugmentParams:
    """Samples ``start:stop`` of every parameter (one rank's rows of the global batch)."""
    return AugmentParams(*(getattr(params, f.name)[start:stop] for f in fields(AugmentParams)))


def cat_params(params: Sequence[AugmentParams]) -> AugmentParams:
    """Several views' parameters as one batch of ``sum(len)`` samples, views in order."""
    if len(params) == 1:
        return params[0]
    return AugmentParams(*(torch.cat([getattr(p, f.name) for p in params]) for f in fields(AugmentParams)))


def batches_views(device: torch.device) -> bool:
    """Whether views of one recipe are augmented in one call on ``device``.

    On a GPU at 32 px every op is a kernel launch of microseconds' work, so the host's launches set
    the pace: one call for both views of a DCL step halves them (and the parameter copies). On a CPU
    the larger tensors fall out of cache instead, and batching two CIFAR views of 512 is slower than
    one view at a time (docs/benchmarks.md, "``pretrain_throughput.py`` (GPU)", "Fewer launches").
    Either way the views are the same bit for bit.
    """
    return device.type != "cpu"


def apply_views(images: torch.Tensor, configs: Sequence[AugmentConfig], params: Sequence[AugmentParams],
                *, batch_views: bool | None = None) -> list[torch.Tensor]:
    """Every view of ``images``: view ``i`` with ``configs[i]`` and ``params[i]``.

    With ``batch_views`` (default: :func:`batches_views` for the images' device) the views of equal
    configs go through :func:`apply_params` as one batch, which gives the same tensors as one call per
    view: every op is per sample, and the crop reads each view's rows from the same images.
    """
    if len(configs) != len(params):
        raise ValueError(f"{len(configs)} configs for {len(params)} parameter sets")
    if batch_views is None:
        batch_views = batches_views(images.device)
    if not batch_views:
        return [apply_params(images, cfg, p) for cfg, p in zip(configs, params)]
    groups: dict[AugmentConfig, list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault(cfg, []).append(i)
    views: list[torch.Tensor | None] = [None] * len(configs)
    for cfg, members in groups.items():
        out = apply_params(images, cfg, cat_params([params[i] for i in members]))
        for i, view in zip(members, out.split(images.shape[0])):
            views[i] = view
    return views  # type: ignore[return-value]


def normalize(x: torch.Tensor, config: AugmentConfig) -> torch.Tensor:
    """``x`` in [0, 1] into the config's input space (its mean/std; unchanged when it has none)."""
    if config.mean is None:
        return x
    mean = device_constant(tuple(config.mean), x.device, x.dtype)
    std = device_constant(tuple(config.std), x.device, x.dtype)
    return (x - mean) / std


def augment(images: torch.Tensor, config: AugmentConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """One randomly augmented, normalised view of a batch, on the batch's device."""
    params = sample_params(config, images.shape[0], images.shape[-2], images.shape[-1], generator)
    return apply_params(images, config, params)


class ViewGenerator:
    """``num_views`` independent augmentations of each image in a batch.

    ``config`` may be one recipe for all views or one per view (asymmetric recipes). The CPU
    generator makes the views reproducible from ``seed`` on any device.
    """

    def __init__(self, config: AugmentConfig | Sequence[AugmentConfig], num_views: int | None = 2,
                 *, seed: int | None = None, generator: torch.Generator | None = None) -> None:
        configs = [config] if isinstance(config, AugmentConfig) else list(config)
        if not configs:
            raise ValueError("at least one AugmentConfig is needed")
        if num_views is None:
            num_views = len(configs)
        if len(configs) == 1:
            configs = configs * num_views
        if len(configs) != num_views or num_views < 1:
            raise ValueError(f"got {len(configs)} configs for {num_views} views")
        self.configs = configs
        self.num_views = num_views
        if generator is None:
            generator = torch.Generator()
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
        self.generator = generator

    def __call__(self, images: torch.Tensor, *, batch_views: bool | None = None) -> list[torch.Tensor]:
        params = [sample_params(cfg, images.shape[0], images.shape[-2], images.shape[-1], self.generator)
                  for cfg in self.configs]
        return apply_views(images, self.configs, params, batch_views=batch_views)

    def __repr__(self) -> str:
        return f"ViewGenerator({', '.join(c.name for c in self.configs)})"
