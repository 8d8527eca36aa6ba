"""A model's evaluation preprocessing as one call, in timm's vocabulary.

``resolve_data_config(model)`` gives the dict ``timm.data.resolve_model_data_config`` gives
(``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``), and
``create_transform(model)`` a torchvision transform from a PIL image to the normalised CHW float
tensor the model is fed, so code written for timm models works on zoo models unchanged. (timm's own
functions work on zoo models too: ``PretrainedCfg`` reads as the dict timm expects.)

What ``create_transform`` returns is the preprocessing of ``cl-zoo embed``, not a copy of it: the
same :class:`~cl_zoo.embedding.preprocess.Preprocess` (shorter side to ``round(W / crop_pct)``
with the model's filter, centre crop) and the same normalisation arithmetic as the embedding loop
(``(uint8 - 255 * mean) / (255 * std)``), so ``model(create_transform(model)(img)[None])`` is the
row ``cl_zoo.embed(img, model)`` returns. It differs from timm's transform for the same config in
two places, both measured by ``tests/embedding/test_transforms.py``:

* ``Preprocess`` resamples only the pixels inside the crop (PIL's ``resize(box=...)``) instead of
  resizing the whole image and cropping; the filter is the same, its fixed-point rounding is not,
  so about 0.2% of values come out one uint8 level apart (at most ``1 / (255 * std)`` after
  normalisation), and ``(x / 255 - mean) / std`` versus our arithmetic differs by float rounding;
* timm resizes to ``floor(W / crop_pct)``, cl-zoo to ``round(W / crop_pct)`` (what every stored
  embedding was made with). They agree for every registered model (224 px at 0.875 -> 256, 64 px at
  0.875 -> 73, 32 px at 1.0 -> 32); a config where they do not (96 px at 0.875: 110 here, 109 in
  timm) gets cl-zoo's size from this module.

Files embedded by ``cl-zoo embed`` are JPEG-decoded in draft mode (libjpeg's DCT scaling) when they
are at least twice the needed size; a PIL image handed to ``create_transform`` or ``cl_zoo.embed``
was decoded by the caller, in full, so large JPEGs can differ slightly between the two routes.

In-memory images (:func:`pil_images`) are PIL images, torch tensors (CHW/NCHW) and numpy arrays
(HW/HWC/NHWC): uint8 in 0-255, or floats in [0, 1] (torchvision's ``ToTensor`` convention),
which are rounded to 8 bits (``round(x * 255)``, the exact inverse of ``ToTensor``) and then take
the very path a decoded file takes. A float tensor outside [0, 1] is refused, never guessed to be
already normalised: undoing someone else's normalisation would need statistics we cannot know.
"""

from __future__ import annotations

import os
import types
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from cl_zoo.checkpoint.checks import validate_pretrained_cfg
from cl_zoo.checkpoint.folder import config_pretrained_cfg, read_config
from cl_zoo.data.images import to_rgb
from cl_zoo.embedding.preprocess import Preprocess
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.factory import load_pretrained
from cl_zoo.registry import PretrainedCfg, find_arch, find_pretrained

if TYPE_CHECKING:
    from torchvision import transforms

# The keys of timm's data config (timm/data/config.py resolve_data_config), in its order.
DATA_KEYS: tuple[str, ...] = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
# timm's defaults for keys a pretrained_cfg lacks (timm/data/config.py and timm/data/constants.py).
_TIMM_DEFAULTS: dict[str, Any] = {
    "input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225), "crop_pct": 0.875, "crop_mode": "center",
}
# timm's resolve_data_config ``args`` that set a data config key (``img_size`` is a square input_size).
_OVERRIDES: tuple[str, ...] = (*DATA_KEYS, "img_size")

IN_MEMORY_KINDS = (
    "PIL images, torch tensors (CHW or NCHW) or numpy arrays (HW, HWC or NHWC), uint8 0-255 or float 0-1"
)


class DataConfigError(ClZooError):
    """A data config (or an override of one) cl-zoo's preprocessing cannot carry out."""


# ---------------------------------------------------------------------------------------------
# In-memory images
# ---------------------------------------------------------------------------------------------


def is_in_memory(obj: object) -> bool:
    """Whether ``obj`` is one in-memory image or batch (not a path, not a list).

    A numpy array of strings is a list of paths (``df["path"].to_numpy()``), not pixels.
    """
    if isinstance(obj, np.ndarray):
        return obj.dtype.kind in "biuf"
    return isinstance(obj, (Image.Image, torch.Tensor))


def _pixels(array: np.ndarray, what: str) -> np.ndarray:
    """uint8 pixels of an array, by the one rule: uint8 as is, floats in [0, 1] rounded to 8 bits."""
    if array.dtype == np.uint8:
        return array
    if not np.issubdtype(array.dtype, np.floating):
        raise DataError(f"{what} has dtype {array.dtype}; pixels are uint8 (0-255) or float (0-1)")
    if array.size:
        lo, hi = float(np.min(array)), float(np.max(array))
        if not (np.isfinite(lo) and np.isfinite(hi)) or lo < 0.0 or hi > 1.0:
            raise DataError(
                f"{what} holds floats in [{lo:.4g}, {hi:.4g}]; float pixels must lie in [0, 1] (as torchvision's "
                "ToTensor gives them): pass the image before any Normalize, cl-zoo normalises with the model's own mean/std"
            )
    return np.rint(array.astype(np.float32) * np.float32(255.0)).astype(np.uint8)


def _hwc_images(batch: np.ndarray, what: str) -> list[Image.Image]:
    """``[N, H, W, C]`` uint8 (C 1, 3 or 4) -> N PIL images (L, RGB, RGBA)."""
    n, h, w, c = batch.shape
    if h == 0 or w == 0:
        raise DataError(f"{what} has an empty image ({h}x{w} pixels)")
    # fromarray reads the mode off the shape: HW -> L, HW3 -> RGB, HW4 -> RGBA.
    return [Image.fromarray(np.ascontiguousarray(img[..., 0] if c == 1 else img)) for img in batch]


def _tensor_images(tensor: torch.Tensor, what: str) -> list[Image.Image]:
    shape = tuple(tensor.shape)
    if tensor.ndim not in (3, 4) or shape[-3] not in (1, 3, 4):
        hint = "; permute(2, 0, 1) it, or pass it as a numpy array" if tensor.ndim == 3 and shape[-1] in (1, 3, 4) else ""
        raise DataError(f"{what} has shape {shape}; tensors are CHW or NCHW with 1, 3 or 4 channels (torch's layout){hint}")
    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        t = t.float()
    batch = t if t.ndim == 4 else t[None]
    return _hwc_images(_pixels(batch.permute(0, 2, 3, 1).numpy(), what), what)


def _array_images(array: np.ndarray, what: str) -> list[Image.Image]:
    shape = array.shape
    if array.ndim == 2:
        batch = array[None, :, :, None]
    elif array.ndim in (3, 4) and shape[-1] in (1, 3, 4):
        batch = array if array.ndim == 4 else array[None]
    else:
        hint = "; transpose(1, 2, 0) it, or pass it as a torch tensor" if array.ndim == 3 and shape[0] in (1, 3, 4) else ""
        raise DataError(
            f"{what} has shape {shape}; numpy arrays are HW, HWC or NHWC with 1, 3 or 4 channels (PIL's layout){hint}"
        )
    return _hwc_images(_pixels(batch, what), what)


def pil_images(obj: Any, what: str = "image") -> list[Image.Image]:
    """The images in ``obj`` (one image, a batch, or a list/tuple of them) as PIL images, in order.

    Refuses, in one :class:`DataError` line, anything else, tensors in the wrong layout, integer
    types other than uint8, and floats outside [0, 1] (see the module docstring for why).
    """
    if isinstance(obj, Image.Image):
        return [obj]
    if isinstance(obj, torch.Tensor):
        return _tensor_images(obj, what)
    if isinstance(obj, np.ndarray):
        return _array_images(obj, what)
    if isinstance(obj, (list, tuple)):
        out: list[Image.Image] = []
        for i, item in enumerate(obj):
            if not is_in_memory(item):
                raise DataError(f"{what} {i} is a {type(item).__name__}; a list of in-memory images holds {IN_MEMORY_KINDS}")
            out.extend(pil_images(item, f"{what} {i}"))
        return out
    raise DataError(f"{what} is a {type(obj).__name__}; in-memory images are {IN_MEMORY_KINDS}")


# ---------------------------------------------------------------------------------------------
# Data config
# ---------------------------------------------------------------------------------------------


def _source_cfg(spec: Any) -> Mapping[str, Any]:
    """The pretrained config of a model, a registered name, a checkpoint, or a config itself."""
    if isinstance(spec, (PretrainedCfg, Mapping)):
        return spec
    if isinstance(spec, nn.Module):
        cfg = getattr(spec, "pretrained_cfg", None)
        if cfg is None:
            raise ClZooError(
                f"{type(spec).__name__} has no pretrained_cfg (preprocessing); build it with "
                "cl_zoo.create_model or load it with cl_zoo.load_model"
            )
        return cfg
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if (entry := find_pretrained(text)) is not None:
            return entry.cfg
        if (arch := find_arch(text)) is not None:
            return arch.default_cfg
        if os.path.isdir(text):
            return config_pretrained_cfg(read_config(text))
        return load_pretrained(text).pretrained_cfg  # hf-hub ids and weights files; unknown names raise
    raise ClZooError(
        f"cannot read a data config from a {type(spec).__name__}; pass a model, a registered name, "
        "a checkpoint folder, hf-hub:owner/name, or a data config dict"
    )


def resolve_data_config(model_or_name: Any, **overrides: Any) -> dict[str, Any]:
    """timm's data config for a zoo model: ``timm.data.resolve_model_data_config`` with cl-zoo's checks.

    ``model_or_name`` is a model, a registered (pretrained or architecture) name, a checkpoint
    folder, ``hf-hub:owner/name``, a :class:`PretrainedCfg` or a data config dict (timm models'
    ``pretrained_cfg`` dicts included). ``overrides`` are timm's ``args`` (``input_size``,
    ``img_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``; ``None``
    leaves a value as it is). Values cl-zoo cannot preprocess with (a crop mode other than
    ``center``, an unknown filter, a crop_pct outside [0.05, 1]) are refused in one line here,
    not when the first image arrives.
    """
    cfg = _source_cfg(model_or_name)
    config = {key: cfg.get(key) if cfg.get(key) is not None else _TIMM_DEFAULTS[key] for key in DATA_KEYS}
    unknown = [key for key in overrides if key not in _OVERRIDES]
    if unknown:
        raise DataConfigError(f"resolve_data_config does not take {unknown[0]}; it takes {', '.join(_OVERRIDES)}")
    given = {key: value for key, value in overrides.items() if value is not None}
    if "img_size" in given and "input_size" not in given:
        size = given.pop("img_size")
        given["input_size"] = (config["input_size"][0], size, size)
    given.pop("img_size", None)
    for key in ("mean", "std"):
        if key in given and len(given[key]) == 1:  # timm repeats a single value over the channels
            given[key] = tuple(given[key]) * int(config["input_size"][0])
    config.update(given)
    config["input_size"] = tuple(config["input_size"])
    config["mean"], config["std"] = tuple(config["mean"]), tuple(config["std"])
    _check(config)
    return config


def _check(config: Mapping[str, Any]) -> PretrainedCfg:
    """The config as a PretrainedCfg, validated by the rules a checkpoint's config.json obeys."""
    if config["crop_mode"] != "center":
        raise DataConfigError(
            f"crop_mode={config['crop_mode']!r}: cl-zoo preprocesses with a centre crop of the resized image "
            "(crop_mode='center'); timm.data.create_transform implements the others"
        )
    cfg = PretrainedCfg(
        input_size=config["input_size"], interpolation=config["interpolation"], mean=config["mean"], std=config["std"],
        crop_pct=config["crop_pct"],
    )
    try:
        validate_pretrained_cfg(cfg, "data config")
    except ClZooError as exc:
        raise DataConfigError(str(exc)) from None
    return cfg


# ---------------------------------------------------------------------------------------------
# The transform
# ---------------------------------------------------------------------------------------------


class ToRGB:
    """One in-memory image (PIL, CHW tensor, HWC array) -> RGB PIL, converted as decoded files are."""

    def __call__(self, image: Any) -> Image.Image:
        images = pil_images(image)
        if len(images) != 1:
            raise DataError(f"the transform takes one image at a time; got a batch of {len(images)}")
        return to_rgb(images[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ResizeCenterCrop:
    """``Preprocess`` as a PIL -> PIL step: the resize and centre crop ``cl-zoo embed`` applies."""

    def __init__(self, preprocess: Preprocess) -> None:
        self.preprocess = preprocess

    def __call__(self, image: Image.Image) -> Image.Image:
        return Image.fromarray(self.preprocess(image))

    def __repr__(self) -> str:
        p = self.preprocess
        return f"{type(self).__name__}(resize_size={p.resize_size}, crop_size={p.crop_size}, interpolation={p.interpolation!r})"


class ToNormalizedTensor:
    """uint8 HWC pixels -> normalised float32 CHW, with the embedding loop's own arithmetic.

    ``cl_zoo.embedding.extract.BatchForward`` computes ``(x - 255 * mean) * (1 / (255 * std))`` on
    the uint8 batch; doing the same here (not torchvision's ``(x / 255 - mean) / std``) makes the
    tensor identical bit for bit to what the model sees during ``cl-zoo embed``.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self._mean = torch.tensor(self.mean).view(3, 1, 1) * 255.0
        self._inv_std = 1.0 / (torch.tensor(self.std).view(3, 1, 1) * 255.0)

    def __call__(self, image: Image.Image | np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).float()
        return ((x - self._mean) * self._inv_std).contiguous()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"


def _preprocess_of(spec: Any) -> Preprocess:
    if isinstance(spec, nn.Module) and isinstance(getattr(spec, "pretrained_cfg", None), PretrainedCfg):
        return Preprocess.from_model(spec)  # the very call the embedding loop makes
    cfg = _check(resolve_data_config(spec))
    return Preprocess.from_model(types.SimpleNamespace(pretrained_cfg=cfg))  # type: ignore[arg-type]


def create_transform(model_or_name_or_config: Any, is_training: bool = False) -> transforms.Compose:
    """The evaluation transform of a model: PIL image -> normalised CHW float32 tensor.

    Takes what :func:`resolve_data_config` takes (a model, a registered name, a checkpoint, or a
    data config dict such as its output). The result is exactly the preprocessing of
    ``cl-zoo embed`` (see the module docstring for how it compares with timm's transform).
    ``is_training=True`` is refused: cl-zoo's training augmentations are multi-view pipelines
    that run on batches of tensors (:mod:`cl_zoo.data.augment`), not per-image transforms.
    """
    if is_training:
        raise ClZooError(
            "create_transform(is_training=True): cl-zoo's training augmentations run on batches of tensors "
            "(cl_zoo.data.augment.preset / ViewGenerator, used by `cl-zoo pretrain`); create_transform gives the evaluation transform"
        )
    preprocess = _preprocess_of(model_or_name_or_config)
    from torchvision import transforms  # here, not at the top: embedding imports this module and needs no torchvision

    return transforms.Compose([ToRGB(), ResizeCenterCrop(preprocess), ToNormalizedTensor(preprocess.mean, preprocess.std)])


__all__ = [
    "DATA_KEYS",
    "IN_MEMORY_KINDS",
    "DataConfigError",
    "ResizeCenterCrop",
    "ToNormalizedTensor",
    "ToRGB",
    "create_transform",
    "is_in_memory",
    "pil_images",
    "resolve_data_config",
]
