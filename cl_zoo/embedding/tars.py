"""Embedding WebDataset tar shards: each input tar becomes one output shard.

A tar is read front to back (webdataset's iterators, :class:`~cl_zoo.embedding.preprocess.TarBatches`),
so its samples are known only as they stream past: there is no random access to cut it into the
fixed chunks that path lists use. The tar is therefore the unit of everything here. With
``--out DIR/``, input tar ``t`` gives ``emb_t``/``meta_t`` (its rows named ``<tar>#<key>``, ``id``
the sample's position in the tar), a resumed run skips the tars whose shard is finished, and
``torchrun`` rank ``r`` reads the tars ``t % WORLD_SIZE == r``. DataLoader workers each read whole
tars (``TarBatches`` deals tars to workers), so a tar is downloaded once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.arrays import file_digest, read_npy_header
from cl_zoo.embedding.checks import check_finite
from cl_zoo.embedding.extract import (
    BatchForward,
    DecodeAhead,
    Engine,
    FeatureResult,
    check_options,
    decoding_ahead,
    overlapped,
    prefetch_batches,
    prepare_engine,
)
from cl_zoo.embedding.options import EngineOptions
from cl_zoo.embedding.preprocess import DEFAULT_IMAGE_KEY, Preprocess, TarBatch, TarBatches, parse_image_key
from cl_zoo.embedding.progress import Chunk, barrier, dist_info
from cl_zoo.embedding.sharded import (
    ShardRun,
    abandon_empty_run,
    check_resumable,
    complete_manifest,
    finished_shard,
    open_output_folder,
    probe_dims,
    run_digest,
)
from cl_zoo.embedding.shards import (
    ShardRecord,
    emb_name,
    meta_name,
    write_manifest,
    write_shard,
)
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.optional import require

# Failed samples have no row; their ids in a chunk are this plus their order among the failures.
FAILURE_IDS = 1 << 40


def sample_ref(tar: str, key: str) -> str:
    """How a tar sample is named in outputs and failure reports."""
    return f"{tar}#{key}"


def tar_loader(tars: Sequence[tuple[int, str]], preprocess: Preprocess, batch_size: int, image_key: str, workers: int,
               device: torch.device) -> torch.utils.data.DataLoader:
    """The decoded batches of ``tars``: at most one worker per tar, the same decoded-image budget as path lists."""
    workers = min(workers, len(tars))
    return torch.utils.data.DataLoader(
        TarBatches(tars, preprocess, batch_size, image_key), batch_size=None, num_workers=workers,
        pin_memory=device.type == "cuda", prefetch_factor=prefetch_batches(workers, batch_size),
    )


def _tars_identity(tars: Sequence[tuple[int, str]], preprocess: Preprocess, batch_size: int, image_key: str, workers: int,
                   device: torch.device) -> tuple[Any, ...]:
    return (list(tars), preprocess, batch_size, image_key, min(workers, len(tars)), device.type)


def tar_decode_ahead(model: nn.Module, tars: Sequence[tuple[int, str]], batch_size: int, image_key: str, workers: int,
                     device: torch.device) -> DecodeAhead | None:
    """Start reading and decoding ``tars`` before the engine is prepared (as path lists do,
    :func:`~cl_zoo.embedding.extract.decode_ahead`); None where nothing would run ahead.

    ``workers`` and ``device`` as :func:`check_tar_options` gives them.
    """
    if not tars or workers == 0:
        return None
    preprocess = Preprocess.from_model(model)
    return DecodeAhead(tar_loader(tars, preprocess, batch_size, image_key, workers, device),
                       _tars_identity(tars, preprocess, batch_size, image_key, workers, device))


def run_tar_batches(
    model: nn.Module,
    engine: Engine,
    tars: Sequence[tuple[int, str]],
    on_tar: Callable[[int, Chunk, dict[int, str]], None],
    *,
    batch_size: int,
    image_key: str,
    fuse: bool = True,
    max_batches: int | None = None,
    progress: bool = False,
    decoded: DecodeAhead | None = None,
) -> int:
    """Embed every sample of ``tars``; each finished tar goes to ``on_tar(t, chunk, refs)``.

    ``chunk.indices`` are the decoded samples' positions in the tar, ``refs`` maps every id of the
    chunk (failures included) to its ``<tar>#<key>`` name. Returns the images embedded.
    ``decoded``: decoding started ahead of the engine (:func:`tar_decode_ahead`), used where it
    matches these tars and settings.
    """
    from tqdm import tqdm

    if not tars:
        return 0
    forward = BatchForward(model, engine, fuse=fuse)
    if decoded is not None and decoded.matches(_tars_identity(tars, engine.preprocess, batch_size, image_key, engine.workers,
                                                              engine.device)):
        loader: Any = decoded
    else:
        loader = tar_loader(tars, engine.preprocess, batch_size, image_key, engine.workers, engine.device)
    url = dict(tars)
    pending: dict[int, tuple[list[np.ndarray], list[int], dict[int, str], list[str]]] = {}
    bar = tqdm(total=None, unit="img", disable=None if progress else True, file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
    computed = 0

    def finish(batch: TarBatch, features: np.ndarray) -> None:
        nonlocal computed
        t, keys, _, failures, last, ordinals = batch
        feats, ids, refs, reasons = pending.setdefault(t, ([], [], {}, []))
        if keys:
            check_finite(features, [sample_ref(url[t], k) for k in keys], model, engine.precision)
            feats.append(features)
            ids += ordinals
            refs.update((o, sample_ref(url[t], k)) for o, k in zip(ordinals, keys))
        for key, reason in failures:
            refs[FAILURE_IDS + len(reasons)] = sample_ref(url[t], key)
            reasons.append(reason)
        computed += len(keys)
        bar.update(len(keys) + len(failures))
        if last:
            feats, ids, refs, reasons = pending.pop(t)
            dim = feats[0].shape[1] if feats else 0
            chunk = Chunk(
                features=np.concatenate(feats).astype(np.float32, copy=False) if feats else np.zeros((0, dim), np.float32),
                indices=np.asarray(ids, dtype=np.int64),
                fail_indices=np.arange(FAILURE_IDS, FAILURE_IDS + len(reasons), dtype=np.int64),
                fail_reasons=reasons,
            )
            on_tar(t, chunk, refs)

    try:
        with forward.context():
            overlapped(loader, forward, lambda batch: batch[2] if batch[1] else None, finish, max_batches)
    finally:
        bar.close()
    return computed


def check_tar_options(options: EngineOptions) -> tuple[int, torch.device]:
    """The decode workers and device, or a one-line error for a setting WebDataset input cannot run, before any decoder starts."""
    if options.precision == "int8" and not options.calibration:
        raise ClZooError("--precision int8 with WebDataset shards needs --calibration images (files or folders) to quantize on")
    return check_options(options)


def tar_engine(model: nn.Module, tars: Sequence[str], options: EngineOptions) -> Engine:
    """The engine for ``tars`` (options already passed :func:`check_tar_options`)."""
    return prepare_engine(model, list(options.calibration or []), options, need_fingerprint=True, images=len(tars) * 1000)


def extract_tar_features(
    model: nn.Module,
    tars: Sequence[str],
    *,
    options: EngineOptions | None = None,
    image_key: str = DEFAULT_IMAGE_KEY,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    workers: int | None = None,
    precision: str | None = None,
    backend: str | None = None,
    progress: bool = False,
    fuse: bool | None = None,
    max_batches: int | None = None,
    calibration: Sequence[str] | None = None,
    calibration_size: int | None = None,
    calibration_seed: int | None = None,
    force_int8: bool | None = None,
) -> FeatureResult:
    """Every sample of ``tars`` in memory, in tar order (for a single-file output).

    Engine settings: ``options`` (default :class:`EngineOptions`'s), each keyword given overriding its field.
    """
    start = time.perf_counter()
    parse_image_key(image_key)
    opts = EngineOptions.merge(options, batch_size=batch_size, device=device, workers=workers, precision=precision, backend=backend,
                               fuse=fuse, calibration=calibration, calibration_size=calibration_size,
                               calibration_seed=calibration_seed, force_int8=force_int8)
    decoders, dev = check_tar_options(opts)
    numbered = list(enumerate(tars))
    # reading and decoding start while the engine is prepared
    with decoding_ahead(tar_decode_ahead(model, numbered, opts.batch_size, image_key, decoders, dev)) as ahead:
        engine = tar_engine(model, tars, opts)
        done: dict[int, tuple[Chunk, dict[int, str]]] = {}
        computed = run_tar_batches(model, engine, numbered, lambda t, c, r: done.__setitem__(t, (c, r)), batch_size=opts.batch_size,
                                   image_key=image_key, fuse=opts.fuse, max_batches=max_batches, progress=progress, decoded=ahead)
    ordered = [done[t] for t in range(len(tars))]
    dims = {c.features.shape[1] for c, _ in ordered if len(c.indices)}
    dim = dims.pop() if dims else 0
    feats = [c.features for c, _ in ordered if len(c.indices)]
    result = FeatureResult(
        features=np.ascontiguousarray(np.concatenate(feats) if feats else np.zeros((0, dim), np.float32), dtype=np.float32),
        indices=np.concatenate([c.indices for c, _ in ordered]) if ordered else np.zeros(0, np.int64),
        paths=[r[int(i)] for c, r in ordered for i in c.indices],
        failures=[(r[int(i)], reason) for c, r in ordered for i, reason in zip(c.fail_indices, c.fail_reasons)],
        seconds=time.perf_counter() - start, computed=computed,
    )
    engine.describe(result)
    return result


def embed_tars_to_shards(
    model: nn.Module,
    tars: Sequence[str],
    out: str | os.PathLike[str],
    *,
    metadata: dict[str, Any],
    image_key: str = DEFAULT_IMAGE_KEY,
    half: bool = False,
    options: EngineOptions | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    workers: int | None = None,
    precision: str | None = None,
    backend: str | None = None,
    progress: bool = False,
    resume: bool = False,
    force: bool = False,
    fuse: bool | None = None,
    max_batches: int | None = None,
    calibration: Sequence[str] | None = None,
    calibration_size: int | None = None,
    calibration_seed: int | None = None,
    force_int8: bool | None = None,
) -> ShardRun:
    """One output shard per input tar, in ``out``, plus ``manifest.json``; see the module docstring.

    Engine settings: ``options`` (default :class:`EngineOptions`'s), each keyword given overriding its field.
    """
    start = time.perf_counter()
    tars = [os.fspath(t) for t in tars]
    parse_image_key(image_key)
    folder = Path(out)
    rank, world = dist_info()
    opts = EngineOptions.merge(options, batch_size=batch_size, device=device, workers=workers, precision=precision, backend=backend,
                               fuse=fuse, calibration=calibration, calibration_size=calibration_size,
                               calibration_seed=calibration_seed, force_int8=force_int8)
    decoders, dev = check_tar_options(opts)
    # Without --resume, one process reads every tar: decoding can start before the engine (a resume
    # learns from the engine's digest which shards are finished; torchrun ranks wait for each other).
    ahead = tar_decode_ahead(model, list(enumerate(tars)), opts.batch_size, image_key, decoders, dev) if not resume and world == 1 else None
    with decoding_ahead(ahead):
        return _tars_to_shards(model, tars, folder, opts, ahead, metadata=metadata, image_key=image_key, half=half, progress=progress,
                               resume=resume, force=force, max_batches=max_batches, start=start)


def _tars_to_shards(model: nn.Module, tars: list[str], folder: Path, opts: EngineOptions, ahead: DecodeAhead | None, *,
                    metadata: dict[str, Any], image_key: str, half: bool, progress: bool, resume: bool, force: bool,
                    max_batches: int | None, start: float) -> ShardRun:
    rank, world = dist_info()
    batch_size = opts.batch_size
    engine = tar_engine(model, tars, opts)
    assert engine.fingerprint is not None
    dims = probe_dims(model, engine.preprocess.crop_size)
    run = engine.progress_manifest(model, tars, batch_size, 0)
    run.update(image_key=image_key, dtype="float16" if half else "float32", dims=dims, input="webdataset")
    digest = run_digest(run)
    skipped: set[int] | None = None
    if rank == 0 and resume:  # before the first write: a refused resume leaves the folder as it was
        skipped = check_resumable(folder, len(tars), engine.fingerprint, digest)
    created = open_output_folder(folder, resume=resume, force=force, metadata=metadata, fingerprint=engine.fingerprint, digest=digest)

    if skipped is None or force:  # --force has just deleted what the check found
        skipped = {t for t in range(len(tars)) if resume and finished_shard(folder, t, engine.fingerprint, digest)}
    mine = [(t, tars[t]) for t in range(len(tars)) if t % world == rank and t not in skipped]
    def on_tar(t: int, chunk: Chunk, refs: dict[int, str]) -> None:
        write_shard(folder, t, lambda: [chunk], refs.__getitem__, dims=dims, half=half, fingerprint=engine.fingerprint or "",
                    first_id=0, run_digest=digest, source=tars[t])

    computed = run_tar_batches(model, engine, mine, on_tar, batch_size=batch_size, image_key=image_key, fuse=opts.fuse,
                               max_batches=max_batches, progress=progress and rank == 0, decoded=ahead)
    barrier(world)
    records: list[ShardRecord] = []
    if rank == 0:
        pq = require("pyarrow.parquet", "reading WebDataset tar shards", extra="remote")

        for t, tar in enumerate(tars):
            rows = read_npy_header(folder / emb_name(t)).rows
            # write_shard recorded the tar's failures in its meta footer (a failure CSV's lines are not rows:
            # a quoted key may hold a line break)
            footer = pq.ParquetFile(folder / meta_name(t)).schema_arrow.metadata or {}
            text = footer.get(b"cl_zoo.failures", b"0").decode("utf-8", "replace") or "0"
            if not (text.isascii() and text.isdigit() and len(text) <= 18):  # a resumed shard's footer is a file like any other
                raise DataError(f"{folder / meta_name(t)} records {text[:40]!r} failures, not a count; it was changed or "
                                "damaged: embed again with --force")
            failures = int(text)
            records.append(ShardRecord(t, rows, rows + failures, failures, 0, file_digest(folder / emb_name(t)), tar))
        if not any(r.rows for r in records):
            raise abandon_empty_run(folder, records, created=created, empty=f"the {len(tars)} WebDataset shard(s) hold no samples",
                                    unreadable=f"none of the samples in the {len(tars)} WebDataset shard(s) could be read")
    manifest = complete_manifest(metadata, engine, run, digest, records, input="webdataset", image_key=image_key)
    if rank == 0:
        write_manifest(folder, manifest)
    barrier(world)
    resumed = sum(r.images for r in records if r.index in skipped)
    return ShardRun(folder, records, time.perf_counter() - start, computed, resumed, len(skipped), dims, engine.precision,
                    engine.backend, engine.reason, engine.quantization, manifest)


__all__ = ["FAILURE_IDS", "embed_tars_to_shards", "extract_tar_features", "run_tar_batches", "sample_ref", "tar_decode_ahead",
           "tar_loader"]
