"""Refusing features that are not numbers, and naming images and models in one-line messages."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import torch.nn as nn

from cl_zoo.errors import DataError


class NonFiniteFeatureError(DataError):
    """A model gave NaN or infinite features: damaged weights, or an overflow in reduced precision.

    Such rows would poison every later step silently (``dedup`` finds "0 groups", search ranks at
    random), so extraction stops at the first one instead of writing it.
    """


def display_path(path: str) -> str:
    """``path`` for one line of a message: as is, or JSON-quoted when it holds a line break or control character.

    A file name may legally hold ``\n``, ``\r`` or U+2028; quoted raw, it would break the
    one-line error (or a line of results) in two.
    """
    if path.isprintable() and not path.startswith('"'):
        return path
    return json.dumps(path)


def model_label(model: nn.Module) -> str:
    """How error messages name a model: where it was loaded from, else its architecture."""
    return str(getattr(model, "checkpoint_source", "") or getattr(model, "model_name", "") or type(model).__name__)


def check_finite(features: np.ndarray, row_paths: Sequence[str], model: nn.Module, precision: str = "fp32") -> None:
    """Raise :class:`NonFiniteFeatureError` naming the model and the first image with a bad row."""
    finite = np.isfinite(features).all(axis=1) if features.ndim == 2 else np.isfinite(features).reshape(len(features), -1).all(axis=1)
    if finite.all():
        return
    first = int(np.flatnonzero(~finite)[0])
    hint = "; try --precision fp32" if precision == "fp16" else "; its weights may be damaged"
    raise NonFiniteFeatureError(
        f"model {model_label(model)} gives a non-finite feature (NaN or inf) for {display_path(row_paths[first])}{hint}; nothing was written"
    )

