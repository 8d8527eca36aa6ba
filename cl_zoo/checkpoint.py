"""The checkpoint format: a folder that is exactly a Hugging Face Hub model repo.

::

    config.json                      architecture, model args, preprocessing, method, recipe, metrics
    model.safetensors                backbone weights, or shards model-0000K-of-0000N.safetensors
    model.safetensors.index.json     with this index when one file would pass the shard size
    README.md                        the model card (YAML front matter + sections)

Sharding follows ``huggingface_hub``'s convention (same file names, same index schema), so
``transformers``-style tooling and the Hub's file browser understand the folder. Only safetensors
are written or read here: loading never unpickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from cl_zoo.errors import CheckpointError
from cl_zoo.fileio import current_umask
from cl_zoo.registry import PretrainedCfg, build_arch

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CARD_NAME = "README.md"
FORMAT_VERSION = 1
DEFAULT_MAX_SHARD_SIZE = "15MB"


def parse_size(size: int | str) -> int:
    """``"15MB"`` -> 15_000_000 (decimal units, as huggingface_hub uses)."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    for unit, factor in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def weight_files(folder: str | os.PathLike[str]) -> list[str]:
    """Names of the safetensors files that hold a folder's weights (one file or the shards)."""
    folder = Path(folder)
    if (folder / INDEX_NAME).is_file():
        index = _read_json(folder / INDEX_NAME)
        try:
            return sorted(set(index["weight_map"].values()))
        except (KeyError, AttributeError) as exc:
            raise CheckpointError(f"{folder / INDEX_NAME} has no 'weight_map'") from exc
    if (folder / WEIGHTS_NAME).is_file():
        return [WEIGHTS_NAME]
    raise CheckpointError(f"{folder} has no {WEIGHTS_NAME} (nor a sharded {INDEX_NAME}): weights missing")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc


def _shard(state: Mapping[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def model_config(
    model: nn.Module,
    *,
    recipe: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config.json content for a model built by the registry."""
    from cl_zoo import __version__

    arch = getattr(model, "arch_name", None)
    if arch is None:
        raise CheckpointError("model was not built by cl_zoo.create_model (no arch_name); cannot describe it")
    cfg: PretrainedCfg = getattr(model, "pretrained_cfg", PretrainedCfg())
    cfg_dict = cfg.to_dict()
    if metrics:
        cfg_dict["metrics"] = {**cfg_dict.get("metrics", {}), **dict(metrics)}
    config: dict[str, Any] = {
        "format": "cl-zoo",
        "format_version": FORMAT_VERSION,
        "cl_zoo_version": __version__,
        "model_name": getattr(model, "model_name", arch),
        "architecture": arch,
        "model_args": dict(getattr(model, "model_kwargs", {})),
        "num_features": int(getattr(model, "num_features", 0)),
        "num_params": sum(p.numel() for p in model.parameters()),
        "method": cfg.method,
        "recipe": dict(recipe or {}),
        "metrics": dict(cfg_dict["metrics"]),
        "pretrained_cfg": cfg_dict,
    }
    if extra_config:
        config.update(extra_config)
    return config


def save_pretrained(
    model: nn.Module,
    folder: str | os.PathLike[str],
    *,
    recipe: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra_config: Mapping[str, Any] | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    dtype: torch.dtype | None = None,
    card: bool = True,
    card_sections: Mapping[str, str] | None = None,
) -> Path:
    """Write ``model`` as a Hub-ready folder; every file appears complete or not at all.

    ``dtype=torch.float16`` stores floating tensors in half precision (the zoo's bundled weights,
    to stay small in git); :func:`load_folder` always returns float32.
    """
    folder = Path(folder)
    config = model_config(model, recipe=recipe, metrics=metrics, extra_config=extra_config)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.contiguous().clone()
    config["weights_dtype"] = str(dtype or torch.float32).replace("torch.", "")
    shards = _shard(state, parse_size(max_shard_size))

    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
    try:
        written: list[str] = []
        if len(shards) == 1:
            save_file(shards[0], str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
            written.append(WEIGHTS_NAME)
        else:
            weight_map: dict[str, str] = {}
            total = 0
            for i, shard in enumerate(shards, start=1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(staging / name), metadata={"format": "pt"})
                written.append(name)
                for key, tensor in shard.items():
                    weight_map[key] = name
                    total += tensor.numel() * tensor.element_size()
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (staging / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            written.append(INDEX_NAME)
        config["files"] = {name: sha256_file(staging / name) for name in written if name.endswith(".safetensors")}
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        written.append(CONFIG_NAME)
        if card:
            from cl_zoo.card import render_card

            (staging / CARD_NAME).write_text(render_card(config, sections=card_sections, folder=folder))
            written.append(CARD_NAME)
        # Remove weights of an earlier save that the new one does not overwrite (shard counts differ).
        for old in list(folder.glob("model*.safetensors")) + [folder / INDEX_NAME]:
            if old.name not in written and old.exists():
                old.unlink()
        mode = 0o666 & ~current_umask()  # safetensors creates 0600 files; checkpoints are for sharing
        for name in written:
            os.chmod(staging / name, mode)
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a checkpoint folder's config.json."""
    path = Path(folder) / CONFIG_NAME
    config = _read_json(path)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    for key, kind in (("architecture", str), ("model_args", dict), ("pretrained_cfg", dict)):
        if key not in config:
            raise CheckpointError(f"{path} lacks '{key}'")
        if not isinstance(config[key], kind):
            raise CheckpointError(f"{path}: '{key}' must be a {kind.__name__}")
    return config


def load_state_dict(folder: str | os.PathLike[str], sha256: Mapping[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Read a folder's safetensors (single or sharded), verifying pinned checksums."""
    folder = Path(folder)
    state: dict[str, torch.Tensor] = {}
    for name in weight_files(folder):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is listed in the shard index but missing")
        if sha256 and name in sha256:
            actual = sha256_file(path)
            if actual != sha256[name]:
                raise CheckpointError(
                    f"sha256 mismatch for {path}: expected {sha256[name][:16]}..., got {actual[:16]}...; "
                    "the file is corrupt or not the pinned revision"
                )
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    return state


@dataclass(frozen=True)
class MismatchMessages:
    """Templates for :func:`load_state_into`'s errors, so each caller can speak its user's language.

    Filled with ``str.format``: every template gets ``source`` plus the caller's ``context``;
    ``keys`` also gets ``problems`` (the ``missing``/``unexpected`` parts, each given ``n`` and
    ``first``, joined by ``"; "``), ``shape`` gets ``key``, ``shape`` and ``expected``, and
    ``not_finite`` gets ``key``.
    """

    keys: str = "weights in {source} do not match the architecture: {problems}"
    missing: str = "{n} missing (first: {first})"
    unexpected: str = "{n} unexpected (first: {first})"
    shape: str = "weights in {source} do not match the architecture: {key} has shape {shape}, expected {expected}"
    not_finite: str = "{source}: {key} contains NaN or infinite values; the file is damaged"


def load_state_into(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    source: str,
    *,
    messages: MismatchMessages = MismatchMessages(),
    context: Mapping[str, Any] | None = None,
    check_finite: bool = False,
) -> int:
    """Strictly load weights, with one-line errors that name the first offending key.

    Every check runs before the model is touched, so a bad file leaves the model as it was.
    ``check_finite`` also refuses NaN/inf values (worth its cost for files from outside the zoo).
    Floating tensors are cast to the model's dtypes; returns how many needed that.
    """
    fmt = {"source": source, **(context or {})}
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(messages.missing.format(n=len(missing), first=missing[0]))
        if unexpected:
            parts.append(messages.unexpected.format(n=len(unexpected), first=unexpected[0]))
        raise CheckpointError(messages.keys.format(problems="; ".join(parts), **fmt))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(messages.shape.format(
                key=key, shape=tuple(tensor.shape), expected=tuple(expected[key].shape), **fmt))
        if check_finite and tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(messages.not_finite.format(key=key, **fmt))
    cast = sum(1 for k, v in state.items() if v.is_floating_point() and v.dtype != expected[k].dtype)
    converted = {k: v.to(expected[k].dtype) if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(converted, strict=True)
    return cast


def load_folder(
    folder: str | os.PathLike[str], *, sha256: Mapping[str, str] | None = None, model_name: str | None = None
) -> nn.Module:
    """Build the model a checkpoint folder describes and load its weights (float32, eval mode)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a checkpoint folder")
    config = read_config(folder)
    try:
        cfg = PretrainedCfg.from_dict(config["pretrained_cfg"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder / CONFIG_NAME}: bad pretrained_cfg ({exc})") from exc
    # The registry's pins are authoritative; without them, the digests recorded at save time still
    # catch a truncated download or a corrupted copy.
    pins = dict(config.get("files") or {})
    pins.update(sha256 or {})
    model = build_arch(config["architecture"], cfg, **config["model_args"])
    load_state_into(model, load_state_dict(folder, pins or None), str(folder))
    model.model_name = model_name or config.get("model_name") or config["architecture"]
    model.checkpoint_config = config
    model.checkpoint_source = str(folder)
    return model.eval()
