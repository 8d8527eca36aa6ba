"""Frozen features for evaluation, cached on disk.

kNN and the fast linear probe both start from one pass of the backbone over a split. That pass is
the expensive part (minutes to hours), while the classifiers on top take seconds, so features are
stored under ``$CL_ZOO_CACHE/features`` and reused. The cache key covers everything that changes
the numbers: the weights themselves (a sha256 over the state dict, so a retrained checkpoint with the
same name never hits a stale entry), the data (the file-list hash of :mod:`cl_zoo.data.folder`) and
the preprocessing (mean, std, resize, crop, interpolation), and the engine that ran (precision and
backend: bf16 or OpenVINO features differ from fp32 ones by cosine ~1e-5, which is not nothing for a
cache that claims to return *the* features).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from cl_zoo.backends.int8 import CALIBRATION_SIZE, calibration_sample
from cl_zoo.data.archive import cache_root
from cl_zoo.data.folder import file_list_hash, open_image_folder
from cl_zoo.embedding import extract_features, resolve_engine
from cl_zoo.errors import DataError
from cl_zoo.fileio import atomic_save_npy, files_fingerprint, open_regular_file
from cl_zoo.registry import PretrainedCfg

FEATURE_CACHE_VERSION = 1


def feature_cache_dir() -> Path:
    """``$CL_ZOO_CACHE/features`` (default ``~/.cache/cl-zoo/features``)."""
    return cache_root() / "features"


def model_cfg(model: nn.Module) -> PretrainedCfg:
    return getattr(model, "pretrained_cfg", None) or PretrainedCfg()


def _interpolation(name: str):  # noqa: ANN202 - torchvision enum
    from torchvision.transforms import InterpolationMode

    try:
        return InterpolationMode(name.lower())
    except ValueError as exc:
        raise DataError(f"unknown interpolation {name!r} in the model's pretrained_cfg") from exc


def eval_transform(cfg: PretrainedCfg) -> Callable[[Image.Image], torch.Tensor]:
    """Resize the short side to input/crop_pct, centre-crop, normalise: the model's own preprocessing."""
    from torchvision import transforms as T

    size = tuple(cfg.input_size[-2:])
    return T.Compose(
        [
            T.Resize(cfg.resize_size, interpolation=_interpolation(cfg.interpolation)),
            T.CenterCrop(size),
            T.ToTensor(),
            T.Normalize(cfg.mean, cfg.std),
        ]
    )


def train_transform(cfg: PretrainedCfg, scale: tuple[float, float] = (0.08, 1.0)) -> Callable[[Image.Image], torch.Tensor]:
    """RandomResizedCrop + horizontal flip at the model's input size (the linear-protocol augmentation)."""
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(tuple(cfg.input_size[-2:]), scale=scale, interpolation=_interpolation(cfg.interpolation)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(cfg.mean, cfg.std),
        ]
    )


def preprocessing_spec(cfg: PretrainedCfg) -> dict[str, Any]:
    return {
        "input_size": list(cfg.input_size),
        "resize_size": cfg.resize_size,
        "crop_pct": cfg.crop_pct,
        "interpolation": cfg.interpolation,
        "mean": list(cfg.mean),
        "std": list(cfg.std),
    }


class ImageListDataset(torch.utils.data.Dataset):
    """``(transform(image), label)`` for a list of image files; images are always decoded as RGB."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int] | np.ndarray, transform: Callable) -> None:
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        try:
            with open_regular_file(self.paths[i]) as fh, Image.open(fh) as img:
                image = img.convert("RGB")
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read image {self.paths[i]}: {exc}") from exc
        return self.transform(image), int(self.labels[i])


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the state dict (names, dtypes, shapes, bytes): the identity of the weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def model_identity(model: nn.Module) -> dict[str, Any]:
    """Name, source, revision and weights digest of a model, for reports and cache keys."""
    cfg = model_cfg(model)
    config = getattr(model, "checkpoint_config", None) or {}
    return {
        "name": getattr(model, "model_name", None) or getattr(model, "arch_name", type(model).__name__),
        "architecture": getattr(model, "arch_name", type(model).__name__),
        "source": getattr(model, "checkpoint_source", None) or cfg.hf_hub_id or "registry",
        "revision": cfg.revision,
        "weights_sha256": weights_sha256(model),
        "checkpoint_files_sha256": dict(config.get("files") or cfg.sha256 or {}),
        "num_features": int(getattr(model, "num_features", 0)),
    }


def model_input_channels(model: nn.Module) -> int:
    """Channels the model expects: its config's input size, or its first convolution."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and not any(isinstance(m, nn.Conv2d) for m in module.children()):
            if getattr(model, "to_lab", None) is None:  # CMC converts RGB itself; its convs see L / ab
                return int(module.in_channels)
            break
    return int(model_cfg(model).input_size[0])


def check_input_channels(model: nn.Module, data_channels: int = 3) -> None:
    expected = model_input_channels(model)
    if expected != data_channels:
        raise DataError(
            f"model {getattr(model, 'model_name', type(model).__name__)} expects {expected} input channels "
            f"but the data has {data_channels} (RGB images)"
        )


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compute_features(
    model: nn.Module,
    paths: Sequence[str],
    *,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    workers: int = 0,
    progress: bool = False,
    precision: str = "fp32",
    backend: str = "torch",
    engine: dict[str, Any] | None = None,
    calibration: Sequence[str] | None = None,
    calibration_seed: int = 0,
    force_int8: bool = False,
) -> np.ndarray:
    """Pooled features ``[N, D]`` float32 of images under the model's eval preprocessing.

    ``engine``, when given, is filled with the precision and backend that actually ran (and, for
    int8, the quantization record). ``calibration``/``calibration_seed``/``force_int8``: see
    :func:`cl_zoo.embedding.extract_features`.

    Extraction is :func:`cl_zoo.embedding.extract_features` (the one batched loop that ``embed``
    and ``search`` also use, so an evaluation sees exactly the features a user embeds). Unlike
    ``embed``, evaluation cannot skip unreadable files: labels are aligned by position.
    """
    if len(paths) == 0:
        raise DataError("no images to extract features from (empty split)")
    check_input_channels(model)
    result = extract_features(
        model, list(paths), batch_size=batch_size, device=device if device is not None else "auto",
        workers=workers, progress=progress, precision=precision, backend=backend, calibration=calibration,
        calibration_seed=calibration_seed, force_int8=force_int8,
    )
    if engine is not None:
        engine.update(precision=result.precision, backend=result.backend, backend_reason=result.backend_reason)
        if result.quantization is not None:
            engine["quantization"] = result.quantization
    if result.failures:
        path, reason = result.failures[0]
        raise DataError(f"{len(result.failures)} image(s) could not be read (first: {path}: {reason}); fix or remove them")
    return np.ascontiguousarray(result.features, dtype=np.float32)


@dataclass
class FeatureSet:
    """Features of one split with where they came from."""

    features: np.ndarray
    labels: np.ndarray
    classes: list[str]
    key: str
    cached: bool  # True when read from the cache rather than computed
    seconds: float
    path: Path | None
    precision: str = "fp32"  # the engine that computed them
    backend: str = "torch"
    quantization: dict[str, Any] | None = None  # int8 asked for: calibration and fidelity (None when read from the cache)


def cache_key(identity: dict[str, Any], file_list_hash: str, preprocessing: dict[str, Any], fingerprint: str = "",
              engine: dict[str, Any] | None = None) -> str:
    payload: dict[str, Any] = {
        "version": FEATURE_CACHE_VERSION,
        "model": identity.get("name"),
        "revision": identity.get("revision"),
        "weights_sha256": identity["weights_sha256"],
        "data": file_list_hash,
        "files": fingerprint,
        "preprocessing": preprocessing,
    }
    if engine and (engine.get("precision"), engine.get("backend")) != ("fp32", "torch"):
        # fp32/torch keys stay what they were before engines existed, so old caches still hit.
        payload["engine"] = {"precision": engine["precision"], "backend": engine["backend"]}
        if engine.get("calibration"):  # int8: the features depend on the images it was calibrated on
            payload["engine"].update(calibration=engine["calibration"], forced=bool(engine.get("forced")))
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def split_features(
    model: nn.Module,
    data: Any,
    *,
    identity: dict[str, Any] | None = None,
    cache: bool = True,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    workers: int = 0,
    progress: bool = False,
    precision: str = "fp32",
    backend: str = "torch",
    calibration: Sequence[str] | None = None,
    calibration_seed: int = 0,
    force_int8: bool = False,
) -> FeatureSet:
    """Features of a split (an :class:`~cl_zoo.data.folder.ImageFolderData`), from the cache if there.

    The cache file is memory-mapped on a hit, so a 1M x 2048 memory costs no RAM until searched.
    ``precision``/``backend`` are resolved first (:func:`cl_zoo.embedding.resolve_engine`) so the
    cache is looked up under the engine that would run. int8 calibrates on a ``calibration_seed``
    sample of ``calibration`` (evaluations pass the train split, so both splits share one model).
    """
    if len(data.paths) == 0:
        raise DataError(f"empty split: {getattr(data, 'source', '?')}")
    check_input_channels(model)
    identity = identity or model_identity(model)
    dev = device if device is not None else "auto"
    resolved, choice = resolve_engine(model, dev, precision, backend, len(data.paths))
    planned: dict[str, Any] = {"precision": resolved, "backend": choice.name}
    int8_opts: dict[str, Any] = {}
    if resolved == "int8":
        pool = list(calibration) if calibration is not None else list(data.paths)
        planned.update(calibration=files_fingerprint(calibration_sample(pool, CALIBRATION_SIZE, calibration_seed)),
                       forced=force_int8)
        int8_opts = {"calibration": pool, "calibration_seed": calibration_seed, "force_int8": force_int8}
    spec, files = preprocessing_spec(model_cfg(model)), files_fingerprint(data.paths)
    key = cache_key(identity, data.file_list_hash, spec, files, planned)
    root = Path(cache_dir or feature_cache_dir())
    path = root / f"{key}.npy"
    start = time.perf_counter()
    if cache and path.is_file():
        try:
            feats = np.load(path, mmap_mode="r")
            # A copied or damaged cache entry is recomputed, never served: shape, dtype and finiteness
            # (checked in blocks, so a memory-mapped entry is not copied whole).
            if (feats.ndim == 2 and feats.shape[0] == len(data.paths) and feats.dtype == np.float32
                    and all(np.isfinite(feats[i:i + 65536]).all() for i in range(0, feats.shape[0], 65536))):
                return FeatureSet(feats, np.asarray(data.labels), list(data.classes), key, True,
                                  time.perf_counter() - start, path, resolved, choice.name)
        except (OSError, ValueError):
            pass  # an unreadable entry is recomputed and overwritten
    ran: dict[str, Any] = {}
    feats = compute_features(model, data.paths, batch_size=batch_size, device=device, workers=workers, progress=progress,
                             precision=resolved, backend=choice.name, engine=ran, **int8_opts)
    if (ran.get("backend", choice.name), ran.get("precision", resolved)) != (choice.name, resolved):
        # OpenVINO could not convert, or int8 failed its gate: store under what ran
        key = cache_key(identity, data.file_list_hash, spec, files, ran)
        path = root / f"{key}.npy"
    seconds = time.perf_counter() - start
    if cache:
        atomic_save_npy(path, feats)
    return FeatureSet(feats, np.asarray(data.labels), list(data.classes), key, False, seconds, path if cache else None,
                      ran.get("precision", resolved), ran.get("backend", choice.name), ran.get("quantization"))


def check_same_classes(train_classes: Sequence[str], test_classes: Sequence[str]) -> None:
    """Label ids are positions in the sorted class list, so the lists must be identical."""
    if list(train_classes) != list(test_classes):
        only_train = sorted(set(train_classes) - set(test_classes))
        only_test = sorted(set(test_classes) - set(train_classes))
        detail = []
        if only_train:
            detail.append(f"only in train: {', '.join(only_train[:5])}")
        if only_test:
            detail.append(f"only in test: {', '.join(only_test[:5])}")
        raise DataError(f"train and test have different class sets ({'; '.join(detail) or 'different order'})")
    if len(train_classes) < 2:
        raise DataError(f"a single class ({train_classes[0] if train_classes else 'none'}); classification needs at least 2")


def first_per_class(data: Any, n: int) -> Any:
    """The first ``n`` images of every class in the folder's sorted order (a deterministic subset).

    The file-list hash is recomputed, so the cache and the report identify the subset, not the
    full split it came from.
    """
    if n < 1:
        raise DataError(f"--per-class must be at least 1, got {n}")
    labels = np.asarray(data.labels)
    keep = np.concatenate([np.flatnonzero(labels == c)[:n] for c in range(len(data.classes))]).astype(np.int64)
    keep.sort()
    paths = [data.paths[i] for i in keep]
    root = getattr(data, "root", "") or ""
    rel = [os.path.relpath(p, root) if root else p for p in paths]
    digest = file_list_hash(rel, labels[keep])
    subset = {"of_images": len(data.paths), "drawn": f"the first {n} of each class, by sorted path"}
    return dataclasses.replace(data, paths=paths, labels=labels[keep], file_list_hash=digest, subset=subset)


def open_eval_split(spec: str | os.PathLike, root: str | os.PathLike | None, split: str | None, role: str) -> Any:
    """Open the ``role`` ("train" or "test") split of ``spec``.

    With ``split=None`` the split is found: ``train`` for train; ``test`` then ``val`` for test
    (Imagenette has no test split); and a plain class folder (no split folders) is used as is.
    """
    if split is not None:
        return open_image_folder(spec, root=root, split=split)
    candidates = ["train"] if role == "train" else ["test", "val"]
    first_error: DataError | None = None
    for cand in candidates:
        try:
            return open_image_folder(spec, root=root, split=cand)
        except DataError as exc:
            first_error = first_error or exc
    try:
        return open_image_folder(spec, root=root, split=None)
    except DataError as exc:
        if "holds split folders" in str(exc) and first_error is not None:
            raise DataError(f"{exc}; no '{'/'.join(candidates)}' folder found for the {role} split") from exc
        raise
