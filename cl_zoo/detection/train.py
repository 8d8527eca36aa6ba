"""End-to-end Faster R-CNN fine-tuning of a zoo backbone (the torchvision engine).

The schedule is detectron2's: SGD with momentum 0.9, weight decay 1e-4 (none on norm layers),
a linear warm-up from ``warmup_factor * lr`` over ``warmup_iters`` iterations, then the learning
rate multiplied by 0.1 at each of ``steps``. Each training image gets a shorter side drawn from
``min_sizes_train`` (multi-scale training, torchvision's transform does the draw) and a random
horizontal flip; testing uses ``min_size_test``. Images without any usable box are left out of
training, as detectron2's ``FILTER_EMPTY_ANNOTATIONS`` does.

``output_dir`` receives ``last.pt`` (model, optimizer, iteration; written atomically every
``checkpoint_period`` iterations and at the end), ``config.json`` and ``report.json``; rerunning
with ``resume=True`` continues from ``last.pt``.

Ctrl-C (SIGINT): the iterations run in a worker thread while the main thread waits, so the signal is
seen at once however long an iteration's C++ work takes (Python runs signal handlers only in the
main thread, between bytecodes: a C4 iteration at batch 16 spent minutes inside ``loss.backward()``).
The main thread then writes ``last.pt`` itself with the state after the last finished iteration,
without waiting for the unfinished one (the weights change only in ``optimizer.step()``, which it
excludes with a lock, and the BatchNorm statistics are copied after every step), and gives the
worker ``INTERRUPT_GRACE_S`` to stop at its next check before leaving it behind. DataLoader workers ignore SIGINT,
so a terminal's Ctrl-C, which reaches the whole process group, cannot kill them under the loop.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.data.workers import default_workers
from cl_zoo.detection.datasets import DetectionData, DetectionDataset, collate, load_detection_data
from cl_zoo.detection.evaluate import evaluate_detections
from cl_zoo.detection.limits import check_detection_values
from cl_zoo.detection.models import build_faster_rcnn, default_head
from cl_zoo.errors import CheckpointError, ClZooError, DataError
from cl_zoo.fileio import atomic_save_torch, atomic_write_json
from cl_zoo.interrupts import held_interrupts
from cl_zoo.precision import autocast, resolve_precision, why
from cl_zoo.progress import Progress


@dataclass
class DetectionConfig:
    """Everything a run depends on (saved to config.json, checked on resume)."""

    head: str | None = None  # None: by the backbone (models.default_head: FPN for ResNet-18/34, C4 deeper)
    norm: str = "bn"
    freeze_at: int = 0
    fpn_norm: bool = True
    batch_size: int = 16
    lr: float | None = None  # None: 0.02 * batch_size / 16 (the linear scaling rule)
    momentum: float = 0.9
    weight_decay: float = 1e-4
    max_iter: int = 24000  # the VOC protocol's, sized for GPUs: presets.RUN_PRESETS["cpu-quick"] on a CPU
    steps: tuple[int, ...] = (18000, 22000)
    gamma: float = 0.1
    warmup_iters: int = 100
    warmup_factor: float = 0.001
    min_sizes_train: tuple[int, ...] = tuple(range(480, 801, 32))
    min_size_test: int = 800
    max_size: int = 1333
    rois_per_image: int = 512
    proposals_test: int = 1000
    checkpoint_period: int = 2000
    workers: int = field(default_factory=default_workers)  # the usable CPUs, at most 8
    seed: int = 0
    val_limit: int | None = None  # evaluate only the first N validation images (quick checks)
    # auto: bf16 autocast on CUDA and on CPUs with AMX (cl_zoo.precision, training); weights,
    # optimizer state and the summed loss stay float32, detections come back float32.
    precision: str = "auto"

    @property
    def base_lr(self) -> float:
        return self.lr if self.lr is not None else 0.02 * self.batch_size / 16

    def lr_at(self, iteration: int) -> float:
        """Learning rate for 0-based ``iteration``: linear warm-up, then step decay."""
        factor = self.gamma ** sum(1 for s in self.steps if iteration >= s)
        if iteration < self.warmup_iters:
            alpha = iteration / self.warmup_iters
            factor *= self.warmup_factor * (1 - alpha) + alpha
        return self.base_lr * factor

    def validate(self) -> None:
        """Every number inside what it can mean (:mod:`cl_zoo.detection.limits`), one line if not."""
        check_detection_values(dataclasses.asdict(self))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["steps"], d["min_sizes_train"] = list(self.steps), list(self.min_sizes_train)
        d["base_lr"] = self.base_lr
        return d


# How long Ctrl-C, once last.pt is written, waits for the worker to leave the unfinished iteration.
INTERRUPT_GRACE_S = 5.0


class DetectionInterrupted(ClZooError):
    """Ctrl-C stopped the run; ``abandoned`` when its worker was still busy and had to be left behind."""

    exit_code = 130

    def __init__(self, message: str, *, abandoned: bool = False, checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.abandoned = abandoned
        self.checkpoint = checkpoint  # what --resume continues from; None: nothing was saved


def check_resumable(out: Path | None, resume: bool) -> None:
    """``--resume`` needs ``OUT/last.pt``: without one it would silently start at iteration 0."""
    if resume and (out is None or not (out / "last.pt").is_file()):
        where = f"{out} holds no last.pt" if out is not None else "no output folder"
        raise CheckpointError(f"--resume: nothing to resume, {where}; run without --resume to start the run")


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the model's buffers (BatchNorm statistics: a few KB), which each forward changes."""
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def ignore_sigint(_worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: the main process decides what Ctrl-C does, not a dying worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


Outcome = Literal["done", "stopped", "abandoned"]


def run_stoppable(work: Callable[[threading.Event], None], grace_s: float = INTERRUPT_GRACE_S,
                  on_stop: Callable[[], None] | None = None) -> Outcome:
    """Run ``work(stop)`` in a thread; on KeyboardInterrupt set ``stop``, call ``on_stop()`` here in
    the main thread (what must be kept whatever the worker is doing: the checkpoint), then wait up
    to ``grace_s`` for the worker.

    The main thread only waits here, in short interruptible waits, so Ctrl-C is noticed within a
    fraction of a second whatever ``work`` is doing. ``work`` must return soon after ``stop`` is set
    (at its next check). Returns "done", "stopped" (it returned after ``stop``) or "abandoned" (still
    running after ``grace_s``, or a second Ctrl-C): the thread is a daemon, left to the process's exit.
    An exception from ``work`` is raised here.
    """
    stop, finished = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            work(stop)
        except BaseException as exc:  # handed to the main thread, which raises it
            errors.append(exc)
        finally:
            finished.set()

    # Waiting on an Event, not Thread.join: a KeyboardInterrupt inside join() can leave the Thread
    # object reporting a still-running thread as finished.
    threading.Thread(target=target, name="cl-zoo-detect", daemon=True).start()
    try:
        while not finished.wait(0.2):
            pass
    except KeyboardInterrupt:
        stop.set()
        try:
            if on_stop is not None:
                on_stop()
            if not finished.wait(grace_s):
                return "abandoned"
        except KeyboardInterrupt:  # a second Ctrl-C: do not wait for the iteration
            return "abandoned"
        if errors:
            raise errors[0]
        return "stopped"
    if errors:
        raise errors[0]
    return "done"


@dataclass
class DetectionRun:
    model: nn.Module
    metrics: dict[str, float]
    report_path: Path | None
    losses: list[float] = field(default_factory=list)


def _param_groups(model: nn.Module, cfg: DetectionConfig) -> list[dict[str, Any]]:
    norm_types = (nn.BatchNorm2d, nn.SyncBatchNorm, nn.GroupNorm, nn.LayerNorm)
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            (no_decay if isinstance(module, norm_types) else decay).append(p)
    return [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _set_sizes(model: nn.Module, sizes: Sequence[int]) -> None:
    model.transform.min_size = tuple(int(s) for s in sizes)


def _infinite_batches(dataset: DetectionDataset, cfg: DetectionConfig, start: int) -> Any:
    """Batches of a seeded random order, re-shuffled every epoch, resumable at any iteration."""
    epoch_len = max(1, len(dataset) // cfg.batch_size)
    epoch, skip = divmod(start, epoch_len)
    while True:
        g = torch.Generator().manual_seed(cfg.seed * 1000003 + epoch)
        order = torch.randperm(len(dataset), generator=g).tolist()
        batches = [order[i * cfg.batch_size:(i + 1) * cfg.batch_size] for i in range(epoch_len)]
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=batches[skip:],
            collate_fn=collate,
            num_workers=cfg.workers,
            persistent_workers=False,
            worker_init_fn=ignore_sigint,
        )
        yield from loader
        epoch, skip = epoch + 1, 0


@torch.no_grad()
def predict(model: nn.Module, data: DetectionData, device: torch.device, batch_size: int = 2,
            workers: int = 0, progress: bool = False, precision: str = "fp32") -> list[dict[str, np.ndarray]]:
    """Detections for every sample, in original image pixels (float32 whatever ``precision`` ran)."""
    model.eval()
    loader = torch.utils.data.DataLoader(DetectionDataset(data, train=False), batch_size=batch_size,
                                         collate_fn=collate, num_workers=workers, worker_init_fn=ignore_sigint)
    out: list[dict[str, np.ndarray]] = []
    bar = Progress(len(loader), desc="evaluate", unit="batches", enabled=progress, leave=False)
    try:
        for images, _ in loader:
            with autocast(device, precision):
                dets = model([im.to(device) for im in images])
            for det in dets:
                out.append({k: (det[k].float() if k != "labels" else det[k]).cpu().numpy() for k in ("boxes", "scores", "labels")})
            bar.update(1)
    finally:
        bar.close()
    return out


def evaluate_model(model: nn.Module, data: DetectionData, cfg: DetectionConfig, device: torch.device,
                   progress: bool = False, precision: str = "fp32") -> dict[str, float]:
    if cfg.val_limit is not None:
        data = dataclasses.replace(data, samples=data.samples[: cfg.val_limit])
    _set_sizes(model, [cfg.min_size_test])
    detections = predict(model, data, device, batch_size=max(1, min(cfg.batch_size, 4)),
                         workers=min(cfg.workers, 2), progress=progress, precision=precision)
    return evaluate_detections(data, detections)


def _clean(metrics: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else round(float(v), 4)) for k, v in metrics.items()}


def train_detector(
    backbone: nn.Module,
    train_data: DetectionData,
    val_data: DetectionData | None,
    cfg: DetectionConfig,
    output_dir: str | os.PathLike[str] | None = None,
    *,
    device: str | torch.device | None = None,
    resume: bool = False,
    progress: bool = True,
    model_name: str | None = None,
    backbone_identity: dict[str, Any] | None = None,
) -> DetectionRun:
    """Fine-tune Faster R-CNN on ``train_data`` and evaluate on ``val_data``; see the module doc.

    ``backbone_identity`` (``cl_zoo.eval.features.model_identity`` of the backbone before
    fine-tuning: name, source, weight and checkpoint-file digests) goes into ``report.json``, so a
    detection figure can be traced to the exact weights it started from.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    precision = resolve_precision(cfg.precision, device, training=True)
    if precision == "fp16" and device.type != "cuda":
        raise ClZooError("fp16 needs CUDA (loss scaling); use bf16, auto or fp32 on the CPU")
    if progress:
        print(f"precision: {precision} ({why(precision, device, training=True)}; requested {cfg.precision})", flush=True)
    cfg.validate()
    out = Path(output_dir) if output_dir is not None else None
    check_resumable(out, resume)
    kept = [s for s in train_data.samples if len(s.boxes) > 0 and not s.difficult.all()]
    if not kept and cfg.max_iter > 0:
        raise DataError(f"no training image has a usable box ({train_data.summary()})")
    train_data = dataclasses.replace(train_data, samples=kept)
    if cfg.head is None:
        cfg = dataclasses.replace(cfg, head=default_head(backbone))
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)

    model = build_faster_rcnn(
        backbone, len(train_data.classes), head=cfg.head, norm=cfg.norm, freeze_at=cfg.freeze_at,  # type: ignore[arg-type]
        fpn_norm=cfg.fpn_norm, min_size=cfg.min_sizes_train, max_size=cfg.max_size,
        rois_per_image=cfg.rois_per_image, proposals_test=cfg.proposals_test,
    ).to(device)
    optimizer = torch.optim.SGD(_param_groups(model, cfg), lr=cfg.lr_at(0), momentum=cfg.momentum)

    start = 0
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        ckpt_path = out / "last.pt"
        if resume and ckpt_path.is_file():
            try:
                state = torch.load(ckpt_path, map_location=device, weights_only=True)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                start = int(state["iteration"])
            except (KeyError, RuntimeError, ValueError) as exc:
                raise CheckpointError(f"cannot resume from {ckpt_path}: {str(exc).splitlines()[0]}") from exc
            if state.get("classes") != train_data.classes:
                raise CheckpointError(f"{ckpt_path} was trained on other classes; use a new output folder")
            if state.get("precision", precision) != precision:
                print(f"note: {ckpt_path} trained in {state['precision']} and continues in {precision} "
                      "(weights and optimizer state are float32 either way)", flush=True)
        elif not resume and ckpt_path.exists():
            raise ClZooError(f"{out} already holds a run (last.pt); pass --resume or choose another --out")
        atomic_write_json(out / "config.json",
                          {"config": cfg.to_dict(), "model": model_name, "classes": train_data.classes,
                           "train": train_data.summary(), "val": val_data.summary() if val_data else None},
                          allow_nan=False)

    # The worker holds ``guard`` to change the weights or write last.pt; Ctrl-C's save (main thread)
    # takes it too, so it writes the state after the last finished iteration whatever the worker is
    # doing: mid-forward the weights are as that iteration left them, and the BatchNorm statistics the
    # forward is updating are taken from ``done``, copied after each step.
    guard = threading.Lock()
    done: dict[str, Any] = {"iteration": start, "buffers": _buffers(model)}
    saved = {"iteration": start if resume and start else None}  # what last.pt holds, as far as this run knows

    def save(iteration: int, buffers: dict[str, torch.Tensor] | None = None) -> None:
        if out is None:
            return
        state = model.state_dict()
        if buffers is not None:
            state.update({k: v for k, v in buffers.items() if k in state})
        with held_interrupts():  # a Ctrl-C mid-write waits for it: last.pt is replaced whole or not at all
            atomic_save_torch(out / "last.pt", {"model": state, "optimizer": optimizer.state_dict(),
                                                "iteration": iteration, "classes": train_data.classes,
                                                "precision": precision})
        saved["iteration"] = iteration

    def save_on_stop() -> None:
        """Main thread, after Ctrl-C: last.pt at the last finished iteration, unless it holds it already."""
        while not guard.acquire(timeout=0.2):  # the worker holds it for a step or its own save: short
            pass
        try:
            if done["iteration"] != saved["iteration"] and done["iteration"] > start:
                save(done["iteration"], done["buffers"])
        finally:
            guard.release()

    losses: list[float] = []
    t0 = time.perf_counter()

    def train_loop(stop: threading.Event) -> None:
        model.train()
        _set_sizes(model, cfg.min_sizes_train)
        dataset = DetectionDataset(train_data, train=True)
        bar = Progress(cfg.max_iter, initial=start, desc="detect", unit="it", enabled=progress)
        batches = _infinite_batches(dataset, cfg, start)
        try:
            for iteration in range(start, cfg.max_iter):
                if stop.is_set():
                    return
                images, targets = next(batches)
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr_at(iteration)
                images = [im.to(device, non_blocking=True) for im in images]
                targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
                with autocast(device, precision):
                    loss_dict = model(images, targets)
                loss = sum(v.float() for v in loss_dict.values())
                if not torch.isfinite(loss):
                    raise ClZooError(f"loss became {loss.item()} at iteration {iteration}; lower --lr or add warm-up")
                if stop.is_set():  # the forward and the backward each take seconds on a CPU
                    return
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                with guard:
                    if stop.is_set():  # Ctrl-C's save holds the state before this step
                        return
                    optimizer.step()
                    done.update(iteration=iteration + 1, buffers=_buffers(model))
                    if cfg.checkpoint_period and (iteration + 1) % cfg.checkpoint_period == 0 and iteration + 1 < cfg.max_iter:
                        save(iteration + 1)
                losses.append(float(loss.item()))
                bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{cfg.lr_at(iteration):.4g}")
                bar.update(1)
            with guard:
                if not stop.is_set():
                    save(cfg.max_iter)
        finally:
            bar.close()
            batches.close()  # shuts the DataLoader's workers down now, not at garbage collection

    if start < cfg.max_iter:
        outcome = run_stoppable(train_loop, grace_s=INTERRUPT_GRACE_S, on_stop=save_on_stop)
        if outcome != "done":
            where = out / "last.pt" if out is not None else None
            if where is None:
                kept = "no output folder, nothing saved"
            elif saved["iteration"] is None:
                kept = f"no iteration finished, nothing saved in {out}"
            else:
                kept = f"saved {where} at iteration {saved['iteration']}"
            if outcome == "abandoned":
                kept += " (the unfinished iteration was left behind)"
            raise DetectionInterrupted(f"Ctrl-C after {done['iteration']} of {cfg.max_iter} iterations: {kept}",
                                       abandoned=outcome == "abandoned",
                                       checkpoint=where if saved["iteration"] is not None else None)
    train_seconds = time.perf_counter() - t0

    metrics: dict[str, float] = {}
    if val_data is not None:
        try:
            metrics = evaluate_model(model, val_data, cfg, device, progress=progress, precision=precision)
        except KeyboardInterrupt:
            kept = f"training finished ({out / 'last.pt'}); rerun with --resume to evaluate" if out is not None else "not evaluated"
            raise DetectionInterrupted(f"Ctrl-C during evaluation: {kept}") from None
    report_path = None
    if out is not None:
        report = {
            "task": "detection",
            "engine": "torchvision",
            "model": model_name,
            "backbone": backbone_identity,
            "head": cfg.head,
            "config": cfg.to_dict(),
            "device": str(device),
            "precision": precision,
            "iterations": cfg.max_iter,
            "resumed_from": start,
            "train_seconds": round(train_seconds, 2),
            "final_loss": losses[-1] if losses else None,
            "train_data": train_data.summary(),
            "val_data": val_data.summary() if val_data else None,
            "val_images_evaluated": (min(len(val_data.samples), cfg.val_limit) if cfg.val_limit else len(val_data.samples)) if val_data else 0,
            "metrics": _clean(metrics),
        }
        report_path = out / "report.json"
        atomic_write_json(report_path, report, allow_nan=False)
    return DetectionRun(model, metrics, report_path, losses)


def open_datasets(train_roots: Sequence[str], train_split: str, val_root: str | None, val_split: str | None
                  ) -> tuple[DetectionData, DetectionData | None]:
    """Training data (several roots are concatenated, e.g. VOC2007 + VOC2012) and validation data
    with the training label order."""
    if not train_roots:
        raise DataError("no training data given")
    parts = [load_detection_data(train_roots[0], train_split)]
    for root in train_roots[1:]:
        nxt = load_detection_data(root, train_split, parts[0].classes if parts[0].layout == "voc" else None)
        if nxt.classes != parts[0].classes:
            raise DataError(f"{root} has other classes than {train_roots[0]}")
        offset = max((s.image_id for p in parts for s in p.samples), default=-1) + 1
        for s in nxt.samples:
            s.image_id += offset
        parts.append(nxt)
    train = parts[0]
    if len(parts) > 1:
        skipped = sum((p.skipped for p in parts), start=parts[0].skipped.__class__())
        train = dataclasses.replace(train, samples=[s for p in parts for s in p.samples], skipped=skipped,
                                    root=" + ".join(p.root for p in parts))
    val = None
    if val_split:
        val = load_detection_data(val_root or train_roots[0], val_split,
                                  train.classes if train.layout == "voc" else None, split_option="--val-split")
        if val.layout == "coco" and val.category_ids != train.category_ids:
            raise DataError("validation categories differ from the training categories")
    return train, val
