"""Batched augmentations against torchvision.transforms.v2 on identical parameters, plus statistics."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from cl_zoo.data.augment import (
    AugmentConfig,
    ViewGenerator,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    apply_params,
    apply_views,
    augment,
    gaussian_blur,
    grayscale,
    hsv_to_rgb,
    preset,
    resized_crop,
    rgb_to_hsv,
    sample_crop_boxes,
    sample_params,
    solarize,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _smooth(batch: int = 4, h: int = 40, w: int = 48) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    img = torch.stack([torch.sin(xx / 5) * 0.5 + 0.5, torch.cos(yy / 7) * 0.5 + 0.5, (xx + yy) / (h + w)])
    shifts = torch.linspace(0, 0.3, batch).view(-1, 1, 1, 1)
    return ((img.unsqueeze(0) * (1 - shifts) + shifts) * 255).round().to(torch.uint8)


def _rand(batch: int = 6, size: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("box", [(3, 5, 20, 30), (0, 0, 40, 48), (10, 2, 25, 25), (30, 40, 9, 7)])
@pytest.mark.parametrize("size", [16, 32, 64])
def test_resized_crop_matches_torchvision(box, size):
    x = _smooth().float() / 255
    ours = resized_crop(x, torch.tensor([box] * x.shape[0]), size)
    ref = torch.stack([TF.resized_crop(img, *box, [size, size], antialias=True) for img in x])
    diff = (ours - ref).abs()
    # Borders differ by design (roi_align reads the pixel just outside the box, interpolate clamps);
    # when upscaling, that first source pixel spans about size / (2 * box side) output pixels.
    m = math.ceil(0.5 * size / min(box[2:])) + 1
    assert diff.mean() < 4e-3 and diff[..., m:-m, m:-m].max() < 1e-2


def test_crop_box_sampling_follows_torchvision_rules():
    g = torch.Generator().manual_seed(0)
    boxes = sample_crop_boxes(4000, 40, 60, (0.08, 1.0), (3 / 4, 4 / 3), g)
    top, left, h, w = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 40).all() and (left + w <= 60).all()
    area = (h * w).double() / (40 * 60)
    assert area.min() >= 0.07 and area.max() <= 1.0
    ratio = (w / h).double()
    assert ratio.min() > 0.6 and ratio.max() < 1.6
    # Impossible requests use the fallback: the centred image clipped to the ratio range.
    fb = sample_crop_boxes(3, 10, 100, (0.99, 1.0), (1.0, 1.0), g)
    assert fb.tolist() == [[0, 45, 10, 10]] * 3
    # The draws come from our generator, so compare the distribution with torchvision's sampler.
    torch.manual_seed(0)
    img = torch.empty(3, 40, 60)
    tv = torch.tensor([v2.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)])
    tv_area = (tv[:, 2] * tv[:, 3]).double() / (40 * 60)
    assert abs(tv_area.mean() - area.mean()) < 0.02
    assert abs((tv[:, 3] / tv[:, 2]).double().log().mean() - ratio.log().mean()) < 0.02


@pytest.mark.parametrize(
    "ours, ref, factors",
    [
        (adjust_brightness, TF.adjust_brightness, [0.0, 0.3, 1.0, 1.4, 1.8, 0.6]),
        (adjust_contrast, TF.adjust_contrast, [0.0, 0.3, 1.0, 1.4, 1.8, 0.6]),
        (adjust_saturation, TF.adjust_saturation, [0.0, 0.3, 1.0, 1.4, 1.8, 0.6]),
        (adjust_hue, TF.adjust_hue, [-0.5, -0.2, 0.0, 0.05, 0.3, 0.5]),
    ],
)
def test_colour_ops_match_torchvision(ours, ref, factors):
    x = _rand()
    x[0, :, :3, :3] = 0.5  # gray pixels: hue undefined, saturation 0
    x[1, :, :2, :2] = 1.0
    # two channels tied for the largest: torchvision picks red, then green; the hue must not depend on it
    x[2, :, 0, 0] = torch.tensor([0.7, 0.7, 0.2])
    x[2, :, 0, 1] = torch.tensor([0.6, 0.1, 0.6])
    x[2, :, 0, 2] = torch.tensor([0.3, 0.9, 0.9])
    out = ours(x, torch.tensor(factors))
    expect = torch.stack([ref(img, f) for img, f in zip(x, factors)])
    torch.testing.assert_close(out, expect, atol=2e-6, rtol=0)


def test_hsv_round_trip_and_grayscale_solarize():
    x = _rand()
    torch.testing.assert_close(hsv_to_rgb(rgb_to_hsv(x)), x, atol=2e-6, rtol=0)
    torch.testing.assert_close(grayscale(x).expand_as(x), TF.rgb_to_grayscale(x, num_output_channels=3))
    torch.testing.assert_close(solarize(x, 0.4), TF.solarize(x, 0.4))


@pytest.mark.parametrize("kernel", [3, 9, 23])
def test_gaussian_blur_matches_torchvision(kernel):
    x = _rand(size=24)
    sigmas = [0.1, 0.5, 1.0, 1.5, 2.0, 3.0]
    out = gaussian_blur(x, torch.tensor(sigmas), kernel)
    expect = torch.stack([TF.gaussian_blur(img, [kernel, kernel], [s, s]) for img, s in zip(x, sigmas)])
    torch.testing.assert_close(out, expect, atol=2e-6, rtol=0)


def test_full_pipeline_matches_torchvision_sequence():
    """Every op with its sampled parameters, replayed per image through torchvision functional ops."""
    cfg = replace(AugmentConfig.simclr(24), solarize_p=0.5, blur_kernel=5)
    x = _smooth(8, 32, 32)
    params = sample_params(cfg, 8, 32, 32, torch.Generator().manual_seed(3))
    out = apply_params(x, cfg, params)
    names = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    for i in range(8):
        img = TF.resized_crop(x[i].float() / 255, *params.boxes[i].tolist(), [24, 24], antialias=True)
        if params.flip[i]:
            img = TF.horizontal_flip(img)
        if params.jitter[i]:
            for op in params.order[i].tolist():
                img = names[op](img, params.factors[i, op].item())
        if params.gray[i]:
            img = TF.rgb_to_grayscale(img, 3)
        if params.blur[i]:
            s = params.sigma[i].item()
            img = TF.gaussian_blur(img, [5, 5], [s, s])
        if params.solarize[i]:
            img = TF.solarize(img, 0.5)
        img = TF.normalize(img, list(cfg.mean), list(cfg.std))
        # Crop borders differ slightly (see test_resized_crop_matches_torchvision) and colour ops
        # can amplify that, so compare on average and away from the border.
        diff = (out[i] - img).abs()
        assert diff.mean() < 0.03 and diff[:, 2:-2, 2:-2].max() < 0.08, i


def test_random_rates_match_probabilities():
    cfg = replace(AugmentConfig.simclr(8), solarize_p=0.3)
    p = sample_params(cfg, 20_000, 16, 16, torch.Generator().manual_seed(0))
    for rate, expected in [(p.flip, 0.5), (p.jitter, 0.8), (p.gray, 0.2), (p.blur, 0.5), (p.solarize, 0.3)]:
        assert abs(rate.float().mean().item() - expected) < 0.015
    assert p.factors[:, 0].min() >= 0.2 - 1e-6 and p.factors[:, 0].max() <= 1.8 + 1e-6
    assert p.factors[:, 3].abs().max() <= 0.2 + 1e-6 and p.factors[:, 3].mean().abs() < 0.01
    # Random order: every permutation is a permutation, and each op leads about a quarter of the time.
    assert (p.order.sort(dim=1).values == torch.arange(4)).all()
    first = torch.bincount(p.order[:, 0], minlength=4).float() / 20_000
    assert (first - 0.25).abs().max() < 0.02
    fixed = sample_params(replace(cfg, jitter_order="fixed"), 5, 16, 16)
    assert (fixed.order == torch.arange(4)).all()


def test_flip_and_grayscale_visible_in_output():
    x = _smooth(4000, 8, 8)
    cfg = AugmentConfig(size=8, scale=(1.0, 1.0), ratio=(1.0, 1.0), jitter_p=0.0, grayscale_p=0.3, mean=None, std=None)
    out = augment(x, cfg, torch.Generator().manual_seed(1))
    src = x.float() / 255
    flipped = (out - src.flip(-1)).abs().amax(dim=(1, 2, 3)) < 1e-5
    kept = (out - src).abs().amax(dim=(1, 2, 3)) < 1e-5
    is_gray = (out[:, 0] == out[:, 1]).all(dim=(1, 2)) & (out[:, 1] == out[:, 2]).all(dim=(1, 2))
    assert abs((flipped & ~is_gray).float().mean().item() - 0.5 * 0.7) < 0.03
    assert abs((kept & ~is_gray).float().mean().item() - 0.5 * 0.7) < 0.03
    assert abs(is_gray.float().mean().item() - 0.3) < 0.03


def test_determinism_dtype_and_shapes():
    x = _smooth(6, 20, 20)
    a = ViewGenerator(AugmentConfig.mocov2(16), 2, seed=7)(x)
    b = ViewGenerator(AugmentConfig.mocov2(16), 2, seed=7)(x)
    c = ViewGenerator(AugmentConfig.mocov2(16), 2, seed=8)(x)
    assert len(a) == 2 and all(v.shape == (6, 3, 16, 16) and v.dtype == torch.float32 for v in a)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], c[0])
    # uint8 and the same images as float in [0, 1] give the same views.
    f = ViewGenerator(AugmentConfig.mocov2(16), 2, seed=7)(x.float() / 255)
    torch.testing.assert_close(f[0], a[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        augment(x[:, :1], AugmentConfig.cifar())
    with pytest.raises(TypeError):
        augment(x.to(torch.int32), AugmentConfig.cifar())


def test_presets():
    assert preset("cifar").size == 32 and preset("cifar").blur_p == 0
    simclr, dcl, moco = AugmentConfig.simclr(224), AugmentConfig.dcl(224), AugmentConfig.mocov2(224)
    assert (dcl.brightness, dcl.contrast, dcl.saturation, dcl.hue) == (0.8, 0.8, 0.8, 0.2) and dcl == simclr
    assert (moco.brightness, moco.hue, moco.scale) == (0.4, 0.1, (0.2, 1.0)) and moco.kernel_size == 23
    half = AugmentConfig.simclr(32, strength=0.5)
    assert math.isclose(half.brightness, 0.4) and math.isclose(half.hue, 0.1)
    cmc = AugmentConfig.cmc(32)
    assert not cmc.colour_ops and cmc.mean is None
    # CMC views keep the colours: every output pixel value occurs in the (flipped) crop's input range.
    x = _smooth(3, 32, 32)
    out = augment(x, replace(cmc, scale=(1.0, 1.0), ratio=(1.0, 1.0)), torch.Generator().manual_seed(0))
    assert out.min() >= 0 and out.max() <= 1
    assert torch.allclose(out.sort(dim=-1).values, (x.float() / 255).sort(dim=-1).values, atol=1e-6)
    with pytest.raises(KeyError):
        preset("byol")
    with pytest.raises(ValueError):
        AugmentConfig(size=32, scale=(0.5, 0.2))


def test_align_uniform_is_cacrs_algorithm_1():
    """CACR's CIFAR-10 augmentation (its CMC baseline's too), value for value with the paper's code listing."""
    from pathlib import Path

    a = preset("align_uniform")
    assert (a.size, a.scale, a.ratio, a.flip_p) == (32, (0.2, 1.0), (3 / 4, 4 / 3), 0.5)
    assert (a.jitter_p, a.brightness, a.contrast, a.saturation, a.hue, a.jitter_order) == (1.0, 0.4, 0.4, 0.4, 0.4, "random")
    assert (a.grayscale_p, a.blur_p, a.solarize_p) == (0.2, 0.0, 0.0)
    assert a.mean == (0.4914, 0.4822, 0.4465) and a.std == (0.2023, 0.1994, 0.2010)
    paper = Path(__file__).resolve().parents[2].parent / "shared" / "seeds" / "004_0b91e54b540b7465.txt"
    if not paper.is_file():
        pytest.skip(f"needs {paper} (the shared folder beside the project is absent) for the quote check")
    listing = [line.strip() for line in paper.read_text(encoding="utf-8").splitlines()[1564:1572]]
    assert listing == ["transforms.RandomResizedCrop(32, scale=(0.2, 1)),",
                       "transforms.RandomHorizontalFlip(),# by default p=0.5",
                       "transforms.ColorJitter(0.4, 0.4, 0.4, 0.4),",
                       "transforms.RandomGrayscale(p=0.2),",
                       "transforms.ToTensor(), # normalize to value in [0,1]",
                       "transforms.Normalize(",
                       "(0.4914, 0.4822, 0.4465),",
                       "(0.2023, 0.1994, 0.2010),"]


@pytest.mark.parametrize("device", DEVICES)
def test_device_follows_input(device):
    x = _smooth(5, 24, 24).to(device)
    views = ViewGenerator(AugmentConfig.simclr(16), 3, seed=0)(x)
    assert len(views) == 3 and all(v.device.type == device and v.shape == (5, 3, 16, 16) for v in views)
    if device == "cuda":  # same seed -> same augmentation on CPU and GPU
        cpu = ViewGenerator(AugmentConfig.simclr(16), 3, seed=0)(x.cpu())
        for u, v in zip(cpu, views):
            torch.testing.assert_close(v.cpu(), u, atol=1e-3, rtol=0)


class _HostSyncAudit(torch.overrides.TorchFunctionMode):
    """Records what would make the host wait for an accelerator: a tensor built on it from Python
    data or a blocking copy onto it (CUDA synchronises the stream for both)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (torch.tensor, torch.as_tensor) and torch.is_tensor(out) and out.device.type != "cpu":
            self.waits.append(f"torch.{func.__name__}(..., device={out.device})")
        elif func is torch.Tensor.to and args[0].device.type == "cpu" and torch.is_tensor(out) and out.device.type != "cpu":
            non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args[1:])
            if not non_blocking:
                self.waits.append(f"blocking copy of a CPU {tuple(args[0].shape)} tensor to {out.device}")
        return out


@pytest.mark.parametrize("name", ["cifar", "simclr", "mocov2", "cmc"])
def test_augmenting_on_an_accelerator_never_waits_for_it(name):
    """Host syncs in the augmentation (hue and blur subsets picked with ``nonzero`` on device masks,
    constants built with ``torch.tensor(device=...)``) held a DCL step on an H200 at 56-64% of the step
    alone; without them 74-80% (``pretrain_throughput.py``, 2026-11-26). The meta device stands in for
    CUDA: whatever reads device data back (``nonzero``, ``item``) cannot run there, and the audit catches
    blocking copies. The first call may make the cached constants; the second must make nothing wait."""
    images = torch.empty(8, 3, 40, 40, dtype=torch.uint8, device="meta")
    config = replace(preset(name, 32), solarize_p=0.5)
    views = ViewGenerator([config, replace(config, jitter_order="fixed")], seed=0)
    views(images)
    audit = _HostSyncAudit()
    with audit:
        out = views(images)
    assert [v.shape for v in out] == [(8, 3, 32, 32)] * 2 and out[0].device.type == "meta"
    assert audit.waits == []


@pytest.mark.parametrize("op", [adjust_brightness, adjust_contrast, adjust_saturation])
def test_a_factor_of_one_is_an_exact_identity(op):
    """The random-order jitter runs every cheap op at every step, with factor 1 for the samples not at
    that step: it must give back their pixels bit for bit, not within rounding."""
    x = _rand(8, 16)
    assert torch.equal(op(x, torch.ones(8)), x)


@pytest.mark.parametrize("name", ["cifar", "dcl", "mocov2", "cmc", "align_uniform"])
def test_views_in_one_call_are_the_views_one_at_a_time(name):
    """Batching a recipe's views (what a GPU run does) must not change a single value, so the augmentation
    is the same on every device; asymmetric recipes group only equal configs."""
    config = replace(preset(name, 24), solarize_p=0.3) if name != "cmc" else preset(name, 24)
    other = replace(config, jitter_order="fixed", flip_p=0.2)
    x = _smooth(6, 32, 40)
    for configs in ([config, config], [config, other, config]):
        one_call = ViewGenerator(configs, None, seed=5)(x, batch_views=True)
        separately = ViewGenerator(configs, None, seed=5)(x, batch_views=False)
        assert len(one_call) == len(configs)
        for a, b in zip(one_call, separately):
            assert a.shape == (6, 3, 24, 24) and torch.equal(a, b)


def test_crop_boxes_for_several_views_and_a_bad_count():
    x = _smooth(3, 20, 20).float() / 255
    boxes = torch.tensor([[0, 0, 20, 20], [2, 3, 10, 12], [5, 5, 8, 8], [1, 1, 9, 9], [0, 4, 16, 12], [3, 0, 17, 20]])
    both = resized_crop(x, boxes, 8)
    assert torch.equal(both, torch.cat([resized_crop(x, boxes[:3], 8), resized_crop(x, boxes[3:], 8)]))
    with pytest.raises(ValueError, match="4 crop boxes for 3 images"):
        resized_crop(x, boxes[:4], 8)
    with pytest.raises(ValueError, match="2 configs for 1 parameter sets"):
        apply_views(x, [AugmentConfig.cifar(8)] * 2, [sample_params(AugmentConfig.cifar(8), 3, 20, 20)])


class _DeviceKernels(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ops that write a tensor on the device (kernel launches and host-to-device copies)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device, self.kernels = device, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        if any(torch.is_tensor(t) and t.device.type == self.device for t in outs) and not func.is_view:
            self.kernels += 1
        return out


def test_two_cifar_views_take_few_device_kernels():
    """At 32 px a GPU finishes an augmentation kernel in microseconds, so what the loop pays for is the
    host launching them: two CIFAR views of 512 images took 434 launches and copies per step (a DCL step's
    forward, backward and foreach SGD take about 350), and an H200 ran the loop at 74-80% of the step
    alone. Batched views, a 21-kernel hue and a one-kernel blend bring them to 156; this keeps them there."""
    images = torch.empty(512, 3, 32, 32, dtype=torch.uint8, device="meta")
    views = ViewGenerator(preset("cifar", 32), 2, seed=0)
    views(images)  # the first call makes the cached device constants
    batched, one_by_one = _DeviceKernels("meta"), _DeviceKernels("meta")
    with batched:
        views(images)
    with one_by_one:
        views(images, batch_views=False)
    assert batched.kernels <= 160, batched.kernels
    assert one_by_one.kernels >= 2 * batched.kernels - 10  # the second view is nearly free in one call
