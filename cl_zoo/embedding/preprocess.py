"""Image file -> uint8 pixels exactly as the model was trained to see them.

Preprocessing comes from ``model.pretrained_cfg`` (shorter side to ``resize_size`` with the
model's interpolation, centre crop to ``input_size``), so features match training. DataLoader
workers decode JPEGs in draft mode (DCT-scaled) and resample only the region that survives the
centre crop, then hand back uint8 arrays: a quarter of the bytes of float32; the float conversion
and normalisation happen once per batch on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from cl_zoo.data.images import ImageDecodeError, load_image
from cl_zoo.errors import ClZooError

_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class Preprocess:
    """Shorter side to ``resize_size``, centre crop ``crop_size`` (h, w); returns uint8 HWC RGB.

    Equivalent to torchvision's ``Resize(resize_size)`` + ``CenterCrop(crop_size)`` (same output
    geometry, same antialiased filter), but only the pixels inside the crop are resampled.
    """

    resize_size: int
    crop_size: tuple[int, int]
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

    @classmethod
    def from_model(cls, model: nn.Module) -> "Preprocess":
        cfg = getattr(model, "pretrained_cfg", None)
        if cfg is None:
            raise ClZooError(
                f"{type(model).__name__} has no pretrained_cfg (preprocessing); build it with "
                "cl_zoo.create_model or load it with cl_zoo.load_model"
            )
        if cfg.interpolation not in _INTERPOLATION:
            raise ClZooError(f"unsupported interpolation {cfg.interpolation!r} in the model's pretrained_cfg")
        _, h, w = cfg.input_size
        return cls(
            resize_size=int(cfg.resize_size),
            crop_size=(int(h), int(w)),
            interpolation=cfg.interpolation,
            mean=tuple(float(m) for m in cfg.mean),  # type: ignore[arg-type]
            std=tuple(float(s) for s in cfg.std),  # type: ignore[arg-type]
        )

    @property
    def min_short_side(self) -> int:
        return max(self.resize_size, *self.crop_size)

    def __call__(self, img: Image.Image) -> np.ndarray:
        w, h = img.size
        ch, cw = self.crop_size
        size = self.resize_size
        # torchvision's Resize(int): the shorter side becomes `size`, the longer one is truncated.
        if w <= h:
            rw, rh = size, int(size * h / w)
        else:
            rw, rh = int(size * w / h), size
        resample = _INTERPOLATION[self.interpolation]
        if rw < cw or rh < ch:
            # Crop larger than the resized image: torchvision pads with black; do the same.
            resized = img.resize((rw, rh), resample)
            canvas = Image.new("RGB", (max(rw, cw), max(rh, ch)))
            canvas.paste(resized, ((canvas.width - rw) // 2, (canvas.height - rh) // 2))
            img, w, h, rw, rh = canvas, canvas.width, canvas.height, canvas.width, canvas.height
        left = int(round((rw - cw) / 2.0))
        top = int(round((rh - ch) / 2.0))
        sx, sy = w / rw, h / rh
        box = (left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)
        out = img.resize((cw, ch), resample, box=box) if (rw, rh) != (w, h) or (cw, ch) != (w, h) else img
        return np.asarray(out, dtype=np.uint8)


class ImageList(torch.utils.data.Dataset):
    """Index -> (index, uint8 HWC array or None, failure reason)."""

    def __init__(self, paths: Sequence[str], preprocess: Preprocess) -> None:
        self.paths = paths
        self.preprocess = preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str]:
        try:
            img = load_image(self.paths[index], self.preprocess.min_short_side)
            return index, self.preprocess(img), ""
        except ImageDecodeError as exc:
            return index, None, exc.reason
        except Exception as exc:  # noqa: BLE001 - a codec bug on one file must not end the run
            return index, None, f"decode error ({type(exc).__name__}: {exc})"


def collate_images(items: list[tuple[int, np.ndarray | None, str]]) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    ok = [(i, a) for i, a, _ in items if a is not None]
    failed = [(i, r) for i, a, r in items if a is None]
    pixels = torch.from_numpy(np.stack([a for _, a in ok])) if ok else None
    return [i for i, _ in ok], pixels, failed



def decode_images(paths: Sequence[str], preprocess: Preprocess, workers: int = 0) -> np.ndarray:
    """uint8 NHWC pixels of the ``paths`` that decode (in order), preprocessed as for embedding."""
    loader = torch.utils.data.DataLoader(
        ImageList(list(paths), preprocess), batch_size=64, num_workers=min(workers, max(1, len(paths) // 64)),
        collate_fn=collate_images,
    )
    parts = [pixels.numpy() for _, pixels, _ in loader if pixels is not None]
    h, w = preprocess.crop_size
    return np.concatenate(parts) if parts else np.zeros((0, h, w, 3), np.uint8)

