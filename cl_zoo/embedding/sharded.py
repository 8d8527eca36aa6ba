"""Embedding a collection into a shard folder, with memory flat in the number of images.

The in-memory path (:func:`cl_zoo.embedding.extract_features`) keeps every chunk until the end.
Here each finished chunk is saved as a progress part and dropped; once all chunks of a shard are
on disk the shard is streamed out of them (:func:`cl_zoo.embedding.shards.write_shard`) and its
parts deleted. What stays in memory is the path list and at most one shard's pending batches.

Shard ``s`` covers input positions ``[s*S, (s+1)*S)`` (``S`` = ``shard_images``), cut into
chunks that never straddle a shard, and batches that never straddle a chunk; so a resumed run,
or ``torchrun`` ranks sharing the folder (shard ``s`` belongs to rank ``s % WORLD_SIZE``),
compute exactly the batches one uninterrupted process would, and write the same bytes.

A finished shard records, in its ``meta`` table, the model fingerprint and a digest of the run
(inputs, preprocessing, precision, shard size): ``--resume`` skips the shards that match and
refuses a folder whose shards belong to another run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from cl_zoo.arrays import file_digest, read_npy_header
from cl_zoo.embedding.extract import Engine, check_options, chunk_batches_of, decode_ahead, decoding_ahead, prepare_engine, run_batches
from cl_zoo.embedding.options import EngineOptions
from cl_zoo.embedding.parts import check_progress_folder, discard_progress
from cl_zoo.embedding.progress import (
    Chunk,
    barrier,
    changed_inputs,
    check_progress,
    chunk_stats,
    dist_info,
    load_chunk,
    open_progress,
    save_chunk,
)
from cl_zoo.embedding.shards import (
    MANIFEST_NAME,
    MAX_SHARD_MANIFEST_BYTES,
    SHARD_FORMAT,
    SHARD_FORMAT_VERSION,
    ShardRecord,
    changed_in_shard,
    default_shard_images,
    emb_name,
    meta_name,
    named_like_ours,
    our_files,
    shard_meta_fingerprint,
    unfinished_manifest,
    write_manifest,
    write_shard,
)
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import read_bounded_json, refuse_inputs_as_outputs
from cl_zoo.optional import require

PARTS_FOLDER = ".parts"


@dataclass
class ShardRun:
    """What :func:`embed_to_shards` did."""

    folder: Path
    shards: list[ShardRecord]
    seconds: float
    computed: int  # images embedded by this call
    resumed: int  # images found finished (in shards or parts) and skipped
    skipped_shards: int  # shards already finished when the call began
    dims: int
    precision: str = "fp32"
    backend: str = "torch"
    backend_reason: str = ""
    quantization: dict[str, Any] | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    changed: int = 0  # inputs whose saved progress was dropped because the file changed since (re-embedded)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.shards)

    @property
    def failures(self) -> int:
        return sum(r.failures for r in self.shards)

    @property
    def images_per_second(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else 0.0


def probe_dims(model: nn.Module, crop_size: tuple[int, int]) -> int:
    """Feature size, from one blank image through ``forward_features`` (needed before any shard is cut)."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            device = next(model.parameters()).device
            x = torch.zeros(1, 3, *crop_size, device=device)
            out = getattr(model, "forward_features", model)(x)
    finally:
        model.train(was_training)
    return int(out.reshape(1, -1).shape[1])


def run_digest(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ShardLayout:
    """Where shards and their chunks begin and end in the input list."""

    total: int
    shard_images: int
    chunk_size: int

    @property
    def shards(self) -> int:
        return math.ceil(self.total / self.shard_images)

    @property
    def chunks_per_shard(self) -> int:
        return math.ceil(self.shard_images / self.chunk_size)

    def shard_range(self, s: int) -> range:
        return range(s * self.shard_images, min((s + 1) * self.shard_images, self.total))

    def chunks_of(self, s: int) -> list[int]:
        n = math.ceil(len(self.shard_range(s)) / self.chunk_size)
        return [s * self.chunks_per_shard + j for j in range(n)]

    def chunk_range(self, k: int) -> range:
        s, j = divmod(k, self.chunks_per_shard)
        shard = self.shard_range(s)
        lo = shard.start + j * self.chunk_size
        return range(lo, min(lo + self.chunk_size, shard.stop))

    def chunk_of(self, position: int) -> int:
        s, offset = divmod(position, self.shard_images)
        return s * self.chunks_per_shard + offset // self.chunk_size

    def batches(self, chunks: Sequence[int], batch_size: int) -> list[list[int]]:
        out = []
        for k in chunks:
            r = self.chunk_range(k)
            out += [list(range(b, min(b + batch_size, r.stop))) for b in range(r.start, r.stop, batch_size)]
        return out


def finished_shard(folder: Path, s: int, fingerprint: str, digest: str) -> bool:
    """Whether shard ``s`` of this run is on disk whole; a shard of another run is an error, not a skip."""
    pq = require("pyarrow.parquet", "--out DIR/ (sharded embeddings)")

    meta, emb = folder / meta_name(s), folder / emb_name(s)
    if not meta.is_file() or not emb.is_file():
        return False
    rows, meta_fingerprint, shard = shard_meta_fingerprint(meta)
    try:
        recorded = (pq.ParquetFile(meta).schema_arrow.metadata or {}).get(b"cl_zoo.run_sha256", b"").decode()
    except Exception:  # noqa: BLE001 - shard_meta_fingerprint already read this footer
        recorded = ""
    if meta_fingerprint != fingerprint or recorded != digest or shard != s:
        raise DataError(
            f"cannot resume: {meta} belongs to another run ({'another model' if meta_fingerprint != fingerprint else 'other inputs or options'}); "
            "use another --out, or --force to discard its shards"
        )
    return read_npy_header(emb).rows == rows


def check_resumable(folder: Path, shards: int, fingerprint: str, digest: str) -> set[int]:
    """Refuse ``--resume`` into a folder holding another run's shards, before anything is written:
    its manifest (finished or not) names another run, or one of its shards belongs to one. Returns
    the shards of this run already on disk whole (:func:`finished_shard`), read once here."""
    manifest = folder / MANIFEST_NAME
    recorded = read_bounded_json(manifest, MAX_SHARD_MANIFEST_BYTES, "shard manifest") if manifest.is_file() else None
    if isinstance(recorded, dict) and recorded.get("format") == SHARD_FORMAT and recorded.get("run_sha256") not in (None, digest):
        other = "another model" if recorded.get("model_sha256") != fingerprint else "other inputs or options"
        raise DataError(f"cannot resume: {folder}/ holds the shards of another run ({other}); "
                        "use another --out, or --force to discard its shards")
    return {s for s in range(shards) if finished_shard(folder, s, fingerprint, digest)}  # raises for another run's


def check_output_folder(folder: Path, inputs: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """What a run into ``folder`` would continue (``--resume``) or delete (``--force``): cl-zoo's files
    there, recognised by content; one :class:`DataError` line when anything it would write, use or
    delete is not cl-zoo's (a foreign ``manifest.json``, a folder named ``emb_00000.npy``, a ``.parts``
    link or a ``.parts`` folder of the user's) or is one of ``inputs``."""
    if os.path.lexists(folder) and not folder.is_dir():
        raise DataError(f"--out {folder} is a file, not a folder for shards")
    parts = folder / PARTS_FOLDER
    inside = list(parts.iterdir()) if parts.is_dir() and not parts.is_symlink() else []
    refuse_inputs_as_outputs([folder / MANIFEST_NAME, *named_like_ours(folder), *inside], inputs)
    existing = our_files(folder)
    check_progress_folder(parts)
    return existing


def open_output_folder(folder: Path, *, resume: bool, force: bool, metadata: dict[str, Any], fingerprint: str, digest: str) -> bool:
    """Rank 0 makes ``folder`` ready: refuses to overwrite shards without ``resume``/``force``, deletes
    ours (and only ours, recognised by content) with ``force``, refuses a folder holding files with
    our names that are not ours, and marks the folder unfinished until the run completes. Returns
    whether this call created the folder."""
    rank, world = dist_info()
    created = False
    if rank == 0:
        existing = check_output_folder(folder)
        created = not folder.exists()
        folder.mkdir(parents=False, exist_ok=True)
        if existing and not resume and not force:
            raise DataError(
                f"{folder} already holds embedding shards ({existing[0].name}, ...); pass --resume to continue that run "
                "or --force to replace them"
            )
        if force:
            for path in existing:
                path.unlink()
        # Until the run completes the folder says so: readers refuse it instead of using some shards.
        write_manifest(folder, unfinished_manifest(metadata, fingerprint, digest))
    barrier(world)
    return created


def abandon_empty_run(folder: Path, records: Sequence[ShardRecord], *, created: bool, unreadable: str, empty: str) -> DataError:
    """The error for a run that embedded nothing, after removing what it left that holds nothing.

    Its zero-row shards and its unfinished manifest go (a folder that says "run in progress" about
    a run that ended is a trap for the next reader); failure reports stay, since the error points at
    them; the folder goes too when this run created it and it is empty. The error is ``unreadable``
    (plus where the reasons are) when inputs failed, else ``empty`` (the inputs held no images).
    """
    for record in records:
        for name in (emb_name(record.index), meta_name(record.index)):
            (folder / name).unlink(missing_ok=True)
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    if created:
        try:
            folder.rmdir()
        except OSError:
            pass  # failure reports (or the user's files) are there
    if any(r.failures for r in records):
        return DataError(f"{unreadable}; reasons in {folder}/failures_*.csv")
    return DataError(f"{empty}; nothing was written to {folder}")


def complete_manifest(metadata: dict[str, Any], engine: Engine, run: dict[str, Any], digest: str, records: Sequence[ShardRecord],
                      **fields: Any) -> dict[str, Any]:
    """The manifest of a finished run: what made it, and every shard in order."""
    return {
        "format": SHARD_FORMAT, "version": SHARD_FORMAT_VERSION, "complete": True,
        **metadata,
        "precision": engine.precision, "backend": engine.backend,
        **({"quantization": engine.quantization} if engine.quantization is not None else {}),
        "model_sha256": engine.fingerprint, "paths_sha256": run["paths_sha256"], "run_sha256": digest,
        "preprocess": run["preprocess"], "dims": run["dims"], "dtype": run["dtype"], **fields,
        "images": sum(r.images for r in records), "rows": sum(r.rows for r in records),
        "failures": sum(r.failures for r in records), "shards": [r.as_json() for r in records],
    }


def shard_record(folder: Path, s: int, layout: ShardLayout) -> ShardRecord:
    """A finished shard's manifest entry, read back from its files (the same for every rank's shards)."""
    rows = read_npy_header(folder / emb_name(s)).rows
    images = len(layout.shard_range(s))
    return ShardRecord(s, rows, images, images - rows, layout.shard_range(s).start, file_digest(folder / emb_name(s)))


def embed_to_shards(
    model: nn.Module,
    paths: Sequence[str],
    out: str | os.PathLike[str],
    *,
    metadata: dict[str, Any],
    shard_images: int | None = None,
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
    chunk_batches: int | None = None,
    fuse: bool | None = None,
    max_batches: int | None = None,
    calibration: Sequence[str] | None = None,
    calibration_size: int | None = None,
    calibration_seed: int | None = None,
    force_int8: bool | None = None,
) -> ShardRun:
    """Embed ``paths`` (kept in order) into numbered shards in ``out`` plus ``manifest.json``.

    ``metadata`` (model reference and fields, inputs) goes into the manifest. Without ``resume``
    a folder already holding shards is an error unless ``force`` (which deletes those files and
    only those). Engine settings: ``options`` (default :class:`EngineOptions`'s), each keyword given
    overriding its field. Under ``torchrun`` every rank calls this with the same arguments; rank 0 writes
    the manifest once all shards exist.
    """
    start = time.perf_counter()
    paths = [os.fspath(p) for p in paths]
    if shard_images is not None and shard_images < 1:
        raise ClZooError(f"shard size must be at least 1 image, got {shard_images}")
    folder = Path(out)
    rank, world = dist_info()
    opts = EngineOptions.merge(options, batch_size=batch_size, device=device, workers=workers, precision=precision, backend=backend,
                               fuse=fuse, calibration=calibration, calibration_size=calibration_size,
                               calibration_seed=calibration_seed, force_int8=force_int8)
    decoders, dev = check_options(opts)  # a bad setting fails before any decoder starts
    batch_size = opts.batch_size
    chunk_size = batch_size * (chunk_batches or max(1, 1024 // batch_size))
    # One process writing a new folder runs every chunk in order: decoding starts before the engine
    # (extract_features explains why). Ranks and resumes learn their chunks from the layout and the
    # folder first, and start their loader in run_batches as before.
    ahead = None
    if world == 1 and not resume:
        everything = chunk_batches_of(range(math.ceil(len(paths) / chunk_size)), chunk_size, batch_size, len(paths))
        ahead = decode_ahead(model, paths, everything, decoders, dev)
    with decoding_ahead(ahead):
        engine = prepare_engine(model, paths, opts, need_fingerprint=True)
        assert engine.fingerprint is not None
        dims = probe_dims(model, engine.preprocess.crop_size)
        itemsize = 2 if half else 4
        layout = ShardLayout(len(paths), shard_images or default_shard_images(dims, itemsize, chunk_size), chunk_size)
        run = engine.progress_manifest(model, paths, batch_size, chunk_size)
        run.update(shard_images=layout.shard_images, dtype="float16" if half else "float32", dims=dims)
        digest = run_digest(run)
        parts = folder / PARTS_FOLDER

        whole: set[int] | None = None  # this run's shards on disk, once the rank that checks has read them
        if rank == 0:  # every refusal before the first write: a refused run leaves the folder as it was
            check_output_folder(folder)
            check_progress(parts, run, resume, force)
            if resume:
                whole = check_resumable(folder, layout.shards, engine.fingerprint, digest)
        created = open_output_folder(folder, resume=resume, force=force, metadata=metadata, fingerprint=engine.fingerprint, digest=digest)
        open_progress(parts, run, resume, force, rank, world)

        if whole is None or force:  # --force has just deleted what the check found
            whole = {s for s in range(layout.shards) if resume and finished_shard(folder, s, engine.fingerprint, digest)}
        finished: set[int] = set()
        changed = 0
        for s in sorted(whole):
            stale = changed_in_shard(folder / meta_name(s), paths)  # a shard with a changed input is embedded again
            changed += stale
            if not stale:
                finished.add(s)
        mine = [s for s in range(layout.shards) if s % world == rank and s not in finished]
        resumed = sum(len(layout.shard_range(s)) for s in finished)
        done: dict[int, set[int]] = {s: set() for s in mine}
        for s in mine:
            for k in layout.chunks_of(s):
                chunk = load_chunk(parts, k) if resume else None
                stale = changed_inputs(paths, chunk) if chunk is not None else 0
                changed += stale
                if chunk is not None and not stale:  # a chunk with a changed input is embedded again
                    done[s].add(k)
                    resumed += len(layout.chunk_range(k))
                del chunk

        def ref_of(position: int) -> str:
            return paths[position]

        def parts_of(s: int) -> Iterator[Chunk]:
            for k in layout.chunks_of(s):
                chunk = load_chunk(parts, k)
                if chunk is None:
                    raise DataError(f"progress part {k} of shard {s} vanished from {parts}; rerun with --resume")
                yield chunk

        def finish(s: int) -> None:
            write_shard(folder, s, lambda: parts_of(s), ref_of, dims=dims, half=half, fingerprint=engine.fingerprint or "",
                        first_id=layout.shard_range(s).start, run_digest=digest)
            for k in layout.chunks_of(s):
                (parts / f"part-{k:05d}.npz").unlink(missing_ok=True)

        for s in mine:
            if done[s] == set(layout.chunks_of(s)):
                finish(s)  # every part was saved before an interruption, but the shard was not written

        def on_chunk(k: int, chunk: Chunk) -> None:
            chunk.stats = chunk_stats(paths, chunk)
            save_chunk(parts, k, chunk)
            s = k // layout.chunks_per_shard
            done[s].add(k)
            if done[s] == set(layout.chunks_of(s)):
                finish(s)

        todo = [k for s in mine for k in layout.chunks_of(s) if k not in done[s]]
        computed = run_batches(
            model, engine, paths, layout.batches(todo, batch_size), layout.chunk_of, on_chunk,
            workers=engine.workers, fuse=opts.fuse, max_batches=max_batches, progress=progress and rank == 0, initial=resumed,
            decoded=ahead,
        )
    barrier(world)
    records = [shard_record(folder, s, layout) for s in range(layout.shards)] if rank == 0 else []
    manifest = complete_manifest(metadata, engine, run, digest, records, shard_images=layout.shard_images)
    if rank == 0:
        if not any(r.rows for r in records):
            discard_progress(parts)
            raise abandon_empty_run(folder, records, created=created, unreadable=f"none of the {len(paths)} images could be read",
                                    empty="no images to embed")
        write_manifest(folder, manifest)
        discard_progress(parts)
    barrier(world)
    return ShardRun(
        folder, records, time.perf_counter() - start, computed, resumed, len(finished), dims, engine.precision,
        engine.backend, engine.reason, engine.quantization, manifest, changed,
    )


__all__ = ["MANIFEST_NAME", "PARTS_FOLDER", "ShardLayout", "ShardRun", "abandon_empty_run", "check_output_folder", "check_resumable", "complete_manifest",
           "embed_to_shards", "finished_shard", "open_output_folder", "probe_dims", "run_digest"]
