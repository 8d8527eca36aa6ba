"""``extract_features``: the one batched loop every consumer shares.

``cl-zoo embed``, ``cl_zoo.embed``, k-NN and linear evaluation all embed through it, so
preprocessing (:mod:`.preprocess`), the engine (:mod:`.engine`) and progress files
(:mod:`.progress`) behave the same everywhere.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.data.workers import default_workers
from cl_zoo.embedding.checks import (
    check_finite,
)
from cl_zoo.embedding.engine import (
    inference_autocast,
    int8_runner,
    model_fingerprint,
    openvino_runner,
    prepare_model,
    resolve_device,
    resolve_engine,
)
from cl_zoo.embedding.preprocess import (
    ImageList,
    Preprocess,
    collate_images,
)
from cl_zoo.embedding.progress import (
    Chunk,
    barrier,
    dist_info,
    load_chunk,
    open_progress,
    progress_manifest,
    save_chunk,
)
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.precision import PRECISIONS


@dataclass
class FeatureResult:
    """Features of the images that decoded, plus the ones that did not and why."""

    features: np.ndarray  # float32 [n_ok, D], rows in input order
    indices: np.ndarray  # int64 [n_ok]: row i is paths[indices[i]] of the input list
    paths: list[str]  # the n_ok embedded paths, same order as features
    failures: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), input order
    seconds: float = 0.0  # wall time of this call
    computed: int = 0  # images decoded and embedded by this call (not restored from progress)
    resumed: int = 0  # images restored from progress files
    precision: str = "fp32"  # what ran: fp32, bf16 or fp16 ("auto" resolved)
    backend: str = "torch"  # what ran: torch or openvino
    backend_reason: str = ""  # why that backend (printed once by commands)
    quantization: dict[str, Any] | None = None  # int8 asked for: calibration, fidelity, whether it ran

    @property
    def images_per_second(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else 0.0



def extract_features(
    model: nn.Module,
    paths: Sequence[str],
    *,
    batch_size: int = 64,
    device: str | torch.device = "auto",
    workers: int | None = None,
    precision: str = "fp32",
    backend: str = "torch",
    progress: bool = False,
    progress_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    force: bool = False,
    chunk_batches: int | None = None,
    fuse: bool = True,
    max_batches: int | None = None,
    calibration: Sequence[str] | None = None,
    calibration_size: int | None = None,
    calibration_seed: int = 0,
    force_int8: bool = False,
) -> FeatureResult:
    """Embed ``paths`` (kept in the given order) with ``model``; bad files become ``failures``.

    ``progress_dir`` keeps one file per finished chunk so that ``resume=True`` skips them; parts
    left there by an interrupted run are only discarded with ``force=True``. Under ``torchrun``
    (``WORLD_SIZE`` > 1) it is required, each rank embeds every ``WORLD_SIZE``-th chunk and all
    ranks return the merged result. ``max_batches`` stops the call with ``KeyboardInterrupt``
    after that many batches (how tests interrupt a run).

    ``precision`` (``auto``, ``fp32``, ``bf16``, ``fp16``) and ``backend`` (``auto``, ``torch``,
    ``openvino``) are resolved for the device (:mod:`cl_zoo.precision`, :mod:`cl_zoo.backends`);
    the result says what ran. A model OpenVINO cannot convert runs on torch with a one-line warning.

    ``precision="int8"`` quantizes with NNCF on ``calibration_size`` images (default 512) drawn by
    ``calibration_seed`` from ``calibration`` (default: ``paths`` themselves), and uses the int8
    model only if it passes its fidelity gate on the held-out half (:mod:`cl_zoo.backends.int8`);
    otherwise it warns in one line and runs the float precision ``auto`` picks, unless
    ``force_int8``. ``result.quantization`` records the calibration and the measurement.
    """
    start = time.perf_counter()
    paths = [os.fspath(p) for p in paths]
    if batch_size < 1:
        raise ClZooError(f"batch size must be at least 1, got {batch_size}")
    if precision not in PRECISIONS:
        raise ClZooError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    workers = default_workers() if workers is None else workers
    if workers < 0:
        raise ClZooError(f"workers must be >= 0, got {workers}")
    rank, world = dist_info()
    dev = resolve_device(device)
    if world > 1 and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 and progress_dir is None:
        raise ClZooError("embedding under torchrun needs a progress folder shared by all ranks (an output path)")
    preprocess = Preprocess.from_model(model)
    # The weights digest names progress files and the OpenVINO cache entry; skip it when neither is used.
    fingerprint = model_fingerprint(model) if progress_dir is not None or backend != "torch" else None
    precision, choice = resolve_engine(model, dev, precision, backend, len(paths), fingerprint)
    runner, backend_name, backend_reason = None, choice.name, choice.reason
    quantization = None
    if precision == "int8" and len(paths):
        runner, precision, backend_reason, quantization = int8_runner(
            model, fingerprint or model_fingerprint(model), preprocess, paths if calibration is None else calibration,
            calibration_size, calibration_seed, force_int8, workers, dev,
        )
        backend_name = "openvino"
    elif choice.name == "openvino" and len(paths):
        runner, backend_reason = openvino_runner(model, fingerprint or model_fingerprint(model), preprocess, precision)
        backend_name = "openvino" if runner is not None else "torch"
    chunk_batches = chunk_batches or max(1, 1024 // batch_size)
    chunk_size = batch_size * chunk_batches
    n_chunks = math.ceil(len(paths) / chunk_size)

    folder = Path(progress_dir) if progress_dir is not None else None
    done: dict[int, Chunk] = {}
    if folder is not None:
        manifest = progress_manifest(paths, model, preprocess, batch_size, chunk_size, precision, dev, backend_name, fingerprint)
        if quantization is not None and quantization["ran"]:
            manifest["int8_calibration_sha256"] = quantization["calibration_sha256"]  # another calibration = other features
        open_progress(folder, manifest, resume, force, rank, world)
        if resume:
            for k in range(n_chunks):
                chunk = load_chunk(folder, k)
                if chunk is not None:
                    done[k] = chunk
    todo = [k for k in range(n_chunks) if k % world == rank and k not in done]
    batches = [
        list(range(s, min(s + batch_size, (k + 1) * chunk_size, len(paths))))
        for k in todo
        for s in range(k * chunk_size, min((k + 1) * chunk_size, len(paths)), batch_size)
    ]
    resumed = sum(len(c.indices) + len(c.fail_indices) for c in done.values())
    computed = 0
    if batches:
        computed = _run_batches(
            model, paths, batches, todo, chunk_size, done, folder, preprocess, dev, workers, precision,
            fuse, max_batches, progress and rank == 0, resumed, runner=runner,
        )
    barrier(world)
    if world > 1:
        assert folder is not None
        for k in range(n_chunks):
            if k not in done:
                chunk = load_chunk(folder, k)
                if chunk is None:
                    raise DataError(f"progress file for chunk {k} is missing in {folder} after all ranks finished")
                done[k] = chunk
        barrier(world)  # every rank has read every part before rank 0 may delete them
    result = _assemble(paths, done, n_chunks, time.perf_counter() - start, computed, resumed)
    result.precision, result.backend, result.backend_reason = precision, backend_name, backend_reason
    result.quantization = quantization
    return result




def _run_batches(
    model: nn.Module,
    paths: list[str],
    batches: list[list[int]],
    todo: list[int],
    chunk_size: int,
    done: dict[int, Chunk],
    folder: Path | None,
    preprocess: Preprocess,
    dev: torch.device,
    workers: int,
    precision: str,
    fuse: bool,
    max_batches: int | None,
    progress: bool,
    resumed: int,
    runner: Any = None,
) -> int:
    from tqdm import tqdm

    net = prepare_model(model, dev, fuse=fuse) if runner is None else None
    mean = torch.tensor(preprocess.mean, device=dev).view(1, 3, 1, 1) * 255.0
    inv_std = 1.0 / (torch.tensor(preprocess.std, device=dev).view(1, 3, 1, 1) * 255.0)
    loader = torch.utils.data.DataLoader(
        ImageList(paths, preprocess),
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=collate_images,
        pin_memory=dev.type == "cuda",
        prefetch_factor=4 if workers > 0 else None,
    )
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]] = {k: [] for k in todo}
    remaining = {k: sum(1 for b in batches if b[0] // chunk_size == k) for k in todo}
    bar = tqdm(
        # disable=None: tqdm turns itself off when stderr is not a terminal (logs, CI, pipes).
        total=len(paths), initial=resumed, unit="img", disable=None if progress else True, file=sys.stderr,
        dynamic_ncols=True, smoothing=0.1,
    )
    computed = 0
    try:
        with torch.inference_mode(), inference_autocast(dev, "fp32" if runner is not None else precision):
            for n, (indices, pixels, failed) in enumerate(loader):
                if max_batches is not None and n >= max_batches:
                    raise KeyboardInterrupt(f"stopped after {max_batches} batches")
                if pixels is not None and runner is not None:
                    feats = runner(pixels)  # uint8 NHWC in, float32 [B, D] out; normalisation inside
                elif pixels is not None:
                    assert net is not None
                    x = pixels.to(dev, non_blocking=True).permute(0, 3, 1, 2)  # NHWC memory = channels-last
                    x = (x.float() - mean) * inv_std
                    feats = net(x)
                    if not isinstance(feats, torch.Tensor):
                        raise ClZooError(f"{type(model).__name__}.forward_features returned {type(feats).__name__}, not a tensor")
                    feats = feats.reshape(feats.shape[0], -1).float().cpu().numpy()
                else:
                    feats = np.zeros((0, 0), dtype=np.float32)
                if len(indices):
                    check_finite(feats, [paths[i] for i in indices], model, precision)
                k = (indices[0] if indices else failed[0][0]) // chunk_size
                pending[k].append((feats, np.asarray(indices, dtype=np.int64), failed))
                computed += len(indices)
                bar.update(len(indices) + len(failed))
                remaining[k] -= 1
                if remaining[k] == 0:
                    done[k] = _merge_chunk(pending.pop(k))
                    if folder is not None:
                        save_chunk(folder, k, done[k])
    finally:
        bar.close()
    return computed


def _merge_chunk(parts: list[tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]) -> Chunk:
    feats = [f for f, i, _ in parts if len(i)]
    dim = feats[0].shape[1] if feats else 0
    fails = [pair for _, _, fl in parts for pair in fl]
    return Chunk(
        features=np.concatenate(feats).astype(np.float32, copy=False) if feats else np.zeros((0, dim), np.float32),
        indices=np.concatenate([i for _, i, _ in parts]).astype(np.int64),
        fail_indices=np.array([i for i, _ in fails], dtype=np.int64),
        fail_reasons=[r for _, r in fails],
    )


def _assemble(paths: list[str], chunks: dict[int, Chunk], n_chunks: int, seconds: float, computed: int, resumed: int) -> FeatureResult:
    ordered = [chunks[k] for k in range(n_chunks)]
    dims = {c.features.shape[1] for c in ordered if len(c.indices)}
    if len(dims) > 1:
        raise DataError(f"progress files disagree on the feature size ({sorted(dims)}); run without --resume")
    dim = dims.pop() if dims else 0
    feats = [c.features for c in ordered if len(c.indices)]
    features = np.concatenate(feats) if feats else np.zeros((0, dim), np.float32)
    indices = np.concatenate([c.indices for c in ordered]) if ordered else np.zeros(0, np.int64)
    failures = sorted(((int(i), r) for c in ordered for i, r in zip(c.fail_indices, c.fail_reasons)))
    return FeatureResult(
        features=np.ascontiguousarray(features, dtype=np.float32),
        indices=indices.astype(np.int64),
        paths=[paths[i] for i in indices],
        failures=[(paths[i], r) for i, r in failures],
        seconds=seconds,
        computed=computed,
        resumed=resumed,
    )


