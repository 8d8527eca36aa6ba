"""``--backend auto|torch|openvino``: which engine runs the model during feature extraction.

OpenVINO compiles the whole network for the CPU (layout, fused kernels, bf16 on AMX/AVX512_BF16,
several inference streams); measured on ResNet-50 at 224 px it runs about 2x faster than torch at
the same precision, both with AMX and with AVX512_BF16 alone (docs/benchmarks.md, "CPU speed:
bfloat16 and OpenVINO"; the rule that picks the precision is :mod:`cl_zoo.precision`). Converting a model
costs 5-15 s once; the converted model is cached per weights, precision and input size
(:mod:`cl_zoo.backends.openvino`), so later runs only compile from the cache (under 3 s).

``auto`` uses OpenVINO when it is installed, the device is the CPU, the precision is fp32 or bf16,
and the conversion pays: either it is already cached or there are at least
:data:`OPENVINO_MIN_IMAGES` images (below that a first conversion costs more than it saves).
Everything else runs on torch, and the reason is part of the choice so commands can print it.

``int8`` runs on OpenVINO only (NNCF quantizes the converted graph, :mod:`cl_zoo.backends.int8`):
it is never a silent fallback to torch, so without ``nncf``/``openvino``, on a GPU or with
``--backend torch`` it is a one-line error naming the ``int8`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cl_zoo.backends.int8 import int8_available, missing_int8_packages
from cl_zoo.errors import ClZooError
from cl_zoo.optional import MissingExtraError, is_installed, missing_message

BACKENDS: tuple[str, ...] = ("auto", "torch", "openvino")
OPENVINO_MIN_IMAGES = 256
OPENVINO_PRECISIONS = ("fp32", "bf16", "int8")


@dataclass(frozen=True)
class BackendChoice:
    """The engine that will run, and why (printed once, recorded in outputs)."""

    name: str  # "torch" or "openvino"
    reason: str


def openvino_available() -> bool:
    """Whether the optional ``openvino`` package (``pip install cl-zoo[openvino]``) is importable."""
    return is_installed("openvino")


def resolve_backend(backend: str, device: torch.device | str, precision: str, *, images: int = 0, cached: bool = False) -> BackendChoice:
    """Pick the engine for ``precision`` (already resolved) on ``device``.

    An explicit ``openvino`` that cannot run is a user error (one line); ``auto`` falls back.
    """
    if backend not in BACKENDS:
        raise ClZooError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    kind = torch.device(device).type
    if precision == "int8":
        return _int8_backend(backend, kind)
    if backend == "torch":
        return BackendChoice("torch", "asked for")
    problem = None
    missing = False
    if kind != "cpu":
        problem = f"OpenVINO runs on the CPU, the device is {kind}"
    elif precision not in OPENVINO_PRECISIONS:
        problem = f"OpenVINO runs fp32 or bf16, not {precision}"
    elif not openvino_available():
        missing, problem = True, missing_message("openvino", "the OpenVINO backend")
    if backend == "openvino":
        if missing:
            raise MissingExtraError(missing_message("openvino", "--backend openvino"))
        if problem:
            raise ClZooError(f"--backend openvino: {problem}")
        return BackendChoice("openvino", "asked for")
    if problem:
        return BackendChoice("torch", problem)
    if cached:
        return BackendChoice("openvino", "installed; converted model cached")
    if images >= OPENVINO_MIN_IMAGES:
        return BackendChoice("openvino", f"installed; {images} images repay the one-time conversion")
    return BackendChoice("torch", f"{images} images < {OPENVINO_MIN_IMAGES}: a first OpenVINO conversion would cost more than it saves")


def _int8_backend(backend: str, kind: str) -> BackendChoice:
    if backend == "torch":
        raise ClZooError("--precision int8 runs on OpenVINO; use --backend openvino or auto")
    if kind != "cpu":
        raise ClZooError(f"--precision int8 runs on the CPU (OpenVINO), the device is {kind}")
    if not int8_available():
        raise MissingExtraError(missing_int8_packages())
    return BackendChoice("openvino", "int8 runs on OpenVINO")


__all__ = ["BACKENDS", "OPENVINO_MIN_IMAGES", "BackendChoice", "openvino_available", "resolve_backend"]
