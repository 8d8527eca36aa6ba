"""Controlled A/B of ``cl-zoo pretrain`` against lightly's own CIFAR-10 DCL pipeline (issue 39, item 1).

Why: on a GPU our DCL CIFAR-10 recipe reached kNN 77.3% where lightly's benchmark publishes 84.0%. This
trains both pipelines on the same CIFAR-10 subset, from the same seeds, and scores both with the same
kNN (cl-zoo's weighted kNN, k=200, T=0.1, cosine, on fixed train/test subsets) after every epoch, so a
gap can be pinned on one factor at a time.

Sides and factors (``--side`` / ``--factor``):

* ``lightly`` / ``reference``: lightly's code, written as its ``cifar10_benchmark.py`` (v1.5.26) writes
  its ``DCL`` class: ``ResNetGenerator("resnet-18")`` without its classifier (``children()[:-1]``, which
  also drops the stem's ReLU), ``SimCLRProjectionHead(512, 512, 128)``, ``DCLLoss()``, each view
  forwarded on its own, ``SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0)`` in a
  torch DataLoader, ``SGD(self.parameters(), lr=6e-2 * lr_factor, momentum=0.9, weight_decay=5e-4)``
  with ``lr_factor = batch_size / 128`` and ``CosineAnnealingLR(optim, max_epochs)`` stepped per epoch.
  Lightning's Trainer is replaced by the plain loop it runs (fp32, no clipping, no accumulation).
* ``ours`` / ``baseline``: ``recipes/dcl_cifar10.yaml`` (which now carries lightly's values) through
  :class:`cl_zoo.train.loop.Trainer`, the object ``cl-zoo pretrain`` runs, in fp32. Each other factor
  changes exactly one thing of that baseline:

  ==================  ==================================================================================
  ``old_lr``          peak lr 0.06 x batch/256 (the recipe before issue 39) instead of 0.06 x batch/128
  ``warmup``          a linear warm-up of 10/200 of the run (the old recipe's 10 of 200 epochs)
  ``old_recipe``      both of the above: the recipe as it was before issue 39
  ``wd_groups``       no weight decay on BN weights and biases (``no_decay_norm_bias``)
  ``aug_lightly``     lightly's ``SimCLRTransform`` (PIL, torchvision, ImageNet normalisation) instead of
                      cl-zoo's batched tensor augmentations
  ``backbone_lightly`` lightly's ``ResNetGenerator`` backbone (no stem ReLU, PyTorch default init)
  ``head_lightly``    lightly's ``SimCLRProjectionHead`` (affine last BN) instead of cl-zoo's
  ``per_view``        each view through backbone and head on its own (BatchNorm statistics per view, as
                      lightly) instead of both views in one concatenated batch
  ``loss_lightly``    lightly's ``DCLLoss`` instead of cl-zoo's ``dcl``
  ``bf16``            bf16 autocast, the precision the recipe's ``auto`` resolves to on a GPU (and on AMX
                      CPUs), instead of the A/B's fp32: lightly's benchmark trains in fp32 (its
                      ``pl.Trainer(...)`` at L969-978 sets no ``precision``: Lightning's 32-bit default).
                      The backbone runs in bf16 and the projection head in fp32, as cl-zoo trains
  ``bf16_head_autocast`` bf16 with the projection head under autocast too, as cl-zoo trained before
                      issue 39's A/B found that this rounding of the loss's input costs kNN points
  ==================  ==================================================================================

Each run appends one JSON line to ``--results`` (side, factor, seed, sizes, kNN top-1 and loss per
epoch, seconds per epoch, wall time, versions); ``--table`` prints mean ± sd over seeds per factor:

    python benchmarks/lightly_ab.py --side lightly --seed 0 --epochs 20        # one run
    python benchmarks/lightly_ab.py --side ours --factor warmup --seed 0 --epochs 20
    python benchmarks/lightly_ab.py --table                                    # the table
    scripts/lightly_ab_queue.sh start                                          # every run, detached

Data: the first ``--train-per-class`` / ``--test-per-class`` images of each class (sorted file names) of
``../shared/datasets/cifar10-jpeg.tar.gz`` (CIFAR-10 re-encoded as JPEG), unpacked once under
``.data/lightly_ab/``. Needs ``pip install lightly`` (not a cl-zoo extra: a benchmark-only dependency).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARCHIVE = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
DEFAULT_DATA = ROOT / ".data" / "lightly_ab"
DEFAULT_RESULTS = ROOT / "runs" / "lightly_ab" / "results.jsonl"
RECIPE = "dcl_cifar10"
KNN_K = 200  # lightly cifar10_benchmark.py (v1.5.26) L105: "knn_k = 200"
KNN_T = 0.1  # lightly cifar10_benchmark.py (v1.5.26) L106: "knn_t = 0.1"
IMAGENET_NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # lightly.transforms.utils.IMAGENET_NORMALIZE
OURS_FACTORS = ("baseline", "old_lr", "warmup", "old_recipe", "wd_groups", "aug_lightly", "backbone_lightly",
                "head_lightly", "per_view", "loss_lightly", "bf16", "bf16_head_autocast")
LIGHTLY_FACTORS = ("reference",)


class ABError(Exception):
    """A usage mistake: printed as one ``error:`` line."""


# ---------------------------------------------------------------------------------------------- data
def prepare_subset(archive: Path, root: Path, train_per_class: int, test_per_class: int) -> Path:
    """Unpack the first N images per class of each split (sorted names) once; return the subset folder."""
    target = root / f"cifar10_{train_per_class}_{test_per_class}"
    done = target / ".complete"
    if done.is_file():
        return target
    if not archive.is_file():
        raise ABError(f"CIFAR-10 archive not found: {archive} (see ../shared/datasets/README.md)")
    quota = {"train": train_per_class, "test": test_per_class}
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".jpg")), key=lambda m: m.name)
        taken: dict[tuple[str, str], int] = {}
        for m in members:
            parts = Path(m.name).parts
            if len(parts) != 3 or parts[0] not in quota:
                continue
            key = (parts[0], parts[1])
            if taken.get(key, 0) >= quota[parts[0]]:
                continue
            taken[key] = taken.get(key, 0) + 1
            out = target / m.name
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            out.write_bytes(src.read())
    done.write_text("ok\n")
    return target


def load_split(folder: Path) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """(paths, uint8 images [N,3,32,32], labels) in cl-zoo's folder order: the kNN sets of both sides."""
    from cl_zoo.data.memory import decode_to_tensor
    from cl_zoo.train.loop import open_train_data

    data = open_train_data(str(folder))
    images = decode_to_tensor(list(data.paths), 32, 2, use_cache=False, progress=False)
    return list(data.paths), images, torch.as_tensor(np.asarray(data.labels), dtype=torch.long)


# ---------------------------------------------------------------------------------------------- kNN
@torch.no_grad()
def knn_top1(features: Callable[[torch.Tensor], torch.Tensor], mean: Sequence[float], std: Sequence[float],
             bank: tuple[torch.Tensor, torch.Tensor], queries: tuple[torch.Tensor, torch.Tensor]) -> float:
    """cl-zoo's weighted kNN (k=200, T=0.1, cosine) of ``features`` on uint8 images normalised by mean/std."""
    from cl_zoo.eval.knn import knn_classify

    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)

    def embed(images: torch.Tensor) -> np.ndarray:
        out = [features((images[i:i + 256].float() / 255.0 - m) / s).float() for i in range(0, len(images), 256)]
        return torch.cat(out).numpy()

    k = min(KNN_K, len(bank[1]))
    result = knn_classify(embed(bank[0]), bank[1].numpy(), embed(queries[0]), queries[1].numpy(), ks=(k,),
                          temperature=KNN_T, use_gpu=False)
    return float(result["metrics"][f"knn_k{k}_top1"])


# ---------------------------------------------------------------------------------------------- lightly's parts
def feature_width(width: float) -> int:
    """The pooled feature width of both sides' ResNet-18 at ``width`` (512 at 1.0)."""
    return int(64 * width) * 8


def lightly_backbone(width: float = 1.0) -> nn.Sequential:
    """lightly cifar10_benchmark.py L760-763: ``ResNetGenerator("resnet-18")`` minus its classifier."""
    from lightly.models import ResNetGenerator

    resnet = ResNetGenerator("resnet-18", width=width)
    return nn.Sequential(*list(resnet.children())[:-1], nn.AdaptiveAvgPool2d(1))


class LightlyBackboneAdapter(nn.Module):
    """lightly's backbone with the two attributes cl-zoo's methods and trainer read."""

    def __init__(self, width: float = 1.0) -> None:
        super().__init__()
        self.net = lightly_backbone(width)
        self.num_features = feature_width(width)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).flatten(start_dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


def lightly_transform() -> Any:
    """lightly cifar10_benchmark.py L174-178."""
    from lightly.transforms import SimCLRTransform

    return SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0)


class _TwoViews(torch.utils.data.Dataset):
    """The subset's images as PIL, each returned as lightly's two views plus its index."""

    def __init__(self, paths: Sequence[str], transform: Any) -> None:
        self.paths, self.transform = list(paths), transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[list[torch.Tensor], int]:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return self.transform(im.convert("RGB")), i


def lightly_loader(paths: Sequence[str], batch_size: int, workers: int, generator: torch.Generator) -> torch.utils.data.DataLoader:
    """lightly cifar10_benchmark.py L265-271: shuffle, drop_last, lightly's transform in the workers."""
    return torch.utils.data.DataLoader(_TwoViews(paths, lightly_transform()), batch_size=batch_size, shuffle=True,
                                       drop_last=True, num_workers=workers, generator=generator,
                                       persistent_workers=workers > 0)


# ---------------------------------------------------------------------------------------------- side (a): lightly
class LightlyDCL(nn.Module):
    """lightly cifar10_benchmark.py's ``DCL`` (L756-785) without Lightning's base class."""

    def __init__(self, width: float = 1.0) -> None:
        super().__init__()
        from lightly.loss import DCLLoss
        from lightly.models.modules import heads

        self.backbone = lightly_backbone(width)
        f = feature_width(width)
        self.projection_head = heads.SimCLRProjectionHead(f, f, 128)  # (512, 512, 128) at width 1
        self.criterion = DCLLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.backbone(x).flatten(start_dim=1)
        return self.projection_head(x)

    def training_step(self, batch: tuple[list[torch.Tensor], Any]) -> torch.Tensor:
        (x0, x1), _ = batch
        z0 = self.forward(x0)
        z1 = self.forward(x1)
        return self.criterion(z0, z1)

    def configure_optimizers(self, batch_size: int, max_epochs: int) -> tuple[torch.optim.Optimizer, Any]:
        lr_factor = batch_size / 128  # L126
        optim = torch.optim.SGD(self.parameters(), lr=6e-2 * lr_factor, momentum=0.9, weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, max_epochs)
        return optim, scheduler


def run_lightly(args: argparse.Namespace, data: Path, bank: tuple, queries: tuple, train_paths: list[str]) -> dict[str, Any]:
    from pytorch_lightning import seed_everything

    seed_everything(args.seed, verbose=False)  # lightly L947: pl.seed_everything(seed)
    model = LightlyDCL(args.width)
    optim, scheduler = model.configure_optimizers(args.batch_size, args.epochs)
    loader = lightly_loader(train_paths, args.batch_size, args.workers, torch.Generator().manual_seed(args.seed))
    rows = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        losses = []
        for batch in loader:
            loss = model.training_step(batch)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            losses.append(float(loss.detach()))
        scheduler.step()  # Lightning steps an epoch-interval scheduler after each training epoch
        seconds = time.perf_counter() - t0
        model.eval()
        top1 = knn_top1(lambda x: model.backbone(x).flatten(start_dim=1), *IMAGENET_NORMALIZE, bank, queries)
        rows.append({"epoch": epoch + 1, "loss": statistics.fmean(losses), "knn_top1": top1, "epoch_time_s": seconds})
        _progress(args, rows[-1])
    return {"rows": rows, "steps_per_epoch": len(loader)}


# ---------------------------------------------------------------------------------------------- side (b): ours
def ours_recipe(args: argparse.Namespace) -> Any:
    """The recipe ``cl-zoo pretrain --recipe dcl_cifar10`` runs, sized for the A/B, with the factor's one change."""
    from cl_zoo.train.recipe import Recipe

    base = Recipe.load(RECIPE)
    overrides: dict[str, Any] = {"epochs": args.epochs, "batch_size": args.batch_size, "seed": args.seed,
                                 "precision": "fp32", "knn_every": 1, "workers": max(1, args.workers)}
    if args.factor in ("old_lr", "old_recipe"):
        overrides["optim.base_batch"] = 256  # the recipe before issue 39: "0.06 x batch/256"
    if args.factor in ("warmup", "old_recipe"):
        overrides["schedule.warmup_epochs"] = round(10 / 200 * args.epochs, 4)  # the old 10 of 200 epochs, in proportion
    if args.width != 1.0:  # both sides narrower alike: stages, stem and the head's hidden layer (= feature width)
        overrides["model_args"] = {"width": args.width, "stem_width": int(64 * args.width)}
        overrides["method_args.head_hidden_dim"] = feature_width(args.width)
    if args.factor == "wd_groups":
        overrides["method_args.no_decay_norm_bias"] = True
    if args.factor in ("bf16", "bf16_head_autocast"):
        overrides["precision"] = "bf16"  # what the first GPU run (77.3%) trained in: "precision: auto" -> bf16 on CUDA
    return base.with_overrides(overrides, source="lightly_ab")


def _per_view_step(self: Any, views: list[torch.Tensor], index: torch.Tensor, epoch_progress: float) -> tuple[torch.Tensor, dict]:
    """lightly's step on cl-zoo's method: each view through backbone and head alone (BN statistics per view)."""
    self.check_views(views)
    z1 = self.head(self.backbone.forward_features(views[0]))
    z2 = self.head(self.backbone.forward_features(views[1]))
    loss = self.pair_loss(z1, z2)
    with torch.no_grad():
        pos = F.cosine_similarity(z1.float(), z2.float(), dim=1).mean()
    return loss, self.logs(loss=loss, pos_sim=pos)


class AutocastHead(nn.Module):
    """cl-zoo's projection head with its layers under the step's autocast (bf16 output), as before
    ``ProjectionHead.forward`` left autocast."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.net(x)


class LightlyTransformBatches:
    """The trainer's batch source (``__len__``, ``epoch``) fed by lightly's PIL transform instead of ours."""

    def __init__(self, paths: Sequence[str], batch_size: int, workers: int, seed: int) -> None:
        self.paths, self.batch_size, self.workers, self.seed = list(paths), batch_size, workers, seed

    def __len__(self) -> int:
        return len(self.paths) // self.batch_size

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
        generator = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        loader = torch.utils.data.DataLoader(_TwoViews(self.paths, lightly_transform()), batch_size=self.batch_size,
                                             shuffle=True, drop_last=True, num_workers=self.workers, generator=generator)
        for step, (views, index) in enumerate(loader):
            if step >= start_step:
                yield index, list(views)


def run_ours(args: argparse.Namespace, data: Path, bank: tuple, queries: tuple, train_paths: list[str],
             run_dir: Path) -> dict[str, Any]:
    from cl_zoo.train.loop import Trainer

    recipe = ours_recipe(args)
    factor = args.factor
    rows: list[dict[str, Any]] = []
    mean_std: list[Sequence[float]] = []

    class ABTrainer(Trainer):
        """The pretrain Trainer with the factor's component swapped in before the optimizer is built."""

        def _prepare_model(self) -> None:
            method = self.method
            if factor == "backbone_lightly":
                method.backbone = LightlyBackboneAdapter(args.width)
            if factor == "head_lightly":
                from lightly.models.modules import heads

                f = feature_width(args.width)
                method.head = heads.SimCLRProjectionHead(f, f, 128)
            if factor == "bf16_head_autocast":
                method.head = AutocastHead(method.head)
            if factor == "per_view":
                method.training_step = types.MethodType(_per_view_step, method)
            if factor == "loss_lightly":
                from lightly.loss import DCLLoss

                method.lightly_loss = DCLLoss(temperature=method.temperature)
                method.pair_loss = types.MethodType(lambda self, z1, z2: self.lightly_loss(z1, z2), method)
            super()._prepare_model()

        def _build_batches(self) -> None:
            super()._build_batches()
            if factor == "aug_lightly":
                self.batches = LightlyTransformBatches(train_paths, recipe.batch_size, args.workers, args.seed)

        def run_monitor(self) -> dict[str, float]:
            if factor == "aug_lightly":
                mean, std = IMAGENET_NORMALIZE
            else:
                mean, std = self.view_configs[0].mean, self.view_configs[0].std
            mean_std[:] = [mean, std]
            was = self.method.training
            self.method.eval()
            try:
                top1 = knn_top1(self.method.backbone.forward_features, mean, std, bank, queries)
            finally:
                self.method.train(was)
            return {f"knn_k{KNN_K}_top1": top1}

    torch.manual_seed(args.seed)
    trainer = ABTrainer(recipe, str(data / "train"), run_dir, val=str(data / "test"), device="cpu", progress=False,
                        export=False, stream=False)
    result = trainer.fit()
    for h in result.history:
        rows.append({"epoch": h["epoch"], "loss": h["loss"], "knn_top1": h.get(f"knn_k{KNN_K}_top1"),
                     "epoch_time_s": h["epoch_time_s"]})
        _progress(args, rows[-1])
    return {"rows": rows, "steps_per_epoch": trainer.steps_per_epoch, "recipe": recipe.to_dict()}


# ---------------------------------------------------------------------------------------------- runs and table
def _progress(args: argparse.Namespace, row: dict[str, Any]) -> None:
    print(f"{args.side}/{args.factor} seed {args.seed} epoch {row['epoch']}/{args.epochs}: loss {row['loss']:.4f} "
          f"kNN {row['knn_top1']:.4f} ({row['epoch_time_s']:.1f} s)", flush=True)


def run_key(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two result lines the same run (the queue skips a run whose key is already there)."""
    return {"side": args.side, "factor": args.factor, "seed": args.seed, "epochs": args.epochs,
            "batch_size": args.batch_size, "width": args.width, "train_per_class": args.train_per_class,
            "test_per_class": args.test_per_class}


def read_results(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill: that run is simply redone
    return rows


def already_done(path: Path, key: dict[str, Any]) -> bool:
    return any(all(r.get(k) == v for k, v in key.items()) for r in read_results(path))


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    data = prepare_subset(Path(args.archive), Path(args.data), args.train_per_class, args.test_per_class)
    train_paths, train_images, train_labels = load_split(data / "train")
    _, test_images, test_labels = load_split(data / "test")
    bank, queries = (train_images, train_labels), (test_images, test_labels)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.side == "lightly":
        out = run_lightly(args, data, bank, queries, train_paths)
    else:
        # A scratch run folder: nothing is exported, and a run cut short starts over rather than resuming
        with tempfile.TemporaryDirectory(prefix="lightly_ab_") as run_dir:
            out = run_ours(args, data, bank, queries, train_paths, Path(run_dir) / "run")
    import lightly

    import cl_zoo
    from cl_zoo.precision import cpu_capability

    rows = out.pop("rows")
    record = {**run_key(args),
              "knn": {"k": min(KNN_K, len(train_labels)), "t": KNN_T, "train_images": len(train_labels), "test_images": len(test_labels)},
              "knn_top1": [r["knn_top1"] for r in rows], "loss": [r["loss"] for r in rows],
              "epoch_time_s": [r["epoch_time_s"] for r in rows], "wall_s": time.perf_counter() - start,
              **out, "threads": args.threads, "workers": args.workers, "torch": torch.__version__,
              "lightly": lightly.__version__, "cpu": platform.processor() or platform.machine(),
              # fp32 kernels differ between AVX2, AVX512 and AMX hosts: a seed's numbers are only comparable on one kind
              "host": cpu_capability().describe(),
              # an editable install imports its own checkout, not the tree this script sits in: say which code ran
              "cl_zoo": str(Path(cl_zoo.__file__).resolve().parent)}
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{100 * statistics.fmean(values):.2f} ± {100 * sd:.2f}" if not math.isnan(sd) else f"{100 * values[0]:.2f}"


def table(path: Path) -> str:
    """Mean ± sd over seeds per (side, factor, size): last-epoch and best-epoch kNN top-1, seconds per epoch."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in read_results(path):
        key = (r["epochs"], r["batch_size"], r["train_per_class"], r["test_per_class"], r.get("width", 1.0), r["side"],
               r["factor"])
        groups.setdefault(key, []).append(r)
    if not groups:
        return f"no results in {path}"
    lines = [f"kNN k={KNN_K} T={KNN_T} top-1 (%), mean ± sd over seeds; CIFAR-10 JPEG subset; {path}",
             "| epochs | batch | train/test per class | width | side | factor | seeds | last epoch | best epoch | s/epoch | vs ours baseline (last) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(groups):
        runs = groups[key]
        last = [r["knn_top1"][-1] for r in runs]
        best = [max(r["knn_top1"]) for r in runs]
        secs = statistics.fmean(s for r in runs for s in r["epoch_time_s"])
        base = groups.get((*key[:5], "ours", "baseline"))
        delta = "-"
        if base and key[5:] != ("ours", "baseline"):
            delta = f"{100 * (statistics.fmean(last) - statistics.fmean(r['knn_top1'][-1] for r in base)):+.2f}"
        seeds = ",".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"]))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]}/{key[3]} | {key[4]:g} | {key[5]} | {key[6]} | {seeds} | {_mean_sd(last)} | "
                     f"{_mean_sd(best)} | {secs:.1f} | {delta} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=("lightly", "ours"), default="ours")
    p.add_argument("--factor", default=None, help=f"ours: {', '.join(OURS_FACTORS)}; lightly: reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--train-per-class", type=int, default=500, help="train images per class (500: 5,000 in all)")
    p.add_argument("--test-per-class", type=int, default=200, help="test images per class (200: 2,000 in all)")
    p.add_argument("--width", type=float, default=1.0,
                   help="ResNet-18 width on both sides (1.0: the benchmark's; 0.25: 1/16 of the compute for the 2-core queue)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers for the PIL pipelines")
    p.add_argument("--archive", default=str(DEFAULT_ARCHIVE))
    p.add_argument("--data", default=str(DEFAULT_DATA), help="where the subset is unpacked")
    p.add_argument("--results", default=str(DEFAULT_RESULTS))
    p.add_argument("--skip-done", action="store_true", help="exit at once if --results already holds this run")
    p.add_argument("--table", action="store_true", help="print the table of --results and exit")
    args = p.parse_args(argv)
    if args.factor is None:
        args.factor = "reference" if args.side == "lightly" else "baseline"
    allowed = LIGHTLY_FACTORS if args.side == "lightly" else OURS_FACTORS
    if not args.table and args.factor not in allowed:
        raise ABError(f"--factor {args.factor!r} is not one of {', '.join(allowed)} for --side {args.side}")
    for name in ("epochs", "batch_size", "train_per_class", "test_per_class", "threads"):
        if getattr(args, name) < 1:
            raise ABError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < args.width <= 4 or int(64 * args.width) < 1:
        raise ABError(f"--width must be in (0, 4] and leave at least one stem channel, got {args.width}")
    if args.train_per_class * 10 < args.batch_size:
        raise ABError(f"--batch-size {args.batch_size} exceeds the {args.train_per_class * 10} train images")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if args.table:
            print(table(Path(args.results)))
            return 0
        if args.skip_done and already_done(Path(args.results), run_key(args)):
            print(f"done already: {run_key(args)}")
            return 0
        try:
            import lightly  # noqa: F401
        except ImportError:
            raise ABError("this A/B needs lightly: pip install lightly (1.6.0 measured; it leaves torch as it is)") from None
        record = run_one(args)
    except ABError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # cl-zoo's own one-line errors
        from cl_zoo.errors import ClZooError

        if isinstance(exc, ClZooError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise
    print(json.dumps({k: record[k] for k in ("side", "factor", "seed", "knn_top1", "epoch_time_s", "wall_s")}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
