"""What runs the model: an inference copy for torch, or a compiled OpenVINO (fp32/bf16/int8) graph.

The model runs in ``inference_mode``, channels-last, with BatchNorm folded into convolutions (exact
up to float rounding), under bf16 autocast where the hardware makes it faster (``precision="auto"``:
CUDA, and CPUs with AMX or AVX512_BF16; see :mod:`cl_zoo.precision`), or compiled by OpenVINO
(``backend``, see :mod:`cl_zoo.backends`); features are float32 either way.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import warnings
from dataclasses import asdict
from typing import Any, Sequence

import PIL
import torch
import torch.nn as nn

from cl_zoo import __version__ as cl_zoo_version
from cl_zoo.backends import openvino_available, resolve_backend
from cl_zoo.backends.int8 import CALIBRATION_SIZE, INT8_FEATURE, CalibrationImages, calibration_sample, Int8Rejected
from cl_zoo.backends.openvino import ConversionError, has_host_transform, is_cached, OpenVINORunner
from cl_zoo.embedding.preprocess import (
    Preprocess,
    decode_images,
)
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import files_fingerprint
from cl_zoo.optional import require
from cl_zoo.precision import autocast, resolve_precision, usable_cores


class FeaturesOnly(nn.Module):
    """``forward_features`` as ``forward`` so that torch.fx traces the feature path only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = getattr(self.model, "forward_features", self.model)
        return fn(x)


def prepare_model(model: nn.Module, device: torch.device, *, fuse: bool = True) -> nn.Module:
    """An inference copy of ``model``: eval, BN folded into convs when traceable, channels-last.

    (TorchScript freezing would prepack oneDNN weights for ~10% more on CPU, but costs ~9 CPU-s
    to set up for a ResNet-50, more than it saves on typical folders.)

    The caller's model is never modified.
    """
    wrapped = FeaturesOnly(model).eval()
    fused: nn.Module | None = None
    if fuse:
        try:
            from torch.fx.experimental.optimization import fuse as fx_fuse

            fused = fx_fuse(wrapped)  # works on a deep copy
        except Exception:  # noqa: BLE001 - untraceable models simply run unfused
            fused = None
    out = fused if fused is not None else copy.deepcopy(wrapped)
    return out.eval().to(device=device, memory_format=torch.channels_last)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ClZooError("--device cuda was asked for but no CUDA GPU is available")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ClZooError(f"unknown device {device!r}; use auto, cpu or cuda") from None


def model_fingerprint(model: nn.Module) -> str:
    """A digest of the weights and buffers, so progress files are never mixed across models."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # the buffer itself, not a copy
    return digest.hexdigest()



def inference_autocast(device: torch.device, precision: str):  # noqa: ANN202 - a context manager

    return autocast(device, precision)



def resolve_engine(
    model: nn.Module, device: str | torch.device, precision: str, backend: str, images: int, fingerprint: str | None = None
) -> tuple[str, Any]:
    """(resolved precision, :class:`~cl_zoo.backends.BackendChoice`) for embedding ``images`` files.

    What :func:`extract_features` will run, before it runs: the feature cache keys on it.
    """
    dev = resolve_device(device)
    resolved = resolve_precision(precision, dev)
    cached = False
    if backend == "auto" and dev.type == "cpu":
        if openvino_available():
            pre = Preprocess.from_model(model)
            cached = is_cached(fingerprint or model_fingerprint(model), pre.crop_size, pre.mean, pre.std,
                               host_transform=has_host_transform(model))
    return resolved, resolve_backend(backend, dev, resolved, images=images, cached=cached)


def openvino_runner(model: nn.Module, fingerprint: str, preprocess: Preprocess, precision: str) -> tuple[Any, str]:
    """The compiled OpenVINO model, or ``None`` and why (warned once) when it cannot convert."""
    try:
        runner = OpenVINORunner(
            model, fingerprint=fingerprint, input_hw=preprocess.crop_size, mean=preprocess.mean, std=preprocess.std,
            precision=precision, threads=usable_cores(),
        )
    except ConversionError as exc:
        name = getattr(model, "model_name", None) or type(model).__name__
        reason = f"OpenVINO cannot convert {name} ({exc.reason}); running on torch"
        warnings.warn(reason, stacklevel=3)
        return None, reason
    return runner, "converted now" if runner.converted else "compiled from the cache"


def calibration_identity(paths: Sequence[str], preprocess: Preprocess) -> str | None:
    """Who the calibration images are without decoding them: their files' identity, the preprocessing
    and the decoder's version (:class:`~cl_zoo.backends.int8.CalibrationImages`); None when a file
    cannot be stat'ed (then they are decoded, and the unreadable ones skipped, as before)."""
    try:
        files = files_fingerprint(paths)
    except DataError:
        return None
    payload = {"files": files, "preprocess": asdict(preprocess), "pillow": PIL.__version__, "cl_zoo": cl_zoo_version}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def int8_runner(
    model: nn.Module, fingerprint: str, preprocess: Preprocess, candidates: Sequence[str], size: int | None, seed: int,
    force: bool, workers: int, dev: torch.device,
) -> tuple[Any, str, str, dict[str, Any]]:
    """(runner, precision that runs, why, quantization record) for ``precision="int8"``.

    A failed gate (or too few images to measure one) warns once and falls back to the float
    precision ``auto`` picks on OpenVINO; ``force`` keeps int8 and says so in the record.
    """
    chosen = calibration_sample([os.fspath(p) for p in candidates], CALIBRATION_SIZE if size is None else size, seed)
    # decoded only if the cache needs the pixels (a warm run finds its int8 model by their remembered digest)
    images = CalibrationImages(chosen, lambda paths: decode_images(paths, preprocess, workers), calibration_identity(chosen, preprocess))
    if len(images) == 0:
        raise DataError(f"none of the {len(chosen)} calibration images could be read")
    record: dict[str, Any] = {
        "calibration_images": None, "calibration_seed": seed, "calibration_sha256": None,  # filled in once the runner is made
        "forced": bool(force), "recipe": "NNCF post-training quantization, PERFORMANCE preset, min/max activation ranges, full bias correction",
    }
    try:
        nncf = require("nncf", INT8_FEATURE, extra="int8")

        record["nncf"] = nncf.__version__
        runner = OpenVINORunner(
            model, fingerprint=fingerprint, input_hw=preprocess.crop_size, mean=preprocess.mean, std=preprocess.std,
            precision="int8", threads=usable_cores(), calibration=images, force_int8=force,
        )
    except Int8Rejected as exc:
        record.update(calibration_images=len(images), calibration_sha256=images.digest)
        fallback = resolve_precision("auto", dev)
        if exc.fidelity is not None:
            record["fidelity"] = {**asdict(exc.fidelity), "passed": False}
        record["ran"] = False
        reason = f"int8 rejected: {exc.reason}; running {fallback} instead (--force-int8 keeps int8)"
        warnings.warn(reason, stacklevel=3)
        runner, why = openvino_runner(model, fingerprint, preprocess, fallback)
        if runner is None:
            raise ClZooError(f"{reason}, but OpenVINO cannot run this model ({why})") from None
        return runner, fallback, reason, record
    record.update(calibration_images=len(images), calibration_sha256=images.digest, ran=True)
    if runner.fidelity is not None:
        record["fidelity"] = {**asdict(runner.fidelity), "passed": runner.fidelity.passed}
        why = ("forced; " if force and not runner.fidelity.passed else "") + runner.fidelity.describe()
    else:
        why = f"forced; {len(images)} calibration images are too few to measure fidelity"
    made = "quantized now" if runner.quantized else "int8 model from the cache"
    return runner, "int8", f"{made}; {why}", record


