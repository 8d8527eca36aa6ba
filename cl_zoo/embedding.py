"""Turning image files into feature vectors, fast and resumably.

``extract_features`` is the one loop every consumer shares (``cl-zoo embed``, ``cl_zoo.embed``,
k-NN and linear evaluation), so its choices matter everywhere:

* preprocessing comes from ``model.pretrained_cfg`` (shorter side to ``resize_size`` with the
  model's interpolation, centre crop to ``input_size``, mean/std), so features match training;
* DataLoader workers decode JPEGs in draft mode (DCT-scaled) and resample only the region that
  survives the centre crop, then hand back uint8 arrays: a quarter of the bytes of float32, and the
  float conversion and normalisation happen once per batch on the device;
* the model runs in ``inference_mode``, channels-last, with BatchNorm folded into convolutions
  (exact up to float rounding), under bf16 autocast where the hardware makes it faster
  (``precision="auto"``: CUDA, and CPUs with AMX or AVX512_BF16; see :mod:`cl_zoo.precision`),
  or compiled by OpenVINO (``backend``, see :mod:`cl_zoo.backends`); features are float32 either way;
* the path list is cut into fixed chunks of whole batches. A chunk is the unit of progress files
  (``progress_dir``), of ``--resume`` and of ``torchrun`` sharding, and because batches never
  straddle chunks, a resumed or sharded run computes exactly the batches an uninterrupted single
  process would, so its output is the same bytes.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import math
import os
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from cl_zoo.data.images import ImageDecodeError, discover_images, load_image
from cl_zoo.data.workers import default_workers
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import atomic_path, atomic_write_text
from cl_zoo.precision import PRECISIONS
_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}
_MANIFEST = "manifest.json"


# ------------------------------------------------------------------------------------------------
# preprocessing
# ------------------------------------------------------------------------------------------------


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


class _ImageList(torch.utils.data.Dataset):
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


def _collate(items: list[tuple[int, np.ndarray | None, str]]) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    ok = [(i, a) for i, a, _ in items if a is not None]
    failed = [(i, r) for i, a, r in items if a is None]
    pixels = torch.from_numpy(np.stack([a for _, a in ok])) if ok else None
    return [i for i, _ in ok], pixels, failed


# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------


class _Features(nn.Module):
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
    wrapped = _Features(model).eval()
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
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------


@dataclass
class FeatureResult:
    """Features of the images that decoded, plus the ones that did not and why."""

    features: np.ndarray  # float32 [n_ok, D], rows in input order
    indices: np.ndarray  # int64 [n_ok]: row i is paths[indices[i]] of the input list
    paths: list[str]  # the n_ok embedded paths, same order as features
    failures: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), input order
    seconds: float = 0.0  # wall time of this call
    computed: int = 0  # images decoded and embedded by this call (not restored from progress)
    resumed: int = 0  # images restored from progress files
    precision: str = "fp32"  # what ran: fp32, bf16 or fp16 ("auto" resolved)
    backend: str = "torch"  # what ran: torch or openvino
    backend_reason: str = ""  # why that backend (printed once by commands)
    quantization: dict[str, Any] | None = None  # int8 asked for: calibration, fidelity, whether it ran

    @property
    def images_per_second(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Chunk:
    features: np.ndarray
    indices: np.ndarray
    fail_indices: np.ndarray
    fail_reasons: list[str]


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


def _dist_info() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, world


def _barrier(world: int) -> None:
    if world <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()


def _atomic_save_chunk(folder: Path, k: int, chunk: _Chunk) -> None:
    with atomic_path(folder / f"part-{k:05d}.npz", suffix=".npz", mkdir=False) as tmp, open(tmp, "wb") as fh:
        np.savez(
            fh,
            features=chunk.features,
            indices=chunk.indices,
            fail_indices=chunk.fail_indices,
            fail_reasons=np.array(chunk.fail_reasons, dtype=np.str_),
        )


def _load_chunk(folder: Path, k: int) -> _Chunk | None:
    path = folder / f"part-{k:05d}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            chunk = _Chunk(z["features"], z["indices"], z["fail_indices"], [str(r) for r in z["fail_reasons"]])
    except (OSError, ValueError, KeyError, EOFError):
        return None  # a damaged part is simply recomputed
    if chunk.features.dtype.kind != "f" or not np.isfinite(chunk.features).all():
        return None  # likewise a part whose features are not usable numbers
    return chunk


def _paths_digest(paths: Sequence[str]) -> str:
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


def _manifest(paths: Sequence[str], model: nn.Module, preprocess: Preprocess, batch_size: int, chunk_size: int, precision: str, device: torch.device, backend: str = "torch", fingerprint: str | None = None) -> dict[str, Any]:
    return {
        "count": len(paths),
        "paths_sha256": _paths_digest(paths),
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
        total = int(json.loads((folder / _MANIFEST).read_text())["count"])
    except (OSError, ValueError, KeyError, TypeError):
        total = 0
    images = 0
    for part in parts:
        chunk = _load_chunk(folder, int(part.stem.partition("-")[2]))
        if chunk is not None:
            images += len(chunk.indices) + len(chunk.fail_indices)
    return SavedProgress(images=images, total=max(total, images), parts=len(parts))


def _open_progress(folder: Path, manifest: dict[str, Any], resume: bool, force: bool, rank: int, world: int) -> None:
    """Create (or, with ``resume``, validate) the progress folder; rank 0 owns it.

    Saved parts are hours of work on a large folder, so starting over on top of them needs
    ``force``: a forgotten ``--resume`` is an error, not a silent restart.
    """
    if rank == 0:
        kept = None if resume or force else saved_progress(folder)
        if kept is not None:
            raise DataError(
                f"{folder} holds saved progress of an interrupted run ({kept}); "
                "pass --resume to continue it or --force to discard it and start over"
            )
        existing = folder / _MANIFEST
        if resume and existing.is_file():
            try:
                old = json.loads(existing.read_text())
            except (OSError, ValueError):
                old = None
            if old != manifest:
                changed = sorted(k for k in manifest if not isinstance(old, dict) or old.get(k) != manifest[k])
                raise DataError(
                    f"cannot resume: progress in {folder} was made with different {', '.join(changed)}; "
                    "run without --resume to start over"
                )
        else:
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            atomic_write_text(existing, json.dumps(manifest, indent=1), mkdir=False)
    _barrier(world)


def _autocast(device: torch.device, precision: str):  # noqa: ANN202 - a context manager
    from cl_zoo.precision import autocast

    return autocast(device, precision)


def extract_features(
    model: nn.Module,
    paths: Sequence[str],
    *,
    batch_size: int = 64,
    device: str | torch.device = "auto",
    workers: int | None = None,
    precision: str = "fp32",
    backend: str = "torch",
    progress: bool = False,
    progress_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    force: bool = False,
    chunk_batches: int | None = None,
    fuse: bool = True,
    max_batches: int | None = None,
    calibration: Sequence[str] | None = None,
    calibration_size: int | None = None,
    calibration_seed: int = 0,
    force_int8: bool = False,
) -> FeatureResult:
    """Embed ``paths`` (kept in the given order) with ``model``; bad files become ``failures``.

    ``progress_dir`` keeps one file per finished chunk so that ``resume=True`` skips them; parts
    left there by an interrupted run are only discarded with ``force=True``. Under ``torchrun``
    (``WORLD_SIZE`` > 1) it is required, each rank embeds every ``WORLD_SIZE``-th chunk and all
    ranks return the merged result. ``max_batches`` stops the call with ``KeyboardInterrupt``
    after that many batches (how tests interrupt a run).

    ``precision`` (``auto``, ``fp32``, ``bf16``, ``fp16``) and ``backend`` (``auto``, ``torch``,
    ``openvino``) are resolved for the device (:mod:`cl_zoo.precision`, :mod:`cl_zoo.backends`);
    the result says what ran. A model OpenVINO cannot convert runs on torch with a one-line warning.

    ``precision="int8"`` quantizes with NNCF on ``calibration_size`` images (default 512) drawn by
    ``calibration_seed`` from ``calibration`` (default: ``paths`` themselves), and uses the int8
    model only if it passes its fidelity gate on the held-out half (:mod:`cl_zoo.backends.int8`);
    otherwise it warns in one line and runs the float precision ``auto`` picks, unless
    ``force_int8``. ``result.quantization`` records the calibration and the measurement.
    """
    start = time.perf_counter()
    paths = [os.fspath(p) for p in paths]
    if batch_size < 1:
        raise ClZooError(f"batch size must be at least 1, got {batch_size}")
    if precision not in PRECISIONS:
        raise ClZooError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    workers = default_workers() if workers is None else workers
    if workers < 0:
        raise ClZooError(f"workers must be >= 0, got {workers}")
    rank, world = _dist_info()
    dev = resolve_device(device)
    if world > 1 and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 and progress_dir is None:
        raise ClZooError("embedding under torchrun needs a progress folder shared by all ranks (an output path)")
    preprocess = Preprocess.from_model(model)
    # The weights digest names progress files and the OpenVINO cache entry; skip it when neither is used.
    fingerprint = model_fingerprint(model) if progress_dir is not None or backend != "torch" else None
    precision, choice = resolve_engine(model, dev, precision, backend, len(paths), fingerprint)
    runner, backend_name, backend_reason = None, choice.name, choice.reason
    quantization = None
    if precision == "int8" and len(paths):
        runner, precision, backend_reason, quantization = _int8_runner(
            model, fingerprint or model_fingerprint(model), preprocess, paths if calibration is None else calibration,
            calibration_size, calibration_seed, force_int8, workers, dev,
        )
        backend_name = "openvino"
    elif choice.name == "openvino" and len(paths):
        runner, backend_reason = _openvino_runner(model, fingerprint or model_fingerprint(model), preprocess, precision)
        backend_name = "openvino" if runner is not None else "torch"
    chunk_batches = chunk_batches or max(1, 1024 // batch_size)
    chunk_size = batch_size * chunk_batches
    n_chunks = math.ceil(len(paths) / chunk_size)

    folder = Path(progress_dir) if progress_dir is not None else None
    done: dict[int, _Chunk] = {}
    if folder is not None:
        manifest = _manifest(paths, model, preprocess, batch_size, chunk_size, precision, dev, backend_name, fingerprint)
        if quantization is not None and quantization["ran"]:
            manifest["int8_calibration_sha256"] = quantization["calibration_sha256"]  # another calibration = other features
        _open_progress(folder, manifest, resume, force, rank, world)
        if resume:
            for k in range(n_chunks):
                chunk = _load_chunk(folder, k)
                if chunk is not None:
                    done[k] = chunk
    todo = [k for k in range(n_chunks) if k % world == rank and k not in done]
    batches = [
        list(range(s, min(s + batch_size, (k + 1) * chunk_size, len(paths))))
        for k in todo
        for s in range(k * chunk_size, min((k + 1) * chunk_size, len(paths)), batch_size)
    ]
    resumed = sum(len(c.indices) + len(c.fail_indices) for c in done.values())
    computed = 0
    if batches:
        computed = _run_batches(
            model, paths, batches, todo, chunk_size, done, folder, preprocess, dev, workers, precision,
            fuse, max_batches, progress and rank == 0, resumed, runner=runner,
        )
    _barrier(world)
    if world > 1:
        assert folder is not None
        for k in range(n_chunks):
            if k not in done:
                chunk = _load_chunk(folder, k)
                if chunk is None:
                    raise DataError(f"progress file for chunk {k} is missing in {folder} after all ranks finished")
                done[k] = chunk
        _barrier(world)  # every rank has read every part before rank 0 may delete them
    result = _assemble(paths, done, n_chunks, time.perf_counter() - start, computed, resumed)
    result.precision, result.backend, result.backend_reason = precision, backend_name, backend_reason
    result.quantization = quantization
    return result


def resolve_engine(
    model: nn.Module, device: str | torch.device, precision: str, backend: str, images: int, fingerprint: str | None = None
) -> tuple[str, Any]:
    """(resolved precision, :class:`~cl_zoo.backends.BackendChoice`) for embedding ``images`` files.

    What :func:`extract_features` will run, before it runs: the feature cache keys on it.
    """
    from cl_zoo.backends import resolve_backend
    from cl_zoo.precision import resolve_precision

    dev = resolve_device(device)
    resolved = resolve_precision(precision, dev)
    cached = False
    if backend == "auto" and dev.type == "cpu":
        from cl_zoo.backends import openvino_available

        if openvino_available():
            from cl_zoo.backends.openvino import is_cached

            pre = Preprocess.from_model(model)
            cached = is_cached(fingerprint or model_fingerprint(model), pre.crop_size, pre.mean, pre.std)
    return resolved, resolve_backend(backend, dev, resolved, images=images, cached=cached)


def _openvino_runner(model: nn.Module, fingerprint: str, preprocess: Preprocess, precision: str) -> tuple[Any, str]:
    """The compiled OpenVINO model, or ``None`` and why (warned once) when it cannot convert."""
    from cl_zoo.backends.openvino import ConversionError, OpenVINORunner
    from cl_zoo.precision import usable_cores

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


def _int8_runner(
    model: nn.Module, fingerprint: str, preprocess: Preprocess, candidates: Sequence[str], size: int | None, seed: int,
    force: bool, workers: int, dev: torch.device,
) -> tuple[Any, str, str, dict[str, Any]]:
    """(runner, precision that runs, why, quantization record) for ``precision="int8"``.

    A failed gate (or too few images to measure one) warns once and falls back to the float
    precision ``auto`` picks on OpenVINO; ``force`` keeps int8 and says so in the record.
    """
    from cl_zoo.backends.int8 import CALIBRATION_SIZE, Int8Rejected, calibration_sample, pixels_digest
    from cl_zoo.backends.openvino import OpenVINORunner
    from cl_zoo.precision import resolve_precision, usable_cores

    chosen = calibration_sample([os.fspath(p) for p in candidates], CALIBRATION_SIZE if size is None else size, seed)
    pixels = decode_images(chosen, preprocess, workers)
    if len(pixels) == 0:
        raise DataError(f"none of the {len(chosen)} calibration images could be read")
    record: dict[str, Any] = {
        "calibration_images": len(pixels), "calibration_seed": seed, "calibration_sha256": pixels_digest(pixels),
        "forced": bool(force), "recipe": "NNCF post-training quantization, PERFORMANCE preset, min/max activation ranges, full bias correction",
    }
    try:
        import nncf

        record["nncf"] = nncf.__version__
        runner = OpenVINORunner(
            model, fingerprint=fingerprint, input_hw=preprocess.crop_size, mean=preprocess.mean, std=preprocess.std,
            precision="int8", threads=usable_cores(), calibration=pixels, force_int8=force,
        )
    except Int8Rejected as exc:
        fallback = resolve_precision("auto", dev)
        if exc.fidelity is not None:
            record["fidelity"] = {**asdict(exc.fidelity), "passed": False}
        record["ran"] = False
        reason = f"int8 rejected: {exc.reason}; running {fallback} instead (--force-int8 keeps int8)"
        warnings.warn(reason, stacklevel=3)
        runner, why = _openvino_runner(model, fingerprint, preprocess, fallback)
        if runner is None:
            raise ClZooError(f"{reason}, but OpenVINO cannot run this model ({why})") from None
        return runner, fallback, reason, record
    record["ran"] = True
    if runner.fidelity is not None:
        record["fidelity"] = {**asdict(runner.fidelity), "passed": runner.fidelity.passed}
        why = ("forced; " if force and not runner.fidelity.passed else "") + runner.fidelity.describe()
    else:
        why = f"forced; {len(pixels)} calibration images are too few to measure fidelity"
    made = "quantized now" if runner.quantized else "int8 model from the cache"
    return runner, "int8", f"{made}; {why}", record


def decode_images(paths: Sequence[str], preprocess: Preprocess, workers: int = 0) -> np.ndarray:
    """uint8 NHWC pixels of the ``paths`` that decode (in order), preprocessed as for embedding."""
    loader = torch.utils.data.DataLoader(
        _ImageList(list(paths), preprocess), batch_size=64, num_workers=min(workers, max(1, len(paths) // 64)),
        collate_fn=_collate,
    )
    parts = [pixels.numpy() for _, pixels, _ in loader if pixels is not None]
    h, w = preprocess.crop_size
    return np.concatenate(parts) if parts else np.zeros((0, h, w, 3), np.uint8)


def _run_batches(
    model: nn.Module,
    paths: list[str],
    batches: list[list[int]],
    todo: list[int],
    chunk_size: int,
    done: dict[int, _Chunk],
    folder: Path | None,
    preprocess: Preprocess,
    dev: torch.device,
    workers: int,
    precision: str,
    fuse: bool,
    max_batches: int | None,
    progress: bool,
    resumed: int,
    runner: Any = None,
) -> int:
    from tqdm import tqdm

    net = prepare_model(model, dev, fuse=fuse) if runner is None else None
    mean = torch.tensor(preprocess.mean, device=dev).view(1, 3, 1, 1) * 255.0
    inv_std = 1.0 / (torch.tensor(preprocess.std, device=dev).view(1, 3, 1, 1) * 255.0)
    loader = torch.utils.data.DataLoader(
        _ImageList(paths, preprocess),
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=_collate,
        pin_memory=dev.type == "cuda",
        prefetch_factor=4 if workers > 0 else None,
    )
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]] = {k: [] for k in todo}
    remaining = {k: sum(1 for b in batches if b[0] // chunk_size == k) for k in todo}
    bar = tqdm(
        # disable=None: tqdm turns itself off when stderr is not a terminal (logs, CI, pipes).
        total=len(paths), initial=resumed, unit="img", disable=None if progress else True, file=sys.stderr,
        dynamic_ncols=True, smoothing=0.1,
    )
    computed = 0
    try:
        with torch.inference_mode(), _autocast(dev, "fp32" if runner is not None else precision):
            for n, (indices, pixels, failed) in enumerate(loader):
                if max_batches is not None and n >= max_batches:
                    raise KeyboardInterrupt(f"stopped after {max_batches} batches")
                if pixels is not None and runner is not None:
                    feats = runner(pixels)  # uint8 NHWC in, float32 [B, D] out; normalisation inside
                elif pixels is not None:
                    assert net is not None
                    x = pixels.to(dev, non_blocking=True).permute(0, 3, 1, 2)  # NHWC memory = channels-last
                    x = (x.float() - mean) * inv_std
                    feats = net(x)
                    if not isinstance(feats, torch.Tensor):
                        raise ClZooError(f"{type(model).__name__}.forward_features returned {type(feats).__name__}, not a tensor")
                    feats = feats.reshape(feats.shape[0], -1).float().cpu().numpy()
                else:
                    feats = np.zeros((0, 0), dtype=np.float32)
                if len(indices):
                    check_finite(feats, [paths[i] for i in indices], model, precision)
                k = (indices[0] if indices else failed[0][0]) // chunk_size
                pending[k].append((feats, np.asarray(indices, dtype=np.int64), failed))
                computed += len(indices)
                bar.update(len(indices) + len(failed))
                remaining[k] -= 1
                if remaining[k] == 0:
                    done[k] = _merge_chunk(pending.pop(k))
                    if folder is not None:
                        _atomic_save_chunk(folder, k, done[k])
    finally:
        bar.close()
    return computed


def _merge_chunk(parts: list[tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]) -> _Chunk:
    feats = [f for f, i, _ in parts if len(i)]
    dim = feats[0].shape[1] if feats else 0
    fails = [pair for _, _, fl in parts for pair in fl]
    return _Chunk(
        features=np.concatenate(feats).astype(np.float32, copy=False) if feats else np.zeros((0, dim), np.float32),
        indices=np.concatenate([i for _, i, _ in parts]).astype(np.int64),
        fail_indices=np.array([i for i, _ in fails], dtype=np.int64),
        fail_reasons=[r for _, r in fails],
    )


def _assemble(paths: list[str], chunks: dict[int, _Chunk], n_chunks: int, seconds: float, computed: int, resumed: int) -> FeatureResult:
    ordered = [chunks[k] for k in range(n_chunks)]
    dims = {c.features.shape[1] for c in ordered if len(c.indices)}
    if len(dims) > 1:
        raise DataError(f"progress files disagree on the feature size ({sorted(dims)}); run without --resume")
    dim = dims.pop() if dims else 0
    feats = [c.features for c in ordered if len(c.indices)]
    features = np.concatenate(feats) if feats else np.zeros((0, dim), np.float32)
    indices = np.concatenate([c.indices for c in ordered]) if ordered else np.zeros(0, np.int64)
    failures = sorted(((int(i), r) for c in ordered for i, r in zip(c.fail_indices, c.fail_reasons)))
    return FeatureResult(
        features=np.ascontiguousarray(features, dtype=np.float32),
        indices=indices.astype(np.int64),
        paths=[paths[i] for i in indices],
        failures=[(paths[i], r) for i, r in failures],
        seconds=seconds,
        computed=computed,
        resumed=resumed,
    )


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
) -> tuple[np.ndarray, list[str]]:
    """Embed image files, folders or path lists; returns float32 ``[N, D]`` and the N paths.

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
    files = discover_images(paths)
    if isinstance(calibration, (str, os.PathLike)):
        calibration = [calibration]
    calibration_files = list(discover_images(calibration)) if calibration is not None else None
    net = load_embedding_model(model)
    result = extract_features(
        net, files, batch_size=batch_size, device=device, workers=workers, precision=precision, backend=backend,
        progress=progress, calibration=calibration_files, force_int8=force_int8,
    )
    if not result.paths:
        raise DataError(f"none of the {len(files)} images could be read (first: {result.failures[0][0]}: {result.failures[0][1]})")
    if result.failures:
        warnings.warn(
            f"skipped {len(result.failures)} unreadable images, e.g. {result.failures[0][0]}: {result.failures[0][1]}",
            stacklevel=2,
        )
    return result.features, result.paths


def load_embedding_model(model: str | os.PathLike[str] | nn.Module | None) -> nn.Module:
    """``load_model`` with the zoo's bundled default for ``None``."""
    from cl_zoo.checkpoint.hub import load_model
    from cl_zoo.registry import DEFAULT_MODEL

    return load_model(DEFAULT_MODEL if model is None else model)


# ------------------------------------------------------------------------------------------------
# embedding files
# ------------------------------------------------------------------------------------------------

OUTPUT_SUFFIXES = (".npy", ".parquet")


def sidecar(out: str | os.PathLike[str], suffix: str) -> Path:
    """``emb.npy`` -> ``emb<suffix>`` (``.paths.jsonl``, ``.csv``, ``.failures.csv``, ``.parts``...)."""
    out = Path(out)
    return out.with_name(out.stem + suffix)


def model_reference(spec: str | os.PathLike[str] | None) -> str:
    """``spec`` as a reference that still works from another folder.

    A checkpoint folder or file on disk becomes an absolute path (``runs/x/model`` is meaningless
    to ``cl-zoo search`` run elsewhere); registered names and ``hf-hub:`` ids stay as they are.
    Paths are checked first, as :func:`cl_zoo.checkpoint.hub.load_pretrained` does.
    """
    if spec is None:
        return ""
    text = os.fspath(spec)
    return os.path.abspath(text) if text and os.path.exists(text) else text


def resolve_model_reference(meta: dict[str, str], embeddings: str | os.PathLike[str]) -> str:
    """The model recorded with a set of embeddings, as something :func:`load_embedding_model` opens.

    New files record absolute references. Files written before that may hold a path relative to
    wherever ``embed`` ran; it is tried from here, then beside the embeddings file, and failing
    both the absolute folder the model was loaded from (``source``) is used when it still exists.
    """
    spec = str(meta.get("model") or "")
    if not spec or os.path.isabs(spec) or os.path.exists(spec) or spec.startswith("hf-hub:"):
        return spec
    beside = Path(embeddings).resolve().parent / spec
    if beside.exists():
        return str(beside)
    source = str(meta.get("source") or "")
    if os.path.isabs(source) and os.path.exists(source):
        return source
    return spec


def model_metadata(model: nn.Module, spec: str | None) -> dict[str, str]:
    """What produced a set of embeddings, so they can be queried with the same model later.

    ``dedup_threshold`` is the model's calibrated near-duplicate similarity (see
    :mod:`cl_zoo.dedup_calibration`) when its config records one; ``cl-zoo dedup`` defaults to it.
    """
    from cl_zoo import __version__
    from cl_zoo.dedup_calibration import recorded_threshold

    source = str(getattr(model, "checkpoint_source", "") or "")
    revision = source.rpartition("@")[2] if source.startswith("hf-hub:") and "@" in source else ""
    files = (getattr(model, "checkpoint_config", None) or {}).get("files") or {}
    if not revision and files:
        revision = "sha256:" + str(files[sorted(files)[0]])
    if source and os.path.exists(source):
        source = os.path.abspath(source)
    meta = {
        "model": model_reference(spec),
        "model_name": str(getattr(model, "model_name", "") or type(model).__name__),
        "source": source,
        "revision": revision,
        "cl_zoo_version": __version__,
    }
    threshold = recorded_threshold(getattr(model, "checkpoint_config", None))
    if threshold is not None:
        meta["dedup_threshold"] = str(threshold)
    return meta


def input_metadata(given: Sequence[str | os.PathLike[str]]) -> dict[str, str]:
    """The inputs of a run as typed and as absolute paths (JSON lists), beside absolute row paths."""
    typed = [os.fspath(g) for g in given]
    return {"inputs": json.dumps(typed), "input_roots": json.dumps([os.path.abspath(g) for g in typed])}


def _atomic_write(final: Path, write: Any) -> None:
    """Let ``write`` fill a same-folder temporary by name (see fileio); no folder is created."""
    with atomic_path(final, mkdir=False) as tmp:
        write(str(tmp))


PATHS_SIDECAR = ".paths.jsonl"
LEGACY_PATHS_SIDECAR = ".paths.txt"
# Sidecar metadata is a few hundred bytes; anything far larger is not ours and is not parsed.
_MAX_META_BYTES = 16 << 20


def write_path_list(final: str | os.PathLike[str], paths: Sequence[str]) -> Path:
    """One JSON string per line, written atomically.

    File names may hold ``\n``, ``\r`` or U+2028, so a plain line list would split them; JSON with
    ``ensure_ascii`` escapes every such character (and any undecodable byte kept by Python as a
    lone surrogate), so each row is exactly one ``\n``-terminated line of ASCII.
    """
    final = Path(final)
    _atomic_write(final, lambda tmp: Path(tmp).write_text("".join(json.dumps(p) + "\n" for p in paths), encoding="ascii"))
    return final


def read_path_list(listing: str | os.PathLike[str]) -> list[str]:
    """The row paths of an embeddings file: ``.paths.jsonl`` lines, or an old ``.paths.txt``.

    Old listings hold one raw name per ``\n``-terminated line (what earlier versions wrote), so
    they are split on ``\n`` only: splitting on every Unicode line break, as before, miscounted
    rows whose names hold ``\r`` or U+2028.
    """
    listing = Path(listing)
    try:
        data = listing.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {listing}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{listing} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if listing.name.endswith(LEGACY_PATHS_SIDECAR):
        return lines
    paths = []
    for n, line in enumerate(lines, 1):
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            raise DataError(f"{listing} line {n} is not a JSON string") from None
        if not isinstance(value, str):
            raise DataError(f"{listing} line {n} is {type(value).__name__}, not a JSON string path")
        paths.append(value)
    return paths


def path_listing(embeddings: str | os.PathLike[str]) -> Path:
    """The sidecar naming the rows of a ``.npy``: ``.paths.jsonl``, else an old ``.paths.txt``."""
    listing = sidecar(embeddings, PATHS_SIDECAR)
    legacy = sidecar(embeddings, LEGACY_PATHS_SIDECAR)
    return legacy if not listing.is_file() and legacy.is_file() else listing


def save_embeddings(
    out: str | os.PathLike[str], features: np.ndarray, paths: Sequence[str], metadata: dict[str, str], *, half: bool = False
) -> list[Path]:
    """Write ``.npy`` (+ ``.paths.jsonl``, ``.csv``, ``.meta.json``) or ``.parquet``; returns the files.

    Every file is written under a temporary name and renamed into place, the sidecars before the
    array, so a reader never sees an array without its row names. Row paths are stored absolute,
    so the file means the same thing from any working directory. A ``.paths.txt`` left by an
    older version beside the output is removed, so no stale listing contradicts the new one.
    Non-finite features are refused (:class:`NonFiniteFeatureError`) before anything is written.
    """
    out = Path(out)
    paths = [os.path.abspath(p) for p in paths]
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ClZooError(f"output {out} must end in .npy or .parquet")
    if features.ndim != 2 or len(features) != len(paths):
        raise DataError(f"cannot save {features.shape} features for {len(paths)} paths")
    bad = ~np.isfinite(features).all(axis=1)
    if bad.any():
        raise NonFiniteFeatureError(f"feature of {display_path(paths[int(np.flatnonzero(bad)[0])])} is not finite (NaN or inf); nothing was written to {out}")
    array = features.astype(np.float16 if half else np.float32)
    if half and not np.isfinite(array).all():
        raise DataError(f"features exceed the float16 range; save {out} without --half")
    meta: dict[str, object] = {**metadata, "dims": int(array.shape[1]), "count": len(paths), "dtype": str(array.dtype)}
    if out.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        unencodable = next((p for p in paths if not _utf8_encodable(p)), None)
        if unencodable is not None:
            raise DataError(f"file name {unencodable!r} is not UTF-8, which parquet strings must be; write a .npy output instead")
        values = pa.array(array.reshape(-1), type=pa.float16() if half else pa.float32())
        column = pa.FixedSizeListArray.from_arrays(values, array.shape[1]) if len(paths) else pa.array([], pa.list_(pa.float32(), array.shape[1]))
        table = pa.table({"path": pa.array(list(paths), pa.string()), "embedding": column})
        # bytes only: nested records (int8's quantization) as JSON text, scalars as they print
        table = table.replace_schema_metadata({f"cl_zoo.{k}": json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                                               for k, v in meta.items()})
        _atomic_write(out, lambda tmp: pq.write_table(table, tmp))
        return [out]
    written = []
    listing = write_path_list(sidecar(out, PATHS_SIDECAR), paths)
    table = sidecar(out, ".csv")

    def write_csv(tmp: str) -> None:
        # surrogateescape: a name that is not UTF-8 is written as its own bytes, i.e. the real name.
        with open(tmp, "w", newline="", encoding="utf-8", errors="surrogateescape") as fh:
            writer = csv.writer(fh)
            writer.writerow(["index", "path"])
            writer.writerows(enumerate(paths))

    _atomic_write(table, write_csv)
    info = sidecar(out, ".meta.json")
    _atomic_write(info, lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1) + "\n"))

    def write_npy(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.save would append ".npy" to a bare name
            np.save(fh, array)

    _atomic_write(out, write_npy)
    sidecar(out, LEGACY_PATHS_SIDECAR).unlink(missing_ok=True)
    written += [out, listing, table, info]
    return written


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_npy_features(path: str | os.PathLike[str]) -> np.ndarray:
    """A 2-D float ``.npy`` as float32, its header checked before any data is read.

    The header is only a few bytes of text; trusting it would let a small file ask for an array
    of 10^14 elements, an object array (pickles) or strings. The check is
    :func:`cl_zoo.index.source.read_npy_header`'s (shared with ``cl-zoo index``, which reads the
    same files block by block); then the data is read through a memory map, bounded by the file.
    """
    from cl_zoo.index.source import read_npy_header

    header = read_npy_header(path)
    shape = (header.rows, header.dims)
    if header.rows * header.dims == 0:
        return np.zeros(shape, np.float32)
    try:
        data = np.memmap(header.path, dtype=header.dtype, mode="r", offset=header.offset, shape=shape,
                         order="F" if header.fortran else "C")
        return np.array(data, dtype=np.float32, order="C")
    except (OSError, ValueError) as exc:
        raise DataError(f"{header.path} is not a readable .npy file ({exc})") from None


def read_metadata(info: str | os.PathLike[str]) -> dict[str, object]:
    """A ``.meta.json`` sidecar: a JSON object whose recorded fields have their recorded types."""
    info = Path(info)
    try:
        if info.stat().st_size > _MAX_META_BYTES:
            raise DataError(f"{info} is {info.stat().st_size} bytes, too large for an embeddings metadata file")
        meta = json.loads(info.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise DataError(f"cannot read {info}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DataError(f"{info} is not valid JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{info} holds a JSON {type(meta).__name__}, not an object")
    return _checked_metadata(meta, str(info))


def _checked_metadata(meta: dict[str, object], where: str) -> dict[str, object]:
    """Refuse recorded fields of the wrong type, which later steps would trip over."""
    for key in ("dims", "count"):
        if key in meta and (isinstance(meta[key], bool) or not isinstance(meta[key], int) or meta[key] < 0):  # type: ignore[operator]
            raise DataError(f"{where}: {key} must be a non-negative integer, got {meta[key]!r}")
    for key in ("model", "model_name", "source", "revision", "dtype"):
        if key in meta and not isinstance(meta[key], str):
            raise DataError(f"{where}: {key} must be a string, got {type(meta[key]).__name__}")
    return meta


def _parquet_embeddings(path: Path) -> tuple[np.ndarray, list[str], dict[str, object]]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        paths_col = table.column("path") if "path" in table.column_names else None
        emb_col = table.column("embedding") if "embedding" in table.column_names else None
        if paths_col is None or emb_col is None:
            raise DataError(f"{path} has no 'path' and 'embedding' columns; was it written by cl-zoo embed?")
        column = emb_col.combine_chunks()
        raw_meta = table.schema.metadata or {}
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure (ArrowInvalid, OSError, MemoryError...) is a bad file
        raise DataError(f"{path} is not a readable parquet file ({' '.join(str(exc).split())[:160]})") from None
    meta: dict[str, object] = {}
    for k, v in raw_meta.items():
        if k.startswith(b"cl_zoo."):
            try:
                meta[k.decode()[len("cl_zoo."):]] = v.decode()
            except UnicodeDecodeError:
                raise DataError(f"{path}: metadata {k!r} is not UTF-8 text") from None
    for key in ("dims", "count"):  # numbers, as in .meta.json
        if key in meta:
            text = str(meta[key]).strip()
            if not text.isdigit() or not text.isascii():
                raise DataError(f"{path}: metadata {key} must be a non-negative integer, got {text[:40]!r}")
            meta[key] = int(text)
    if not (pa.types.is_string(paths_col.type) or pa.types.is_large_string(paths_col.type)):
        raise DataError(f"{path}: the 'path' column holds {paths_col.type}, not strings")
    if paths_col.null_count:
        raise DataError(f"{path}: the 'path' column has {paths_col.null_count} empty (null) rows")
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        raise DataError(f"{path}: the 'embedding' column holds {kind}, not lists of numbers")
    if not pa.types.is_floating(kind.value_type):
        raise DataError(f"{path}: the 'embedding' column holds lists of {kind.value_type}, not floating-point numbers")
    n = len(column)
    if n != len(paths_col):
        raise DataError(f"{path} has {n} embeddings but {len(paths_col)} paths")
    if column.null_count:
        raise DataError(f"{path}: the 'embedding' column has {column.null_count} empty (null) rows")
    if n:
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        dims = int(lengths[0])
        if (lengths != dims).any():
            row = int(np.flatnonzero(lengths != dims)[0])
            raise DataError(f"{path}: embedding rows differ in length ({dims} in row 0, {int(lengths[row])} in row {row}); refusing to reshape them")
    else:
        dims = int(meta.get("dims", 0))  # type: ignore[arg-type]
    if "dims" in meta and meta["dims"] != dims and n:
        raise DataError(f"{path} records dims {meta['dims']} but its embeddings have {dims}")
    values = pc.list_flatten(column) if not pa.types.is_fixed_size_list(kind) else column.flatten()
    if values.null_count:
        raise DataError(f"{path}: the 'embedding' column holds {values.null_count} null numbers")
    if len(values) != n * dims:
        raise DataError(f"{path}: the 'embedding' column holds {len(values)} numbers, not {n} x {dims}")
    features = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, dims)
    try:
        paths = [str(p) for p in paths_col.to_pylist()]
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: the 'path' column holds text that is not UTF-8 ({exc.reason})") from None
    return features, paths, _checked_metadata(meta, str(path))


def load_embeddings(path: str | os.PathLike[str]) -> tuple[np.ndarray, list[str], dict[str, object]]:
    """Read what :func:`save_embeddings` wrote: float32 features, paths, metadata.

    These files are inputs like any other: each part is checked (types, sizes, row count against
    the path list and the recorded count, finite values) and anything off is one
    :class:`DataError` line; rows never silently shift against their paths.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"embeddings file does not exist: {path}")
    if path.suffix.lower() == ".parquet":
        features, paths, meta = _parquet_embeddings(path)
        where = path.name
    elif path.suffix.lower() == ".npy":
        listing = path_listing(path)
        if not listing.is_file():
            raise DataError(f"{path} has no {listing.name} beside it naming its rows")
        info = sidecar(path, ".meta.json")
        meta = read_metadata(info) if info.is_file() else {}
        features = read_npy_features(path)
        paths = read_path_list(listing)
        if len(paths) != features.shape[0]:
            raise DataError(f"{path} has shape {features.shape} but {listing.name} lists {len(paths)} paths")
        where = info.name
    else:
        raise DataError(f"{path}: embeddings must be a .npy or .parquet file")
    for key, actual in (("count", features.shape[0]), ("dims", features.shape[1])):
        if key in meta and meta[key] != actual and features.shape[0]:
            raise DataError(f"{where} records {key} {meta[key]} but {path} has {actual}; the files do not belong together")
    bad = ~np.isfinite(features).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path} row {row} ({display_path(paths[row])}) is not finite (NaN or inf); re-embed with a working model")
    return features, paths, meta


def write_failures(path: str | os.PathLike[str], failures: Sequence[tuple[str, str]]) -> Path:
    """``path,reason`` rows, written atomically."""
    final = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["path", "reason"])
            writer.writerows(failures)

    _atomic_write(final, write)
    return final


__all__ = [
    "LEGACY_PATHS_SIDECAR",
    "NonFiniteFeatureError",
    "PATHS_SIDECAR",
    "FeatureResult",
    "Preprocess",
    "embed",
    "extract_features",
    "SavedProgress",
    "input_metadata",
    "load_embedding_model",
    "load_embeddings",
    "check_finite",
    "display_path",
    "model_label",
    "model_metadata",
    "path_listing",
    "read_metadata",
    "read_npy_features",
    "read_path_list",
    "write_path_list",
    "model_reference",
    "prepare_model",
    "resolve_model_reference",
    "saved_progress",
    "resolve_engine",
    "save_embeddings",
    "sidecar",
    "write_failures",
]
