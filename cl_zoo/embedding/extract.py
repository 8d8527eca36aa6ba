"""``extract_features``: the one batched loop every consumer shares.

``cl-zoo embed``, ``cl_zoo.embed``, k-NN and linear evaluation all embed through it, so
preprocessing (:mod:`.preprocess`), the engine (:mod:`.engine`) and progress files
(:mod:`.progress`) behave the same everywhere.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

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
from cl_zoo.embedding.options import EXACT, EngineOptions
from cl_zoo.embedding.preprocess import (
    ImageList,
    Preprocess,
    collate_images,
)
from cl_zoo.embedding.progress import (
    Chunk,
    barrier,
    changed_inputs,
    chunk_stats,
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
    changed: int = 0  # inputs whose saved progress was dropped because the file changed since (re-embedded)
    precision: str = "fp32"  # what ran: fp32, bf16 or fp16 ("auto" resolved)
    backend: str = "torch"  # what ran: torch or openvino
    backend_reason: str = ""  # why that backend (printed once by commands)
    quantization: dict[str, Any] | None = None  # int8 asked for: calibration, fidelity, whether it ran
    workers: int = 0  # decode processes that ran (one per usable core, at most 8, unless given)

    @property
    def images_per_second(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else 0.0



def extract_features(
    model: nn.Module,
    paths: Sequence[str],
    *,
    options: EngineOptions | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    workers: int | None = None,
    precision: str | None = None,
    backend: str | None = None,
    progress: bool = False,
    progress_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    force: bool = False,
    chunk_batches: int | None = None,
    fuse: bool | None = None,
    max_batches: int | None = None,
    calibration: Sequence[str] | None = None,
    calibration_size: int | None = None,
    calibration_seed: int | None = None,
    force_int8: bool | None = None,
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

    Engine settings come from ``options`` (:class:`~cl_zoo.embedding.options.EngineOptions`), each
    keyword given here overriding its field. Without ``options`` the base is
    :data:`~cl_zoo.embedding.options.EXACT` (fp32 on torch), not the ``auto`` defaults the
    user-facing ``cl_zoo.embed`` and ``cl-zoo embed`` use: k-NN and linear evaluation embed through
    this function, and their reports must give the same numbers on every machine; and the function
    said fp32/torch before ``EngineOptions`` existed, so old calls keep their features.

    ``precision="int8"`` quantizes with NNCF on ``calibration_size`` images (default 512) drawn by
    ``calibration_seed`` from ``calibration`` (default: ``paths`` themselves), and uses the int8
    model only if it passes its fidelity gate on the held-out half (:mod:`cl_zoo.backends.int8`);
    otherwise it warns in one line and runs the float precision ``auto`` picks, unless
    ``force_int8``. ``result.quantization`` records the calibration and the measurement.
    """
    start = time.perf_counter()
    paths = [os.fspath(p) for p in paths]
    rank, world = dist_info()
    if world > 1 and progress_dir is None:
        raise ClZooError("embedding under torchrun needs a progress folder shared by all ranks (an output path)")
    opts = EngineOptions.merge(
        EXACT if options is None else options, batch_size=batch_size, device=device, workers=workers, precision=precision,
        backend=backend, fuse=fuse, calibration=calibration, calibration_size=calibration_size,
        calibration_seed=calibration_seed, force_int8=force_int8,
    )
    decoders, dev = check_options(opts)  # a bad setting fails before any decoder starts
    batch_size = opts.batch_size
    chunk_batches = chunk_batches or max(1, 1024 // batch_size)
    chunk_size = batch_size * chunk_batches
    n_chunks = math.ceil(len(paths) / chunk_size)
    mine = [k for k in range(n_chunks) if k % world == rank]
    # Without --resume the batches to run are known before the engine is: decoding starts first and
    # fills its queue while the engine converts, compiles or loads (a resume must first learn from the
    # engine's manifest which saved parts it may keep).
    with decoding_ahead(None if resume else decode_ahead(model, paths, chunk_batches_of(mine, chunk_size, batch_size, len(paths)),
                                                         decoders, dev)) as ahead:
        engine = prepare_engine(model, paths, opts, need_fingerprint=progress_dir is not None)
        folder = Path(progress_dir) if progress_dir is not None else None
        done: dict[int, Chunk] = {}
        changed = 0
        if folder is not None:
            open_progress(folder, engine.progress_manifest(model, paths, batch_size, chunk_size), resume, force, rank, world)
            if resume:
                for k in range(n_chunks):
                    chunk = load_chunk(folder, k)
                    stale = changed_inputs(paths, chunk) if chunk is not None else 0
                    changed += stale
                    if chunk is not None and not stale:  # a chunk with a changed input is embedded again
                        done[k] = chunk
        todo = [k for k in mine if k not in done]
        resumed = sum(len(c.indices) + len(c.fail_indices) for c in done.values())

        def keep(k: int, chunk: Chunk) -> None:
            done[k] = chunk
            if folder is not None:
                chunk.stats = chunk_stats(paths, chunk)
                save_chunk(folder, k, chunk)

        computed = run_batches(
            model, engine, paths, chunk_batches_of(todo, chunk_size, batch_size, len(paths)), lambda i: i // chunk_size, keep,
            workers=engine.workers, fuse=opts.fuse, max_batches=max_batches, progress=progress and rank == 0, initial=resumed,
            decoded=ahead,
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
    result.changed = changed
    engine.describe(result)
    return result


@dataclass
class Engine:
    """What an extraction runs, resolved once: device, preprocessing, precision, backend and its reason."""

    device: torch.device
    preprocess: Preprocess
    workers: int
    fingerprint: str | None  # weights digest; computed only where progress files or a cache need it
    precision: str
    backend: str
    reason: str
    runner: Any = None  # a compiled OpenVINO model, or None for torch
    quantization: dict[str, Any] | None = None

    def progress_manifest(self, model: nn.Module, paths: Sequence[str], batch_size: int, chunk_size: int) -> dict[str, Any]:
        manifest = progress_manifest(paths, model, self.preprocess, batch_size, chunk_size, self.precision, self.device,
                                     self.backend, self.fingerprint)
        if self.quantization is not None and self.quantization["ran"]:
            manifest["int8_calibration_sha256"] = self.quantization["calibration_sha256"]  # another calibration = other features
        return manifest

    def describe(self, result: "FeatureResult") -> None:
        result.precision, result.backend, result.backend_reason = self.precision, self.backend, self.reason
        result.quantization, result.workers = self.quantization, self.workers


def prepare_engine(
    model: nn.Module,
    paths: Sequence[str],
    options: EngineOptions,
    *,
    need_fingerprint: bool,
    images: int | None = None,
) -> Engine:
    """Check the options and resolve what runs (``images``: how many will be embedded, default ``len(paths)``)."""
    precision, backend = options.precision, options.backend
    workers, dev = check_options(options)
    _, world = dist_info()
    if world > 1 and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    preprocess = Preprocess.from_model(model)
    count = len(paths) if images is None else images
    # The weights digest names progress files and the OpenVINO cache entry; skip it when neither is used.
    fingerprint = model_fingerprint(model) if need_fingerprint or backend != "torch" else None
    precision, choice = resolve_engine(model, dev, precision, backend, count, fingerprint)
    engine = Engine(dev, preprocess, workers, fingerprint, precision, choice.name, choice.reason)
    if precision == "int8" and count:
        engine.fingerprint = engine.fingerprint or model_fingerprint(model)
        engine.runner, engine.precision, engine.reason, engine.quantization = int8_runner(
            model, engine.fingerprint, preprocess, paths if options.calibration is None else options.calibration,
            options.calibration_size, options.calibration_seed, options.force_int8, workers, dev,
        )
        engine.backend = "openvino"
    elif choice.name == "openvino" and count:
        engine.fingerprint = engine.fingerprint or model_fingerprint(model)
        engine.runner, engine.reason = openvino_runner(model, engine.fingerprint, preprocess, precision)
        engine.backend = "openvino" if engine.runner is not None else "torch"
    return engine


def check_options(options: EngineOptions) -> tuple[int, torch.device]:
    """The decode workers and the device ``options`` ask for, or a one-line error for a bad setting.

    Checked before anything starts (decode processes, a conversion), so a user mistake costs nothing.
    """
    if options.batch_size < 1:
        raise ClZooError(f"batch size must be at least 1, got {options.batch_size}")
    if options.precision not in PRECISIONS:
        raise ClZooError(f"unknown precision {options.precision!r}; use one of {', '.join(PRECISIONS)}")
    if options.workers is not None and options.workers < 0:
        raise ClZooError(f"workers must be >= 0, got {options.workers}")
    return default_workers() if options.workers is None else options.workers, resolve_device(options.device)


def chunk_batches_of(chunks: Sequence[int], chunk_size: int, batch_size: int, total: int) -> list[list[int]]:
    """The batches (lists of input positions) of the given chunks, in order; none straddles a chunk."""
    return [
        list(range(s, min(s + batch_size, (k + 1) * chunk_size, total)))
        for k in chunks
        for s in range(k * chunk_size, min((k + 1) * chunk_size, total), batch_size)
    ]


def image_batches(
    paths: Sequence[str], preprocess: Preprocess, batches: list[list[int]], workers: int, device: torch.device,
) -> torch.utils.data.DataLoader:
    """The decoded batches ``(indices, uint8 NHWC pixels or None, failures)`` of ``batches``, in order.

    Worker processes decode, each collating straight into shared memory
    (:func:`~cl_zoo.embedding.preprocess.collate_images`), so a batch crosses to this process
    without a copy, and the main process stays free to feed the inference engine.
    ``benchmarks/embed_throughput.py`` times exactly this loader as the
    decode-only rate.
    """
    return torch.utils.data.DataLoader(
        ImageList(paths, preprocess),
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=collate_images,
        pin_memory=device.type == "cuda",
        prefetch_factor=prefetch_batches(workers, len(batches[0]) if batches else 1),
    )


# How many images the decoders may hold decoded ahead of the engine, across all of them: enough to
# cover the engine's start-up (0.25-0.7 s for ResNet-50 on 2 cores, during which they decode about
# 100-250 images), a bounded amount of memory (512 crops of 224 px are 77 MB).
DECODE_AHEAD_IMAGES = 512


def prefetch_batches(workers: int, batch_size: int) -> int | None:
    """Each decoder's ``prefetch_factor``: :data:`DECODE_AHEAD_IMAGES` shared out, at least torch's 2.

    A fixed 4 let two decoders run only 8 batches of 32 ahead, which they reached before the engine
    was ready, leaving a core idle for the rest of the start-up; a budget in images keeps the same
    memory whatever the batch size and the number of decoders. bf16 ResNet-50, 512 JPEGs, AMX
    host: 145-158 images/s with 4, 150-162 with 8 (two alternating rounds of three runs).
    """
    if workers == 0:
        return None
    return max(2, math.ceil(DECODE_AHEAD_IMAGES / (workers * max(1, batch_size))))


class DecodeAhead:
    """Decoding already under way: the loader's worker processes started, their queues filling.

    Made before the engine is prepared (:func:`decode_ahead`; WebDataset tars:
    :func:`cl_zoo.embedding.tars.tar_decode_ahead`), so the conversion, compilation, probe and first
    allocations of the engine (0.25-0.5 s for ResNet-50 on 2 cores, more on a cold cache) run while
    the decoders work through the first batches, instead of the first batch starting to decode only
    once the engine is ready. ``identity`` says what is being decoded (inputs, preprocessing,
    decoders, device kind); the run uses it only where its own matches. ``close()`` stops the workers
    whatever happened in between (a bad progress folder, a failed conversion, Ctrl-C).
    """

    def __init__(self, loader: Iterable[Any], identity: tuple[Any, ...]) -> None:
        self.identity = identity
        self._iterator: Any = iter(loader)

    def matches(self, identity: tuple[Any, ...]) -> bool:
        """Whether these are the inputs, preprocessing and decoders the engine's run needs."""
        return self.identity == identity

    def __iter__(self) -> Any:
        return self._iterator

    def close(self) -> None:
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)  # torch's own clean stop of the worker processes
        if shutdown is not None:
            shutdown()


def _batches_identity(preprocess: Preprocess, batches: list[list[int]], workers: int, device: torch.device) -> tuple[Any, ...]:
    return (preprocess, batches, workers, device.type)


def decode_ahead(model: nn.Module, paths: Sequence[str], batches: list[list[int]], workers: int,
                 device: torch.device) -> DecodeAhead | None:
    """Start decoding ``batches`` now, before the engine exists; None where nothing would run ahead.

    ``workers`` and ``device`` as :func:`check_options` gives them. With ``workers=0`` decoding
    happens in this process, on demand, so there is nothing to start.
    """
    if not batches or workers == 0:
        return None
    preprocess = Preprocess.from_model(model)
    return DecodeAhead(image_batches(paths, preprocess, batches, workers, device),
                       _batches_identity(preprocess, batches, workers, device))


@contextlib.contextmanager
def decoding_ahead(ahead: DecodeAhead | None) -> Iterator[DecodeAhead | None]:
    """``ahead`` for the block; its workers are stopped when the block ends, however it ends."""
    try:
        yield ahead
    finally:
        if ahead is not None:
            ahead.close()


def run_batches(
    model: nn.Module,
    engine: Engine,
    paths: Sequence[str],
    batches: list[list[int]],
    chunk_of: Callable[[int], int],
    on_chunk: Callable[[int, Chunk], None],
    *,
    workers: int,
    fuse: bool = True,
    max_batches: int | None = None,
    progress: bool = False,
    initial: int = 0,
    total: int | None = None,
    decoded: DecodeAhead | None = None,
) -> int:
    """Embed ``batches`` of ``paths``; each finished chunk (``chunk_of(position)``) goes to ``on_chunk``, then is dropped.

    Returns the number of images embedded. The caller decides what a chunk becomes: kept in
    memory, saved as a progress part, or streamed into an output shard, so memory need not grow
    with the number of images. ``decoded``: decoding started ahead of the engine for exactly
    these batches (:func:`decode_ahead`); it is used only where it matches, else a loader starts here.

    Decoders: ``workers`` processes (by default one per usable core, :func:`default_workers`)
    beside the engine's threads on the same cores. More decoders than decode's average share do
    not take time from the engine: each stops once its share of :data:`DECODE_AHEAD_IMAGES` waits decoded,
    so they run only while the engine is ahead of them. What the number sets is how much of the
    CPU decoding can claim when it falls behind, which under the kernel's fair share is about
    ``workers / (workers + engine threads)``. One decoder beside two OpenVINO streams got about a
    third of the cores and held int8 ResNet-50 at 296-300 images/s; two decoders, 323-324
    (AMX host, 2 cores, 1,536 JPEGs; bf16 199-201 against 203-208). A start-up probe that chose
    one decoder for models heavier than decoding (until 2026-12) cost those 8%.
    """
    from tqdm import tqdm

    if not batches:
        return 0
    forward = BatchForward(model, engine, fuse=fuse)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]] = {}
    remaining: dict[int, int] = {}
    for b in batches:
        remaining[chunk_of(b[0])] = remaining.get(chunk_of(b[0]), 0) + 1
    bar = tqdm(
        # disable=None: tqdm turns itself off when stderr is not a terminal (logs, CI, pipes).
        total=len(paths) if total is None else total, initial=initial, unit="img", disable=None if progress else True,
        file=sys.stderr, dynamic_ncols=True, smoothing=0.1,
    )
    computed = 0

    def finish(batch: tuple[list[int], Any, list[tuple[int, str]]], feats: np.ndarray) -> None:
        nonlocal computed
        indices, _, failed = batch
        if len(indices):
            check_finite(feats, [paths[i] for i in indices], model, engine.precision)
        k = chunk_of(indices[0] if indices else failed[0][0])
        pending.setdefault(k, []).append((feats, np.asarray(indices, dtype=np.int64), failed))
        computed += len(indices)
        bar.update(len(indices) + len(failed))
        remaining[k] -= 1
        if remaining[k] == 0:
            on_chunk(k, merge_chunk(pending.pop(k)))

    try:
        with forward.context():
            if decoded is not None and decoded.matches(_batches_identity(engine.preprocess, batches, workers, engine.device)):
                loader: Iterable[Any] = decoded
            else:
                loader = image_batches(paths, engine.preprocess, batches, workers, engine.device)
            overlapped(loader, forward, lambda batch: batch[1], finish, max_batches)
    finally:
        bar.close()
    return computed


Batch = TypeVar("Batch")


def overlapped(
    batches: Iterable[Batch],
    forward: "BatchForward",
    pixels_of: Callable[[Batch], torch.Tensor | None],
    finish: Callable[[Batch, np.ndarray], None],
    max_batches: int | None = None,
) -> None:
    """Run ``forward`` on each batch, fetching batch k+1 while batch k runs; ``finish`` sees them in order.

    Decoding (DataLoader workers) and inference (OpenVINO's streams, or the GPU) then work at the
    same time instead of taking turns: with one batch in flight the inference engine always has
    the next batch queued when it finishes one, and the main process's own work (receiving a
    batch, checking and storing features) happens while the engine runs. ``max_batches`` finishes
    the batches already started, then stops with ``KeyboardInterrupt`` (how tests interrupt a run),
    exactly as the synchronous loop did.
    """
    inflight: deque[tuple[Batch, Callable[[], np.ndarray]]] = deque()

    def drain(keep: int) -> None:
        while len(inflight) > keep:
            batch, result = inflight.popleft()
            finish(batch, result())

    for n, batch in enumerate(batches):
        if max_batches is not None and n >= max_batches:
            drain(0)
            raise KeyboardInterrupt(f"stopped after {max_batches} batches")
        inflight.append((batch, forward.submit(pixels_of(batch))))
        drain(1)
    drain(0)


class BatchForward:
    """uint8 NHWC pixels -> float32 ``[B, D]`` features with what the engine runs (torch or OpenVINO)."""

    def __init__(self, model: nn.Module, engine: Engine, *, fuse: bool = True) -> None:
        self.model, self.engine = model, engine
        dev = engine.device
        self.net = prepare_model(model, dev, fuse=fuse) if engine.runner is None else None
        self.mean = torch.tensor(engine.preprocess.mean, device=dev).view(1, 3, 1, 1) * 255.0
        self.inv_std = 1.0 / (torch.tensor(engine.preprocess.std, device=dev).view(1, 3, 1, 1) * 255.0)

    def context(self):  # noqa: ANN201 - a context manager
        """inference_mode, with autocast for torch at the engine's precision."""
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(inference_autocast(self.engine.device, "fp32" if self.engine.runner is not None else self.engine.precision))
        return stack

    def submit(self, pixels: torch.Tensor | None) -> Callable[[], np.ndarray]:
        """Start a batch; the returned call gives its features (waiting for OpenVINO or the GPU only then).

        On CUDA the copy from pinned memory and the kernels are queued asynchronously and only the
        result's ``.cpu()`` waits, so the CPU decodes the next batch while the GPU runs this one;
        on the CPU under torch the work happens here, synchronously.
        """
        if pixels is None:
            return lambda: np.zeros((0, 0), dtype=np.float32)
        if self.engine.runner is not None:
            submit = getattr(self.engine.runner, "submit", None)  # uint8 NHWC in, float32 [B, D] out; normalisation inside
            if submit is not None:
                return submit(pixels)
            out = self.engine.runner(pixels)
            return lambda: out
        assert self.net is not None
        x = pixels.to(self.engine.device, non_blocking=True).permute(0, 3, 1, 2)  # NHWC memory = channels-last
        x = (x.float() - self.mean) * self.inv_std
        feats = self.net(x)
        if not isinstance(feats, torch.Tensor):
            raise ClZooError(f"{type(self.model).__name__}.forward_features returned {type(feats).__name__}, not a tensor")
        flat = feats.reshape(feats.shape[0], -1)
        return lambda: flat.float().cpu().numpy()

    def __call__(self, pixels: torch.Tensor | None) -> np.ndarray:
        return self.submit(pixels)()


def merge_chunk(parts: list[tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]) -> Chunk:
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


