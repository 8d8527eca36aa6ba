"""Training batches: the in-memory GPU pipeline and the streaming DataLoader path.

Both paths share one sampling rule, so a run's image order does not depend on which path or how
many processes feed it:

* every epoch draws one permutation of the dataset from a CPU generator seeded with
  ``(seed, epoch)``; step ``i`` takes the global batch ``perm[i*B:(i+1)*B]`` (incomplete last batch
  dropped, so every rank always sees the same shapes) and rank ``r`` keeps its ``B / world`` rows;
* augmentation parameters are drawn for the *global* batch from a second ``(seed, epoch)``
  generator (cheap: a few numbers per image, on the CPU) and each rank applies its rows.

Two processes with batch ``B/2`` therefore see exactly the views one process with batch ``B``
sees, and a run resumed at an epoch boundary replays the uninterrupted run's views. A run resumed
mid-epoch (``epoch(e, start_step=k)``) skips the first ``k`` batches without decoding them and
consumes their augmentation draws, so its step ``k`` gets the uninterrupted run's views too.

In memory (CIFAR, Imagenette at 128 px): the dataset is decoded once into ``uint8 [N, 3, S, S]`` and
moved to the device; a step is an index gather plus batched augmentations, with no per-image
Python. Streaming (ImageNet-sized folders): DataLoader workers decode each image to ``S x S``
(shorter side resized, centre crop: the same as the in-memory decode) and the device augments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from cl_zoo.data.augment import (PRESETS, AugmentConfig, apply_views, normalize, preset, sample_params, slice_params,
                                 to_device)
from cl_zoo.data.memory import decode_square
from cl_zoo.data.workers import usable_cpus
from cl_zoo.errors import ClZooError


def epoch_seed(seed: int, epoch: int, stream: str) -> int:
    """A 63-bit seed for one epoch and purpose, independent of world size and rank."""
    digest = hashlib.sha256(f"{seed}:{epoch}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def augment_configs(presets: Sequence[str], size: int) -> list[AugmentConfig]:
    """One AugmentConfig per view from preset names (one-line error for an unknown name)."""
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise ClZooError(f"unknown augmentation preset {unknown[0]!r}; presets: {', '.join(sorted(PRESETS))}")
    return [preset(name, size) for name in presets]


@dataclass
class EpochPlan:
    """The sampling rule above for one epoch."""

    num_images: int
    global_batch: int
    rank: int
    world_size: int
    seed: int
    epoch: int

    def __post_init__(self) -> None:
        if self.global_batch % self.world_size:
            raise ClZooError(f"batch size {self.global_batch} is not divisible by the {self.world_size} processes")
        gen = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch, "order"))
        self.order = torch.randperm(self.num_images, generator=gen)
        self.local_batch = self.global_batch // self.world_size

    @property
    def steps(self) -> int:
        return self.num_images // self.global_batch

    def local_indices(self, step: int) -> torch.Tensor:
        start = step * self.global_batch + self.rank * self.local_batch
        return self.order[start : start + self.local_batch]


class ViewMaker:
    """Draws global-batch augmentation parameters and applies this rank's rows on the device."""

    def __init__(self, configs: Sequence[AugmentConfig], plan: EpochPlan, batch_views: bool | None = None) -> None:
        self.configs = list(configs)
        self.plan = plan
        self.batch_views = batch_views  # None: apply_views' choice for the device (one call per recipe on a GPU)
        self.generator = torch.Generator().manual_seed(epoch_seed(plan.seed, plan.epoch, "augment"))

    def skip(self, images_hw: tuple[int, int]) -> None:
        """Consume one step's random draws without augmenting (fast-forward)."""
        for cfg in self.configs:
            sample_params(cfg, self.plan.global_batch, *images_hw, self.generator)

    def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
        start = self.plan.rank * self.plan.local_batch
        params = [slice_params(sample_params(cfg, self.plan.global_batch, images.shape[-2], images.shape[-1],
                                             self.generator), start, start + images.shape[0])
                  for cfg in self.configs]
        return apply_views(images, self.configs, params, batch_views=self.batch_views)


class InMemoryBatches:
    """Batches from a uint8 tensor that already lives on the training device."""

    def __init__(self, images: torch.Tensor, configs: Sequence[AugmentConfig], global_batch: int,
                 rank: int, world_size: int, seed: int, *, batch_views: bool | None = None) -> None:
        self.images = images
        self.configs = list(configs)
        self.global_batch, self.rank, self.world_size, self.seed = global_batch, rank, world_size, seed
        self.batch_views = batch_views

    def __len__(self) -> int:
        return len(self.images) // self.global_batch

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Yield ``(global indices [b] on the device, views)`` for every step of ``epoch`` from ``start_step``."""
        plan = EpochPlan(len(self.images), self.global_batch, self.rank, self.world_size, self.seed, epoch)
        maker = ViewMaker(self.configs, plan, self.batch_views)
        for _ in range(start_step):
            maker.skip(tuple(self.images.shape[-2:]))
        for step in range(start_step, plan.steps):
            index = to_device(plan.local_indices(step), self.images.device)
            yield index, maker(self.images.index_select(0, index))


class _DecodeDataset(Dataset):
    def __init__(self, paths: Sequence[str], size: int) -> None:
        self.paths, self.size = list(paths), size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.from_numpy(decode_square(self.paths[i], self.size).copy())


class _PlanSampler(Sampler[list[int]]):
    def __init__(self, plan: EpochPlan, start_step: int = 0) -> None:
        self.plan, self.start_step = plan, start_step

    def __len__(self) -> int:
        return self.plan.steps - self.start_step

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.plan.steps):
            yield self.plan.local_indices(step).tolist()


class StreamingBatches:
    """Batches decoded by DataLoader workers, augmented on the device."""

    def __init__(self, paths: Sequence[str], size: int, configs: Sequence[AugmentConfig], global_batch: int,
                 rank: int, world_size: int, seed: int, device: torch.device, workers: int) -> None:
        self.paths, self.size, self.configs = list(paths), size, list(configs)
        self.global_batch, self.rank, self.world_size, self.seed = global_batch, rank, world_size, seed
        # More decoding processes than usable CPUs only contend (and make DataLoader warn that it
        # may freeze): the recipe's default of 8 is capped on small machines. Batches do not depend
        # on the worker count, so results are unchanged.
        self.device, self.workers = device, min(workers, usable_cpus())

    def __len__(self) -> int:
        return len(self.paths) // self.global_batch

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
        plan = EpochPlan(len(self.paths), self.global_batch, self.rank, self.world_size, self.seed, epoch)
        maker = ViewMaker(self.configs, plan)
        for _ in range(start_step):
            maker.skip((self.size, self.size))
        loader = DataLoader(
            _DecodeDataset(self.paths, self.size),
            batch_sampler=_PlanSampler(plan, start_step),
            num_workers=self.workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=False,
            prefetch_factor=4 if self.workers > 0 else None,
        )
        for index, images in loader:
            images = images.to(self.device, non_blocking=True)
            yield index.to(self.device, non_blocking=True), maker(images)


def normalize_for(config: AugmentConfig, images: torch.Tensor) -> torch.Tensor:
    """Un-augmented uint8 images in the views' input space (same mean/std) for the kNN monitor."""
    return normalize(images.float().div_(255.0), config)


def holdout_split(num_images: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train, held-out) index split for the kNN monitor when no ``--val`` data is given."""
    gen = np.random.default_rng(epoch_seed(seed, -1, "holdout"))
    order = gen.permutation(num_images)
    n_hold = max(1, int(round(num_images * fraction)))
    return np.sort(order[n_hold:]), np.sort(order[:n_hold])
