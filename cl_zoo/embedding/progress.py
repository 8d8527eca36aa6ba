"""Progress files: the fixed chunks that make a run resumable and shardable across ``torchrun`` ranks.

The path list is cut into fixed chunks of whole batches. A chunk is the unit of progress files,
of ``--resume`` and of ``torchrun`` sharding, and because batches never straddle chunks, a resumed
or sharded run computes exactly the batches an uninterrupted single process would, so its output
is the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.embedding.engine import (
    model_fingerprint,
)
from cl_zoo.embedding.parts import MAX_PROGRESS_MANIFEST_BYTES, PROGRESS_MANIFEST, check_progress_folder, discard_progress
from cl_zoo.embedding.preprocess import (
    Preprocess,
)
from cl_zoo.data.images import is_url
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import atomic_path, atomic_write_text, read_bounded_json
from cl_zoo.torchrun import torchrun_env



@dataclass
class Chunk:
    features: np.ndarray
    indices: np.ndarray
    fail_indices: np.ndarray
    fail_reasons: list[str]
    # int64 [n, 3]: (input position, size, mtime_ns) of every input of the chunk when it was saved;
    # None in a part an earlier version saved.
    stats: np.ndarray | None = None


# What an input that cannot be stat'ed (a URL, a tar member, a file gone) records: it is never "changed".
NO_STAT = (-1, -1)


def input_stat(path: str) -> tuple[int, int]:
    """(size, mtime_ns) of a local input file; :data:`NO_STAT` for anything else."""
    if is_url(path):
        return NO_STAT
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return NO_STAT
    return st.st_size, st.st_mtime_ns


def chunk_stats(paths: Sequence[str], chunk: Chunk) -> np.ndarray:
    """The stats :class:`Chunk` records for its inputs (embedded and failed), read now."""
    positions = sorted(int(i) for i in (*chunk.indices, *chunk.fail_indices))
    return np.array([(i, *input_stat(paths[i])) for i in positions], dtype=np.int64).reshape(-1, 3)


def changed_inputs(paths: Sequence[str], chunk: Chunk) -> int:
    """How many of a saved chunk's inputs differ now (size or mtime_ns) from when it was saved.

    A part that records no stats (an earlier version's) counts as unchanged: there is nothing to
    compare it against.
    """
    if chunk.stats is None:
        return 0
    return sum(1 for i, size, mtime in chunk.stats.tolist()
               if (size, mtime) != NO_STAT and (i >= len(paths) or input_stat(paths[i]) != (size, mtime)))



def dist_info() -> tuple[int, int]:
    env = torchrun_env()
    return env.rank, env.world_size


def barrier(world: int) -> None:
    if world <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()


def save_chunk(folder: Path, k: int, chunk: Chunk) -> None:
    with atomic_path(folder / f"part-{k:05d}.npz", suffix=".npz", mkdir=False) as tmp, open(tmp, "wb") as fh:
        np.savez(
            fh,
            features=chunk.features,
            indices=chunk.indices,
            fail_indices=chunk.fail_indices,
            fail_reasons=np.array(chunk.fail_reasons, dtype=np.str_),
            **({"stats": chunk.stats} if chunk.stats is not None else {}),
        )


def load_chunk(folder: Path, k: int) -> Chunk | None:
    path = folder / f"part-{k:05d}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            stats = z["stats"] if "stats" in z.files else None
            chunk = Chunk(z["features"], z["indices"], z["fail_indices"], [str(r) for r in z["fail_reasons"]], stats)
    except (OSError, ValueError, KeyError, EOFError):
        return None  # a damaged part is simply recomputed
    if chunk.features.dtype.kind != "f" or not np.isfinite(chunk.features).all():
        return None  # likewise a part whose features are not usable numbers
    if chunk.stats is not None and (chunk.stats.dtype.kind != "i" or chunk.stats.ndim != 2 or chunk.stats.shape[1] != 3):
        return None
    return chunk


def paths_digest(paths: Sequence[str]) -> str:
    """sha256 of the path list that no file name can make ambiguous.

    Newline-joined (as progress folders always recorded it) while no name holds a newline, which
    makes the join one-to-one; otherwise a JSON list, marked by a leading newline that no joined
    list of non-empty names starts with.
    """
    if any("\n" in p for p in paths):
        text = "\n" + json.dumps(list(paths))
    else:
        text = "\n".join(paths)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def progress_manifest(paths: Sequence[str], model: nn.Module, preprocess: Preprocess, batch_size: int, chunk_size: int, precision: str, device: torch.device, backend: str = "torch", fingerprint: str | None = None) -> dict[str, Any]:
    return {
        "count": len(paths),
        "paths_sha256": paths_digest(paths),
        "model_sha256": fingerprint or model_fingerprint(model),
        "preprocess": [preprocess.resize_size, list(preprocess.crop_size), preprocess.interpolation, list(preprocess.mean), list(preprocess.std)],
        "batch_size": batch_size,
        "chunk_size": chunk_size,
        "precision": precision,
        "backend": backend,
        "device_type": device.type,
    }


@dataclass(frozen=True)
class SavedProgress:
    """What an interrupted run left in its progress folder."""

    images: int  # images (embedded or failed) in finished parts
    total: int  # images of the whole run
    parts: int  # finished part files

    def __str__(self) -> str:
        return f"{self.images} of {self.total} images in {self.parts} part{'s' if self.parts != 1 else ''}"


def saved_progress(folder: str | os.PathLike[str]) -> SavedProgress | None:
    """The finished parts in ``folder``, or ``None`` when there are none (nothing to lose)."""
    folder = Path(folder)
    parts = sorted(folder.glob("part-*.npz")) if folder.is_dir() else []
    if not parts:
        return None
    try:
        total = int(read_bounded_json(folder / PROGRESS_MANIFEST, max_bytes=MAX_PROGRESS_MANIFEST_BYTES, what="progress manifest")["count"])
    except (ClZooError, ValueError, KeyError, TypeError):
        total = 0
    images = 0
    for part in parts:
        chunk = load_chunk(folder, int(part.stem.partition("-")[2]))
        if chunk is not None:
            images += len(chunk.indices) + len(chunk.fail_indices)
    return SavedProgress(images=images, total=max(total, images), parts=len(parts))


def check_progress(folder: Path, manifest: dict[str, Any], resume: bool, force: bool) -> None:
    """Refuse, without writing anything, a run that may not use the progress folder as it is.

    Saved parts are hours of work on a large folder, so starting over on top of them needs
    ``force`` (a forgotten ``--resume`` is an error, not a silent restart), and ``resume`` needs
    progress made by this very run (inputs, model, preprocessing, batching).
    """
    check_progress_folder(folder)  # a folder of somebody else's is neither used nor deleted
    kept = None if resume or force else saved_progress(folder)
    if kept is not None:
        raise DataError(
            f"{folder} holds saved progress of an interrupted run ({kept}); "
            "pass --resume to continue it or --force to discard it and start over"
        )
    existing = folder / PROGRESS_MANIFEST
    if resume and existing.is_file():
        try:
            old = read_bounded_json(existing, max_bytes=MAX_PROGRESS_MANIFEST_BYTES, what="progress manifest")
        except ClZooError:
            old = None
        if old != manifest:
            changed = sorted(k for k in manifest if not isinstance(old, dict) or old.get(k) != manifest[k])
            raise DataError(
                f"cannot resume: progress in {folder} was made with different {', '.join(changed)}; "
                "run without --resume to start over"
            )


def open_progress(folder: Path, manifest: dict[str, Any], resume: bool, force: bool, rank: int, world: int) -> None:
    """Create (or, with ``resume``, continue) the progress folder once :func:`check_progress` allows it; rank 0 owns it."""
    if rank == 0:
        check_progress(folder, manifest, resume, force)
        existing = folder / PROGRESS_MANIFEST
        if not (resume and existing.is_file()):
            discard_progress(folder)
            folder.mkdir(parents=True)
            atomic_write_text(existing, json.dumps(manifest, indent=1), mkdir=False)
    barrier(world)
