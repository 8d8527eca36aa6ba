"""``cl_zoo.embed``: the one-call Python entry point (files, folders, lists or tar shards in, an array out)."""

from __future__ import annotations

import os
import warnings
from typing import Iterable

import numpy as np
import torch.nn as nn

from cl_zoo.data.images import discover_images
from cl_zoo.embedding.extract import extract_features
from cl_zoo.embedding.inputs import resolve_inputs
from cl_zoo.embedding.preprocess import DEFAULT_IMAGE_KEY
from cl_zoo.embedding.reference import load_embedding_model
from cl_zoo.errors import DataError


def embed(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    model: str | os.PathLike[str] | nn.Module | None = None,
    *,
    batch_size: int = 64,
    device: str = "auto",
    workers: int | None = None,
    precision: str = "auto",
    backend: str = "auto",
    progress: bool = False,
    calibration: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None,
    force_int8: bool = False,
    image_key: str | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Embed image files, folders, path lists or WebDataset tars (local or fsspec URLs); returns float32 ``[N, D]`` and the N paths.

    Tar samples are named ``<tar>#<key>``; ``image_key`` picks their image member (default
    ``jpg;jpeg;png;webp``).

    ``model`` is anything ``cl_zoo.load_model`` accepts (registered name, checkpoint folder or
    file, ``hf-hub:owner/name``) or a model object; ``None`` means the bundled default
    (``cl_zoo.registry.DEFAULT_MODEL``). Files that cannot be decoded are left out with a warning;
    if none can, :class:`DataError` is raised. ``precision``/``backend`` ``auto`` pick bf16 and
    OpenVINO where this machine runs them faster (:func:`extract_features`); features are float32.
    ``precision="int8"`` calibrates on a sample of ``paths`` (or of ``calibration``: files, folders
    or path lists) and checks neighbour recall before using int8 (``force_int8`` skips the check).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found = resolve_inputs(list(paths))
    files = found.files
    if isinstance(calibration, (str, os.PathLike)):
        calibration = [calibration]
    calibration_files = list(discover_images(calibration)) if calibration is not None else None
    net = load_embedding_model(model)
    if found.is_webdataset:
        from cl_zoo.embedding.tars import extract_tar_features

        result = extract_tar_features(
            net, found.tars, image_key=image_key or DEFAULT_IMAGE_KEY, batch_size=batch_size, device=device, workers=workers,
            precision=precision, backend=backend, progress=progress, calibration=calibration_files, force_int8=force_int8,
        )
    else:
        result = extract_features(
            net, files, batch_size=batch_size, device=device, workers=workers, precision=precision, backend=backend,
            progress=progress, calibration=calibration_files, force_int8=force_int8,
        )
    if not result.paths:
        raise DataError(f"none of the {len(result.failures)} images could be read (first: {result.failures[0][0]}: {result.failures[0][1]})")
    if result.failures:
        warnings.warn(
            f"skipped {len(result.failures)} unreadable images, e.g. {result.failures[0][0]}: {result.failures[0][1]}",
            stacklevel=2,
        )
    return result.features, result.paths


