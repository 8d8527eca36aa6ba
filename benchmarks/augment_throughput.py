"""Images/s of the batched tensor augmentations vs torchvision per-image PIL transforms.

Both pipelines make two SimCLR-CIFAR views (crop, flip, colour jitter, grayscale, normalise) of
32x32 uint8 images held in memory; the baseline is the usual DataLoader over PIL images with the
same number of workers. Prints images/s for each and the ratio.

    python benchmarks/augment_throughput.py --images 8192 --batch 512 --workers 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from cl_zoo.data.augment import AugmentConfig, ViewGenerator


class _PILTwoViews(Dataset):
    def __init__(self, images: np.ndarray, transform) -> None:
        self.images = images
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = Image.fromarray(self.images[i])
        return self.transform(img), self.transform(img)


def _torchvision_transform(cfg: AugmentConfig):
    return T.Compose([
        T.RandomResizedCrop(cfg.size, scale=cfg.scale, ratio=cfg.ratio),
        T.RandomHorizontalFlip(cfg.flip_p),
        T.RandomApply([T.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue)], p=cfg.jitter_p),
        T.RandomGrayscale(cfg.grayscale_p),
        T.ToTensor(),
        T.Normalize(cfg.mean, cfg.std),
    ])


def bench_torchvision(images: np.ndarray, cfg: AugmentConfig, batch: int, workers: int) -> float:
    loader = DataLoader(_PILTwoViews(images, _torchvision_transform(cfg)), batch_size=batch, shuffle=True,
                        num_workers=workers, drop_last=True, persistent_workers=False)
    start = time.perf_counter()
    n = 0
    for v1, _ in loader:
        n += v1.shape[0]
    return n / (time.perf_counter() - start)


def bench_batched(images: np.ndarray, cfg: AugmentConfig, batch: int, device: str, repeats: int = 1) -> float:
    data = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)
    views = ViewGenerator(cfg, 2, seed=0)
    views(data[:batch])  # warm-up (kernel selection, allocator)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    n = 0
    for _ in range(repeats):
        perm = torch.randperm(len(data), device=device)
        for i in range(0, len(data) - batch + 1, batch):
            v1, v2 = views(data[perm[i:i + batch]])
            n += v1.shape[0]
    if device == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers; also torch threads for the batched path")
    ap.add_argument("--size", type=int, default=32)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # Smooth random images (colour blobs) rather than noise, so colour ops see realistic values.
    low = rng.integers(0, 256, size=(args.images, 4, 4, 3), dtype=np.uint8)
    images = np.asarray(torch.nn.functional.interpolate(
        torch.from_numpy(low).permute(0, 3, 1, 2).float(), size=args.size, mode="bilinear", align_corners=False
    ).round().clamp(0, 255).byte().permute(0, 2, 3, 1))
    cfg = AugmentConfig.cifar(args.size)
    torch.set_num_threads(max(1, args.workers))
    tv = bench_torchvision(images, cfg, args.batch, args.workers)
    print(f"torchvision PIL per-image, DataLoader workers={args.workers}: {tv:,.0f} images/s (2 views each)")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        ours = bench_batched(images, cfg, args.batch, dev, repeats=1 if dev == "cpu" else 5)
        print(f"cl_zoo batched on {dev} (threads={torch.get_num_threads()}): {ours:,.0f} images/s "
              f"-> {ours / tv:.2f}x torchvision")


if __name__ == "__main__":
    main()
