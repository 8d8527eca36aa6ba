"""Training-loop throughput: cl-zoo's in-memory device pipeline vs a torchvision DataLoader baseline.

Both loops run the *same* training step (the method's forward and loss under autocast, backward,
optimizer step, momentum update) on the same images; only the input pipeline differs:

* ours: the dataset decoded once into a uint8 tensor on the device, batches gathered by index and
  augmented batched on the device (:mod:`cl_zoo.train.data`, exactly what ``cl-zoo pretrain`` runs);
* baseline: how peer libraries train on CIFAR: uint8 arrays in host memory, per-image PIL
  torchvision transforms (RandomResizedCrop, flip, ColorJitter, grayscale, ToTensor, Normalize) in
  DataLoader workers, then a host-to-device copy.

Prints images/s (and views/s: images x views) for both, their ratio, the step alone on one batch
already on the device (the ceiling no input pipeline can pass; each loop's share of it says whether
the pipeline or the step is the bottleneck), and the step's achieved TFLOP/s (FLOPs of one
forward+backward counted by ``torch.utils.flop_counter``) as a share of the host's matrix rate, a
bf16 and an fp32 GEMM timed in the same process (the step's own precision marked).

Then the full loop: ``cl-zoo pretrain``'s own :class:`~cl_zoo.train.loop.Trainer` on the same images
(written to a temporary folder), two epochs, with everything a real run does per step (lr schedule,
loss bookkeeping, logs, progress bar; no kNN monitor, no export), and its second epoch's images/s as a
share of the step-alone ceiling measured above in the same process. That share is the number issue 39
asks to raise (56% on an H100 before the host syncs left the step).

``--compare-precision`` instead trains the same steps twice from the same seed with the trainer's
in-memory pipeline, once in fp32 and once in ``auto`` (bf16 where the CPU has AMX or AVX512_BF16),
and prints the CPU, its bf16 units, views/s of both, their ratio and the loss after every step:

    # CPU, the issue-12 setting (Imagenette 64 px recipe, a few minutes on 2 cores):
    python benchmarks/pretrain_throughput.py --compare-precision

    # GPU, the issue's setting (ResNet-18 CIFAR stem, CIFAR-10, 2 views, batch 512):
    python benchmarks/pretrain_throughput.py --method dcl --data ../shared/datasets/cifar10-jpeg.tar.gz
    # CPU, small:
    python benchmarks/pretrain_throughput.py --device cpu --batch-size 32 --steps 3 --warmup 1 \
        --images 512 --set model_args.width=0.25 --workers 2
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from cl_zoo.data.augment import AugmentConfig, batches_views
from cl_zoo.methods import build_method_from_recipe
from cl_zoo.train.data import InMemoryBatches, augment_configs
from cl_zoo.train.optim import build_optimizer
from cl_zoo.train.recipe import Recipe, parse_overrides


class _PILViews(Dataset):
    """torchvision-CIFAR style: uint8 HWC arrays, PIL transforms per image and view."""

    def __init__(self, images: np.ndarray, transforms: list) -> None:
        self.images, self.transforms = images, transforms

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = Image.fromarray(self.images[i])
        return i, [t(img) for t in self.transforms]


def torchvision_transform(cfg: AugmentConfig):
    ops = [T.RandomResizedCrop(cfg.size, scale=cfg.scale, ratio=cfg.ratio), T.RandomHorizontalFlip(cfg.flip_p)]
    if cfg.jitter_p > 0:
        ops.append(T.RandomApply([T.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue)], p=cfg.jitter_p))
    if cfg.grayscale_p > 0:
        ops.append(T.RandomGrayscale(cfg.grayscale_p))
    if cfg.blur_p > 0:
        ops.append(T.RandomApply([T.GaussianBlur(cfg.kernel_size, cfg.blur_sigma)], p=cfg.blur_p))
    ops.append(T.ToTensor())
    if cfg.mean is not None:
        ops.append(T.Normalize(cfg.mean, cfg.std))
    return T.Compose(ops)


def load_images(args: argparse.Namespace, size: int) -> np.ndarray:
    """uint8 ``[N, 3, S, S]``: the real dataset via the trainer's decode, or smooth synthetic images."""
    if args.data:
        from cl_zoo.data.memory import decode_to_tensor
        from cl_zoo.train.loop import open_train_data

        data = open_train_data(args.data)
        paths = data.paths[: args.images] if args.images else data.paths
        key = data.file_list_hash if len(paths) == len(data.paths) else None
        return decode_to_tensor(paths, size, cache_key=key).numpy()
    rng = np.random.default_rng(0)
    n = args.images or 8192
    low = torch.from_numpy(rng.integers(0, 256, size=(n, 3, 4, 4), dtype=np.uint8)).float()
    return torch.nn.functional.interpolate(low, size=size, mode="bilinear", align_corners=False).round().byte().numpy()


def step_fn(method, optimizer, device: torch.device, amp: bool, dtype: torch.dtype):
    """The trainer's step: forward+loss under autocast, backward, optimizer, momentum update."""
    channels_last = device.type == "cuda" or (amp and dtype == torch.bfloat16)  # as Trainer._prepare_model

    def step(index: torch.Tensor, views: list[torch.Tensor], progress: float) -> torch.Tensor:
        if channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss, _ = method(views, index, progress)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        method.after_optimizer_step(progress)
        return loss

    return step


def timed(step, batches: Iterator, warmup: int, steps: int, device: torch.device) -> float:
    """Seconds for ``steps`` steps after ``warmup`` untimed ones (pipeline included)."""
    for i in range(warmup):
        index, views = next(batches)
        step(index, views, 0.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i in range(steps):
        index, views = next(batches)
        loss = step(index, views, 0.0)
    loss.item()  # wait for the last step
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def matrix_rate(device: torch.device, dtype: torch.dtype, repeats: int = 10) -> float:
    """The device's practical matrix rate in FLOP/s: a square GEMM big enough to saturate it, in ``dtype``.

    The step's achieved FLOP/s means little alone; as a share of what this host's matrix units really
    deliver (measured here, in this process and at this thread count) it says how much of the chip the
    step leaves unused. 2048 saturates a 2-core CPU's AVX512/AMX units; a GPU needs 8192.
    """
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def forever(make_epoch) -> Iterator:
    epoch = 0
    while True:
        yield from make_epoch(epoch)
        epoch += 1


def count_step_flops(method, views: list[torch.Tensor], index: torch.Tensor, amp: bool, dtype: torch.dtype) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autocast(views[0].device.type, dtype=dtype, enabled=amp):
            loss, _ = method(views, index, 0.0)
        loss.backward()
    method.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def compare_precisions(args: argparse.Namespace) -> None:
    """fp32 vs auto on the same images, seed and steps: views/s and the loss trajectory."""
    from cl_zoo.precision import cpu_capability, resolve_precision, why
    from cl_zoo.train.launch import resolve_device

    device = resolve_device(args.device)
    recipe = Recipe.load(args.recipe or "dcl_imagenette64_cpu")
    overrides = {"batch_size": args.batch_size if args.batch_size != 512 else None, "data.image_size": args.image_size,
                 **parse_overrides(args.sets)}
    recipe = recipe.with_overrides(overrides)
    size, batch = recipe.data.image_size, recipe.batch_size
    shared = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "imagenette128-train.tar.gz"
    if args.data is None and shared.is_file():
        args.data = str(shared)  # the recipe's own data when this checkout sits beside the shared datasets
    if args.images == 0:
        args.images = 4 * batch
    images = torch.from_numpy(load_images(args, size))
    auto = resolve_precision("auto", device, training=True)
    cap = cpu_capability()
    print(f"cpu: {cap.describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"auto resolves to {auto} for training on {device.type} ({why(auto, device, training=True)})")
    print(f"{recipe.method} {recipe.arch} {recipe.model_args or ''} {size}px batch {batch}, {len(images)} images, "
          f"{args.steps} timed steps after {args.warmup} warm-up, seed {recipe.seed}")
    results = {}
    for precision in ("fp32", auto) if auto != "fp32" else ("fp32", "bf16"):
        torch.manual_seed(recipe.seed)
        method = build_method_from_recipe(recipe).to(device)
        amp = precision != "fp32"
        if device.type == "cuda" or precision == "bf16":
            method.to(memory_format=torch.channels_last)
        configs = augment_configs(method.view_config.presets(), size)
        optimizer = build_optimizer(recipe, method.parameter_groups(recipe.optim.weight_decay))
        step = step_fn(method, optimizer, device, amp, torch.bfloat16)
        method.train()
        batches = forever(InMemoryBatches(images.to(device), configs, batch, 0, 1, recipe.seed).epoch)
        losses = []
        for _ in range(args.warmup):
            index, views = next(batches)
            losses.append(step(index, views, 0.0).item())
        start = time.perf_counter()
        for _ in range(args.steps):
            index, views = next(batches)
            losses.append(step(index, views, 0.0).item())
        seconds = time.perf_counter() - start
        vps = args.steps * batch * method.num_views / seconds
        results[precision] = (vps, losses)
        label = precision + (" (auto)" if precision == auto else "")
        print(f"{label:>12}: {vps:8.1f} views/s; loss after each step: {' '.join(f'{v:.4f}' for v in losses)}")
    (base, base_loss), (fast, fast_loss) = results["fp32"], results[[k for k in results if k != "fp32"][0]]
    other = [k for k in results if k != "fp32"][0]
    print(f"ratio {other}/fp32: {fast / base:.2f}x views/s; final loss fp32 {base_loss[-1]:.4f} vs {other} {fast_loss[-1]:.4f} "
          f"(max |diff| over steps {max(abs(a - b) for a, b in zip(base_loss, fast_loss)):.4f})")


def full_loop_rate(recipe: Recipe, images: np.ndarray, device: torch.device) -> tuple[float, int]:
    """images/s of the trainer's second epoch on ``images`` (and its steps per epoch).

    Why the Trainer itself and not a copy of its loop: the share of the ceiling is meant to say what a
    user's run gets, host syncs, logging and all. The first epoch pays one-off costs (cuDNN autotuning,
    compilation), so the second is the one reported.
    """
    import os
    import tempfile

    from cl_zoo.train.loop import Trainer

    with tempfile.TemporaryDirectory(prefix="cl-zoo-bench-") as tmp:
        folder = Path(tmp) / "images"
        folder.mkdir()
        for i, img in enumerate(images):
            Image.fromarray(np.ascontiguousarray(img.transpose(1, 2, 0))).save(folder / f"{i:06d}.png")
        run = recipe.with_overrides({"epochs": 2, "knn_every": 0, "checkpoint_every": 0})
        before = os.environ.get("CL_ZOO_CACHE")
        os.environ["CL_ZOO_CACHE"] = str(Path(tmp) / "cache")  # the decoded images stay in the temporary folder
        try:
            trainer = Trainer(run, folder, Path(tmp) / "run", device=device, progress=False, export=False)
            result = trainer.fit()
        finally:
            if before is None:
                os.environ.pop("CL_ZOO_CACHE", None)
            else:
                os.environ["CL_ZOO_CACHE"] = before
    return float(result.history[-1]["images_per_s"]), trainer.steps_per_epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", help="recipe YAML (default: recipes/<method>_cifar10.yaml if it exists)")
    ap.add_argument("--method", default="dcl")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--data", help="ImageFolder/archive (train split); default: synthetic images")
    ap.add_argument("--images", type=int, default=0, help="use the first N images (0: all / 8192 synthetic)")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workers", type=int, default=8, help="baseline DataLoader workers")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], default=None)
    ap.add_argument("--compare-precision", action="store_true",
                    help="fp32 vs auto on the CPU recipe (dcl_imagenette64_cpu unless --recipe): views/s and losses")
    ap.add_argument("--compile", action="store_true", help="torch.compile the backbone (both loops)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--no-full-loop", action="store_true", help="skip the Trainer's two-epoch full-loop measurement")
    args = ap.parse_args()
    if args.compare_precision:
        if args.steps == 30 and args.warmup == 5:  # the GPU defaults; a CPU comparison needs far fewer
            args.steps, args.warmup = 8, 2
        compare_precisions(args)
        return

    from cl_zoo.precision import resolve_precision
    from cl_zoo.train.launch import resolve_device
    from cl_zoo.train.recipe import RECIPES_DIR

    device = resolve_device(args.device)
    default_recipe = RECIPES_DIR / f"{args.method}_cifar10.yaml"
    recipe = Recipe.load(args.recipe) if args.recipe else (Recipe.load(default_recipe) if default_recipe.is_file() else Recipe(method=args.method))
    overrides = {"method": args.method, "arch": args.arch, "batch_size": args.batch_size,
                 "data.image_size": args.image_size, "precision": args.precision, "compile": args.compile or None,
                 **parse_overrides(args.sets)}
    recipe = recipe.with_overrides(overrides)
    size, batch = recipe.data.image_size, recipe.batch_size
    precision = resolve_precision(recipe.precision, device, training=True)
    amp = precision == "bf16" or (device.type == "cuda" and precision == "fp16")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if device.type == "cpu":
        torch.set_num_threads(max(1, args.workers))

    torch.manual_seed(recipe.seed)
    method = build_method_from_recipe(recipe).to(device)
    if device.type == "cuda" or (amp and dtype == torch.bfloat16):
        method.to(memory_format=torch.channels_last)
    if recipe.compile:
        method.backbone.compile()
    configs = augment_configs(method.view_config.presets(), size)
    images = load_images(args, size)
    if len(images) < batch:
        raise SystemExit(f"need at least one batch of images ({batch}), have {len(images)}")
    optimizer = build_optimizer(recipe, method.parameter_groups(recipe.optim.weight_decay))
    step = step_fn(method, optimizer, device, amp, dtype)
    method.train()

    # FLOPs of one step (forward + backward) at this batch.
    probe = InMemoryBatches(torch.from_numpy(images).to(device), configs, batch, 0, 1, recipe.seed)
    index, views = next(iter(probe.epoch(0)))
    flops = count_step_flops(method, views, index, amp, dtype)

    # The ceiling: the step alone, on one augmented batch already on the device (no input pipeline).
    # No pipeline can beat it, so the ratio below means something only next to each loop's share of it.
    step_time = timed(step, itertools.repeat((index, views)), args.warmup, args.steps, device)

    # Ours: uint8 tensor on the device, batched device augmentations.
    ours_time = timed(step, forever(probe.epoch), args.warmup, args.steps, device)
    # The same pipeline with the other choice of apply_views' batch_views (one call per view on a GPU, one
    # call per recipe on a CPU), so the device's default is measured against the alternative in this run.
    batched = batches_views(device)
    other = InMemoryBatches(probe.images, configs, batch, 0, 1, recipe.seed, batch_views=not batched)
    other_time = timed(step, forever(other.epoch), args.warmup, args.steps, device)

    # Baseline: torchvision PIL transforms in DataLoader workers, same step.
    hwc = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    loader = DataLoader(_PILViews(hwc, [torchvision_transform(c) for c in configs]), batch_size=batch, shuffle=True,
                        drop_last=True, num_workers=args.workers, pin_memory=device.type == "cuda",
                        persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers > 0 else None)

    def baseline_epoch(_epoch: int):
        for index, views in loader:
            yield index.to(device, non_blocking=True), [v.to(device, non_blocking=True) for v in views]

    base_time = timed(step, forever(baseline_epoch), args.warmup, args.steps, device)

    n_img = args.steps * batch
    ours_ips, base_ips = n_img / ours_time, n_img / base_time
    views_n = method.num_views
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"{recipe.method} {recipe.arch} {recipe.model_args or ''} {size}px batch {batch} x {views_n} views, "
          f"{precision if amp else 'fp32'}, {dev_name}, {args.steps} timed steps after {args.warmup} warm-up")
    print(f"baseline (torchvision PIL + DataLoader, {args.workers} workers): {base_ips:,.0f} images/s "
          f"({base_ips * views_n:,.0f} views/s)")
    print(f"cl-zoo (in-memory, device augmentations):   {ours_ips:,.0f} images/s ({ours_ips * views_n:,.0f} views/s)")
    print(f"ratio: {ours_ips / base_ips:.2f}x")
    other_ips = n_img / other_time
    mine, theirs = ("one call per recipe", "one call per view") if batched else ("one call per view", "one call per recipe")
    print(f"views {mine} (this device's default) vs {theirs}: {ours_ips:,.0f} vs {other_ips:,.0f} images/s, "
          f"{ours_ips / other_ips:.2f}x")
    step_ips = n_img / step_time
    print(f"step alone (one batch reused, no input pipeline): {step_ips:,.0f} images/s; ours reaches "
          f"{100 * ours_ips / step_ips:.0f}% of it, the baseline {100 * base_ips / step_ips:.0f}%")
    print(f"step FLOPs (fwd+bwd): {flops / 1e9:.1f} GFLOP -> achieved {flops * args.steps / ours_time / 1e12:.4g} TFLOP/s "
          f"(ours), {flops * args.steps / base_time / 1e12:.4g} TFLOP/s (baseline)")
    step_flops = flops * args.steps / step_time
    for name, gemm_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        rate = matrix_rate(device, gemm_dtype)
        mark = " (the step's precision)" if (name == "bf16") == (amp and dtype == torch.bfloat16) else ""
        print(f"matrix rate {name}{mark}: {rate / 1e12:.4g} TFLOP/s ({'8192' if device.type == 'cuda' else '2048'}^2 GEMM); "
              f"the step alone achieves {step_flops / 1e12:.4g} TFLOP/s = {100 * step_flops / rate:.0f}% of it")
    if not args.no_full_loop:
        loop_ips, loop_steps = full_loop_rate(recipe, images, device)
        print(f"full loop (cl-zoo pretrain's Trainer, epoch 2 of 2, {loop_steps} steps): {loop_ips:,.0f} images/s = "
              f"{100 * loop_ips / step_ips:.0f}% of the step alone")


if __name__ == "__main__":
    main()
