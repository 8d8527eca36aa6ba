"""Decode a dataset once into one uint8 tensor ``[N, 3, S, S]`` kept in memory (and on disk).

Small-image pretraining (CIFAR, STL, Imagenette at 128 px) is bound by JPEG decoding and per-image
Python transforms, not by the GPU. Decoding everything once and augmenting whole batches on the
device (:mod:`cl_zoo.data.augment`) removes both costs; the ``.npy`` cache makes the second run start
in the time it takes to read the file.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from cl_zoo.data.archive import cache_root
from cl_zoo.data.workers import default_workers
from cl_zoo.errors import DataError
from cl_zoo.fileio import atomic_save_npy, open_regular_file

_CHUNK = 256  # images per thread task: large enough that scheduling overhead vanishes


def decode_square(path: str, size: int) -> np.ndarray:
    """RGB ``[3, size, size]``: shorter side resized to ``size`` (bilinear, antialiased) then centre crop."""
    try:
        with open_regular_file(path) as fh, Image.open(fh) as img:
            if img.size != (size, size):
                # JPEG DCT scaling: decode at >= the target size instead of full resolution.
                img.draft("RGB", (size, size))
            img = img.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError(f"cannot decode image {path}: {exc}") from None
    w, h = img.size
    if (w, h) != (size, size):
        # torchvision's Resize(int) rule: the longer side is truncated, not rounded.
        nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        img = img.resize((nw, nh), Image.BILINEAR, reducing_gap=None)
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _cache_file(paths: Sequence[str], size: int, cache_key: str | None, cache_dir: Path) -> Path:
    # The key also covers the total byte size so a re-encoded copy with the same names is not reused.
    total = sum(os.path.getsize(p) for p in paths)
    if cache_key is None:
        cache_key = hashlib.sha256("\n".join(os.path.abspath(p) for p in paths).encode()).hexdigest()
    digest = hashlib.sha256(f"{cache_key}|{size}|{len(paths)}|{total}".encode()).hexdigest()[:24]
    return cache_dir / f"{digest}-{len(paths)}x3x{size}x{size}.npy"


def default_tensor_cache_dir() -> Path:
    return cache_root() / "decoded"


def decode_to_tensor(
    paths: Sequence[str],
    size: int,
    workers: int | None = None,
    *,
    cache_key: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    progress: bool = True,
) -> torch.Tensor:
    """Decode ``paths`` into a ``torch.uint8`` tensor ``[N, 3, size, size]`` in ``paths`` order.

    ``cache_key`` is normally :attr:`ImageFolderData.file_list_hash`, which makes the cache valid
    for any extracted copy of the same data; without it the absolute paths are hashed.
    """
    if size <= 0:
        raise DataError(f"image size must be positive, got {size}")
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise DataError("no images to decode")
    missing = next((p for p in paths if not os.path.isfile(p)), None)
    if missing is not None:
        raise DataError(f"image not found: {missing}")
    cache_file: Path | None = None
    if use_cache:
        cache_file = _cache_file(paths, size, cache_key, Path(cache_dir) if cache_dir else default_tensor_cache_dir())
        if cache_file.is_file():
            try:
                arr = np.load(cache_file, allow_pickle=False)
                if arr.shape == (len(paths), 3, size, size) and arr.dtype == np.uint8:
                    return torch.from_numpy(arr)
            except (OSError, ValueError):
                pass  # a damaged cache file is rebuilt below
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)

    def work(start: int) -> int:
        stop = min(start + _CHUNK, len(paths))
        for i in range(start, stop):
            out[i] = decode_square(paths[i], size)
        return stop - start

    if not workers:
        workers = default_workers()
    starts = range(0, len(paths), _CHUNK)
    from cl_zoo.progress import Progress

    bar = Progress(len(paths), desc=f"decoding {size}px", unit="img", enabled=progress, leave=False)
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # PIL releases the GIL while decoding
            for done in pool.map(work, starts):
                bar.update(done)
    finally:
        bar.close()
    if cache_file is not None:
        _save_atomic(out, cache_file)
    return torch.from_numpy(out)


def _save_atomic(arr: np.ndarray, target: Path) -> None:
    try:
        atomic_save_npy(target, arr)
    except OSError:
        pass  # an unwritable cache only costs decoding again next time


def load_folder_tensor(data, size: int, workers: int | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 [N,3,S,S], labels int64 [N])`` for an :class:`ImageFolderData`, cached by its hash."""
    images = decode_to_tensor(data.paths, size, workers, cache_key=data.file_list_hash, **kwargs)
    return images, torch.from_numpy(np.asarray(data.labels, dtype=np.int64))
