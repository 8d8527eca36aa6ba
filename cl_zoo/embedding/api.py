"""``cl_zoo.embed``: the one-call Python entry point.

Files, folders, path lists or tar shards (local or fsspec URLs) go through the batched loop every
consumer shares (:func:`extract_features`); in-memory images (PIL images, tensors, arrays) skip
only the decoding: they get the same resize and crop (:class:`~cl_zoo.embedding.preprocess.Preprocess`)
and run through the same normalisation and engine (:class:`~cl_zoo.embedding.extract.BatchForward`),
so an image gives the same row whether it is passed as a file or as the PIL image read from it.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Iterable, Mapping

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from cl_zoo.arrays import normalize
from cl_zoo.data.images import discover_images, to_rgb
from cl_zoo.embedding.transforms import IN_MEMORY_KINDS, is_in_memory, pil_images
from cl_zoo.embedding.checks import check_finite
from cl_zoo.embedding.extract import BatchForward, prepare_engine
from cl_zoo.embedding.options import EngineOptions
from cl_zoo.embedding.run import embed_to_output
from cl_zoo.embedding.reference import load_embedding_model
from cl_zoo.errors import ClZooError, DataError

# What ``cl_zoo.embed`` accepts, for the one-line refusal of anything else.
ACCEPTED = (
    "paths (image files, folders, path lists, WebDataset tars, URLs) or in-memory images "
    f"({IN_MEMORY_KINDS}), one or a list"
)

EmbedInput = Any  # str | os.PathLike | PIL.Image.Image | torch.Tensor | np.ndarray | an iterable of one kind


def _split_inputs(inputs: EmbedInput) -> tuple[list[str | os.PathLike[str]] | None, list[Image.Image] | None]:
    """(path specs, None) or (None, PIL images): which of the two routes ``inputs`` takes."""
    if isinstance(inputs, (str, os.PathLike)):
        return [inputs], None
    if is_in_memory(inputs):
        return None, pil_images(inputs)
    if isinstance(inputs, (bytes, bytearray, Mapping)) or not isinstance(inputs, Iterable):
        raise DataError(f"cl_zoo.embed takes {ACCEPTED}; got a {type(inputs).__name__}")
    items = list(inputs)
    if any(is_in_memory(item) for item in items):
        if any(isinstance(item, (str, os.PathLike)) for item in items):
            raise DataError("cl_zoo.embed takes a list of paths or a list of in-memory images, not both in one list")
        return None, pil_images(items)
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise DataError(f"cl_zoo.embed takes {ACCEPTED}; got a list holding a {type(item).__name__}")
    return items, None


def embed(
    paths: EmbedInput,
    model: str | os.PathLike[str] | nn.Module | None = None,
    *,
    options: EngineOptions | None = None,
    batch_size: int | None = None,
    device: str | None = None,
    workers: int | None = None,
    precision: str | None = None,
    backend: str | None = None,
    progress: bool = False,
    calibration: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None,
    force_int8: bool | None = None,
    image_key: str | None = None,
    normalize: bool = False,
) -> tuple[np.ndarray, list[str]]:
    """Embed image files, folders, path lists or WebDataset tars (local or fsspec URLs), or in-memory images; returns float32 ``[N, D]`` and the N paths.

    Tar samples are named ``<tar>#<key>``; ``image_key`` picks their image member (default
    ``jpg;jpeg;png;webp``).

    ``model`` is anything ``cl_zoo.load_model`` accepts (registered name, checkpoint folder or
    file, ``hf-hub:owner/name``) or a model object; ``None`` means the bundled default
    (``cl_zoo.registry.DEFAULT_MODEL``). Files that cannot be decoded are left out with a warning;
    if none can, :class:`DataError` is raised. ``precision``/``backend`` ``auto`` pick bf16 and
    OpenVINO where this machine runs them faster (:func:`extract_features`); features are float32.
    ``precision="int8"`` calibrates on a sample of ``paths`` (or of ``calibration``: files, folders
    or path lists) and checks neighbour recall before using int8 (``force_int8`` skips the check).
    Engine settings come from ``options`` (:class:`~cl_zoo.embedding.options.EngineOptions`, whose
    defaults are ``cl-zoo embed``'s), each keyword given here overriding its field.
    ``normalize=True`` scales every row to unit L2 norm (as ``cl-zoo search`` does before comparing),
    so dot products are cosine similarities.

    In-memory images, instead of paths: a PIL image, a torch tensor (CHW, or NCHW for a batch), a
    numpy array (HWC as ``np.asarray(pil_image)`` gives, HW for greyscale, or NHWC), or a list of
    them. Pixels are uint8 in 0-255 or floats in [0, 1] (torchvision's ``ToTensor``); floats are
    rounded to 8 bits and anything outside [0, 1] is refused (an already normalised tensor cannot
    be told apart from a bright one: pass the image before normalising). They take the files' resize,
    crop and normalisation (:func:`cl_zoo.create_transform` is the same preprocessing, one image at a
    time), in this process (they are decoded already, so ``workers`` is not used); every image gives a
    row, in input order, named ``<image i>`` in the returned list. ``precision="int8"`` needs
    ``calibration`` files for them. Anything else is refused in one :class:`DataError` line.
    """
    specs, images = _split_inputs(paths)
    if isinstance(calibration, (str, os.PathLike)):
        calibration = [calibration]
    opts = EngineOptions.merge(options, batch_size=batch_size, device=device, workers=workers, precision=precision, backend=backend,
                               force_int8=force_int8)
    if images is not None:
        if opts.precision == "int8" and calibration is None:
            raise ClZooError("precision='int8' calibrates on image files: pass calibration=<files, folders or path lists> with in-memory images")
        if calibration is not None:
            opts = EngineOptions.merge(opts, calibration=list(discover_images(calibration)))
        features = _embed_images(images, load_embedding_model(model), opts, progress=progress)
        return (_unit_rows(features) if normalize else features), [f"<image {i}>" for i in range(len(images))]
    assert specs is not None
    if calibration is not None:
        opts = EngineOptions.merge(opts, calibration=list(discover_images(calibration)))
    result = embed_to_output(specs, None, model=model, options=opts, image_key=image_key, progress=progress).result
    assert result is not None
    if not result.paths:
        raise DataError(f"none of the {len(result.failures)} images could be read (first: {result.failures[0][0]}: {result.failures[0][1]})")
    if result.failures:
        warnings.warn(
            f"skipped {len(result.failures)} unreadable images, e.g. {result.failures[0][0]}: {result.failures[0][1]}",
            stacklevel=2,
        )
    return (_unit_rows(result.features) if normalize else result.features), result.paths


def _unit_rows(features: np.ndarray) -> np.ndarray:
    return normalize(features)


def _embed_images(images: list[Image.Image], net: nn.Module, options: EngineOptions, *, progress: bool) -> np.ndarray:
    """float32 ``[N, D]`` features of decoded images: the files' preprocessing and engine, minus the decoding."""
    from tqdm import tqdm

    if not images:
        raise DataError("no images given")
    batch_size = options.batch_size
    engine = prepare_engine(net, [], options, need_fingerprint=False, images=len(images))
    forward = BatchForward(net, engine)
    names = [f"<image {i}>" for i in range(len(images))]
    parts: list[np.ndarray] = []
    bar = tqdm(total=len(images), unit="img", disable=None if progress else True, file=sys.stderr, dynamic_ncols=True)
    try:
        with forward.context():
            for start in range(0, len(images), batch_size):
                batch = images[start:start + batch_size]
                pixels = torch.from_numpy(np.stack([_pixels_of(img, engine.preprocess, names[start + i]) for i, img in enumerate(batch)]))
                feats = forward(pixels)
                check_finite(feats, names[start:start + len(batch)], net, engine.precision)
                parts.append(feats)
                bar.update(len(batch))
    finally:
        bar.close()
    return np.concatenate(parts)


def _pixels_of(img: Image.Image, preprocess: Any, name: str) -> np.ndarray:
    """uint8 HWC pixels of one image, as :class:`~cl_zoo.embedding.preprocess.ImageList` makes them from a file."""
    try:
        return preprocess(to_rgb(img))
    except OSError as exc:  # a lazily opened PIL image whose file is truncated or gone
        raise DataError(f"{name} cannot be read: {' '.join(str(exc).split())[:200]}") from None


