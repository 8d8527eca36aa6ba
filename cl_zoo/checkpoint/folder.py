"""The checkpoint format: a folder that is exactly a Hugging Face Hub model repo, and a timm one.

::

    config.json                      architecture, num_classes, num_features, model_args, pretrained_cfg
                                     (timm's fields only); cl-zoo's own keys beside them (method,
                                     recipe, metrics, cl_zoo_pretrained_cfg, files, evaluations...)
    model.safetensors                backbone weights; shards model-0000K-of-0000N.safetensors plus
    model.safetensors.index.json     this index only past the Hub's usual shard size (5 GB)
    README.md                        the model card (YAML front matter + sections)

format_version 2 is what ``timm.create_model("local-dir:FOLDER" or "hf-hub:owner/name",
pretrained=True)`` reads for the ResNets timm has (:mod:`cl_zoo.checkpoint.timm_compat`): timm
passes every ``pretrained_cfg`` key to its ``PretrainedCfg`` dataclass, which refuses unknown ones,
and reads only ``model.safetensors``. Folders written as version 1 (every field in
``pretrained_cfg``, 15 MB shards) still load. Shards are cut by ``huggingface_hub``'s
``split_torch_state_dict_into_shards`` (its names, its index schema, its 5 GB default). Only
safetensors are written or read here: loading never unpickles.
"""

from __future__ import annotations

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

# The card module by reference (card.render_card): a replacement patched in there is the one used.
import cl_zoo.checkpoint.card as card_module
from cl_zoo.checkpoint.layout import CARD_NAME, CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME
from cl_zoo.checkpoint.timm_compat import (
    ZOO_CFG_KEY, merged_pretrained_cfg, split_pretrained_cfg, written_architecture, zoo_architecture,
)
from cl_zoo.checkpoint.checks import (
    FLOAT_DTYPES,
    TORCH_DTYPE_NAMES,
    build_error,
    member,
    read_safetensors_header,
    validate_model_args,
    validate_pretrained_cfg,
    weights_name,
)
from cl_zoo import __version__
from cl_zoo.errors import CheckpointError, ModelNotFoundError
from cl_zoo.fileio import (  # sha256_file: also served as cl_zoo.checkpoint.sha256_file
    MAX_CHECKPOINT_CONFIG_BYTES,
    atomic_write_text,
    current_umask,
    read_bounded_json,
    sha256_file,
)
from cl_zoo.registry import PretrainedCfg, build_arch, get_arch
from cl_zoo.text import one_line

# Bounds on what a folder's JSON may hold, checked before reading: the zoo's largest config is 9 KB
# (a tier card with every seed's figures), its largest shard index 20 KB (CMC's pair); a 70B-parameter
# LLM's index is about 100 KB.
MAX_CONFIG_BYTES = MAX_CHECKPOINT_CONFIG_BYTES
MAX_INDEX_BYTES = 16 << 20
FORMAT_VERSION = 2
DEFAULT_MAX_SHARD_SIZE = "5GB"
SHARD_PATTERN = "model{suffix}.safetensors"  # huggingface_hub's filename_pattern: model-00001-of-00003.safetensors


def parse_size(size: int | str) -> int:
    """``"15MB"`` -> 15_000_000 (decimal units, as huggingface_hub uses)."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    for unit, factor in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def weight_files(folder: str | os.PathLike[str]) -> list[str]:
    """Names of the safetensors files that hold a folder's weights (one file or the shards).

    Every name comes out checked by :func:`~cl_zoo.checkpoint.checks.weights_name`: a plain
    ``.safetensors`` name inside the folder, never a path that leads elsewhere.
    """
    folder = Path(folder)
    if (folder / INDEX_NAME).is_file():
        return sorted(set(shard_map(folder).values()))
    if (folder / WEIGHTS_NAME).is_file():
        weights_name(folder, WEIGHTS_NAME, str(folder))
        return [WEIGHTS_NAME]
    raise CheckpointError(f"{folder} has no {WEIGHTS_NAME} (nor a sharded {INDEX_NAME}): weights missing")


def shard_map(folder: Path) -> dict[str, str]:
    """The shard index's ``weight_map`` (tensor name -> shard file), every file name checked."""
    path = member(folder, INDEX_NAME, str(folder))
    index = read_bounded_json(path, max_bytes=MAX_INDEX_BYTES, what="shard index", error=CheckpointError)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path} has no 'weight_map' object")
    for key, name in weight_map.items():
        weights_name(folder, name, f"{path} weight_map[{key!r}]")
    return weight_map



def _shard(state: Mapping[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """``state`` split into the Hub's shards (huggingface_hub's own rule: tensors in order, a new shard
    when the next one would pass ``max_bytes``, a tensor larger than that alone in its shard)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    split = split_torch_state_dict_into_shards(dict(state), filename_pattern=SHARD_PATTERN, max_shard_size=max_bytes)
    if not split.is_sharded:
        return [dict(state)]
    return [{name: state[name] for name in names} for names in split.filename_to_tensors.values()]


def model_config(
    model: nn.Module,
    *,
    recipe: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config.json content for a model built by the registry."""
    arch = getattr(model, "arch_name", None)
    if arch is None:
        raise CheckpointError("model was not built by cl_zoo.create_model (no arch_name); cannot describe it")
    cfg: PretrainedCfg = getattr(model, "pretrained_cfg", PretrainedCfg())
    cfg_dict = cfg.to_dict()
    if metrics:
        cfg_dict["metrics"] = {**cfg_dict.get("metrics", {}), **dict(metrics)}
    timm_cfg, zoo_cfg = split_pretrained_cfg(cfg_dict, arch)
    # timm's keys first (what timm.create_model reads), then cl-zoo's, which timm ignores.
    config: dict[str, Any] = {
        **written_architecture(arch),
        "num_classes": 0,
        "num_features": int(getattr(model, "num_features", 0)),
        "model_args": dict(getattr(model, "model_kwargs", {})),
        "pretrained_cfg": timm_cfg,
        "format": "cl-zoo",
        "format_version": FORMAT_VERSION,
        "cl_zoo_version": __version__,
        "model_name": getattr(model, "model_name", arch),
        "num_params": sum(p.numel() for p in model.parameters()),
        "method": cfg.method,
        "recipe": dict(recipe or {}),
        "metrics": dict(cfg_dict["metrics"]),
        ZOO_CFG_KEY: zoo_cfg,
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
    card_folder: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``model`` as a Hub-ready folder; every file appears complete or not at all.

    ``dtype=torch.float16`` stores floating tensors in half precision (the zoo's bundled weights,
    to stay small in git); :func:`load_folder` always returns float32. ``card_folder`` is the folder
    the card's load calls name when ``folder`` is a staging copy renamed into place afterwards.
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
                name = SHARD_PATTERN.format(suffix=f"-{i:05d}-of-{len(shards):05d}")  # huggingface_hub's names
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
            (staging / CARD_NAME).write_text(
                card_module.render_card(config, sections=card_sections, folder=card_folder if card_folder is not None else folder))
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


# config.json keys in the order model_config writes them (timm's first); others follow in their own order.
_CONFIG_ORDER = ("architecture", "num_classes", "num_features", "model_args", "pretrained_cfg", "format",
                 "format_version", "cl_zoo_version", "model_name", "num_params", "method", "recipe", "metrics",
                 ZOO_CFG_KEY)


def upgrade_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config.json of any format version rewritten as the current one (same facts, timm-readable).

    Used to re-lay out published folders without retraining or re-evaluating them; a current config
    comes back equal.
    """
    merged = merged_pretrained_cfg(config)
    method = config.get("method") if config.get("method") is not None else merged.get("method")
    metrics = config.get("metrics") if config.get("metrics") is not None else merged.get("metrics", {})
    merged.update(method=method, metrics=metrics)
    timm_cfg, zoo_cfg = split_pretrained_cfg(merged, str(config.get("architecture")))
    fresh: dict[str, Any] = {
        "num_classes": 0, "pretrained_cfg": timm_cfg, ZOO_CFG_KEY: zoo_cfg,
        "format": "cl-zoo", "format_version": FORMAT_VERSION, "method": method, "metrics": dict(metrics or {}),
    }
    upgraded = {key: fresh[key] if key in fresh else config[key] for key in _CONFIG_ORDER if key in fresh or key in config}
    upgraded.update((key, value) for key, value in config.items() if key not in upgraded)
    return upgraded


def consolidate_weights(folder: str | os.PathLike[str]) -> dict[str, str]:
    """Rewrite sharded weights as one ``model.safetensors`` (same tensors, same bytes per tensor).

    What timm and the Hub's widgets read; shards stay only past the Hub's usual 5 GB. Returns the
    new ``{file: sha256}``; a folder already in one file is left as it is.
    """
    folder = Path(folder)
    if not (folder / INDEX_NAME).is_file():
        return {WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}
    shards = weight_files(folder)
    state = load_state_dict(folder)
    tmp = folder / f".{WEIGHTS_NAME}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o666 & ~current_umask())
    os.replace(tmp, folder / WEIGHTS_NAME)
    for name in shards:
        (folder / name).unlink()
    (folder / INDEX_NAME).unlink()
    return {WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a checkpoint folder's config.json."""
    path = member(Path(folder), CONFIG_NAME, str(folder))
    config = read_bounded_json(path, max_bytes=MAX_CONFIG_BYTES, what="checkpoint config", error=CheckpointError)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    for key, kind in (("architecture", str), ("model_args", dict), ("pretrained_cfg", dict)):
        if key not in config:
            raise CheckpointError(f"{path} lacks '{key}'")
        if not isinstance(config[key], kind):
            raise CheckpointError(f"{path}: '{key}' must be a {kind.__name__}")
    if ZOO_CFG_KEY in config and not isinstance(config[ZOO_CFG_KEY], dict):
        raise CheckpointError(f"{path}: '{ZOO_CFG_KEY}' must be a dict")
    if "format_version" in config:  # absent: a version-1 folder, from before the field
        version = config["format_version"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise CheckpointError(f"{path}: 'format_version' must be a whole number >= 1, got {one_line(repr(version), 40)}")
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{path} is format_version {version}, newer than this cl-zoo reads ({FORMAT_VERSION}): "
                                  "upgrade cl-zoo")
    files = config.get("files")
    if files is not None:
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise CheckpointError(f"{path}: 'files' must map weights file names to sha256 digests")
        for name in files:
            weights_name(Path(folder), name, f"{path} files")
    return config


def config_pretrained_cfg(config: Mapping[str, Any]) -> PretrainedCfg:
    """cl-zoo's PretrainedCfg from a config.json of either format version (see module docstring)."""
    return PretrainedCfg.from_dict(merged_pretrained_cfg(config))


def _verify_sha256(path: Path, name: str, sha256: Mapping[str, str] | None) -> None:
    if sha256 and name in sha256:
        actual = sha256_file(path)
        if actual != sha256[name]:
            raise CheckpointError(
                f"sha256 mismatch for {path}: expected {str(sha256[name])[:16]}..., got {actual[:16]}...; "
                "the file is corrupt or not the pinned revision"
            )


def read_headers(
    folder: str | os.PathLike[str], sha256: Mapping[str, str] | None = None
) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """``{weights file: {tensor: (dtype, shape)}}`` for a folder, checked before any tensor is read.

    File names are plain names inside the folder, pinned digests match, headers are well formed,
    and with shards every tensor lives in exactly the file the index names.
    """
    folder = Path(folder)
    index = shard_map(folder) if (folder / INDEX_NAME).is_file() else None
    headers: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    owner: dict[str, str] = {}
    for name in weight_files(folder):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is listed in the shard index but missing")
        _verify_sha256(path, name, sha256)
        header = read_safetensors_header(path)
        for key in header:
            if key in owner:
                raise CheckpointError(f"{folder}: tensor {key!r} is stored twice ({owner[key]} and {name})")
            owner[key] = name
            if index is not None and index.get(key) != name:
                raise CheckpointError(f"{folder / INDEX_NAME}: tensor {key!r} is in {name}, but the index says {index.get(key)!r}")
        headers[name] = header
    if index is not None and (listed := set(index) - set(owner)):
        raise CheckpointError(f"{folder / INDEX_NAME} lists {len(listed)} tensors no shard holds (first: {sorted(listed)[0]})")
    return headers


def load_state_dict(folder: str | os.PathLike[str], sha256: Mapping[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Read a folder's safetensors (single or sharded), verifying pinned checksums and headers."""
    folder = Path(folder)
    state: dict[str, torch.Tensor] = {}
    for name in read_headers(folder, sha256):
        path = folder / name
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
    not_finite: str = "{source}: {key} contains NaN or infinite values (in the model's dtype); the file is damaged"
    negative_variance: str = "{source}: {key} holds negative variances (BatchNorm would produce NaN); the file is damaged"
    dtype: str = "weights in {source} do not match the architecture: {key} is {dtype}, expected {expected}"


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
    Floating tensors are cast to the model's floating dtypes; any other dtype must match exactly
    (an integer tensor where the model holds floats is not a model's weights). Returns how many
    tensors needed a cast.
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
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(messages.shape.format(
                key=key, shape=tuple(tensor.shape), expected=tuple(expected[key].shape), **fmt))
        want = expected[key].dtype
        if (tensor.is_floating_point() != want.is_floating_point) or (not want.is_floating_point and tensor.dtype != want):
            raise CheckpointError(messages.dtype.format(
                key=key, dtype=str(tensor.dtype).replace("torch.", ""),
                expected="a floating-point tensor" if want.is_floating_point else str(want).replace("torch.", ""), **fmt))
        # Cast once; finiteness is checked on the cast value, in the dtype the model runs in (1e300
        # is a finite float64 and inf as float32).
        converted[key] = tensor.to(want) if tensor.is_floating_point() else tensor
        if check_finite and tensor.is_floating_point() and not torch.isfinite(converted[key]).all():
            raise CheckpointError(messages.not_finite.format(key=key, **fmt))
        # A negative running variance puts the square root of a negative number in every forward.
        if check_finite and key.endswith("running_var") and bool((tensor < 0).any()):
            raise CheckpointError(messages.negative_variance.format(key=key, **fmt))
    cast = sum(1 for k, v in state.items() if v.is_floating_point() and v.dtype != expected[k].dtype)
    model.load_state_dict(converted, strict=True)
    return cast


def _expected_state(arch: str, cfg: PretrainedCfg, model_args: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
    """The architecture's state dict built on the meta device: names, shapes, dtypes, no memory.

    Comparing the file's headers with it first means a config asking for a gigantic model, or
    weights that do not fit the architecture, are refused before anything is allocated.
    """
    try:
        entry = get_arch(arch)
    except ModelNotFoundError as exc:
        raise CheckpointError(f"{where}: architecture: {exc}") from None
    validate_model_args(arch, entry.builder, model_args, where)
    try:
        with torch.device("meta"):
            return build_arch(arch, cfg, **model_args).state_dict()
    except Exception as exc:  # noqa: BLE001 - whatever the builder says about the config's values
        raise build_error(arch, exc, where) from None


def _check_headers(
    headers: Mapping[str, Mapping[str, tuple[str, tuple[int, ...]]]], expected: Mapping[str, torch.Tensor], source: str
) -> None:
    found = {key: value for header in headers.values() for key, value in header.items()}
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    if missing or unexpected:
        parts = [f"{len(missing)} missing (first: {missing[0]})"] if missing else []
        parts += [f"{len(unexpected)} unexpected (first: {unexpected[0]})"] if unexpected else []
        raise CheckpointError(f"weights in {source} do not match the architecture: {'; '.join(parts)}")
    for key, tensor in expected.items():
        dtype, shape = found[key]
        if shape != tuple(tensor.shape):
            raise CheckpointError(
                f"weights in {source} do not match the architecture: {key} has shape {shape}, expected {tuple(tensor.shape)}")
        want = str(tensor.dtype).replace("torch.", "")
        if tensor.dtype.is_floating_point != (dtype in FLOAT_DTYPES) or (
            not tensor.dtype.is_floating_point and TORCH_DTYPE_NAMES[dtype] != want
        ):
            expected_kind = "a floating-point tensor" if tensor.dtype.is_floating_point else want
            raise CheckpointError(
                f"weights in {source} do not match the architecture: {key} is {TORCH_DTYPE_NAMES[dtype]}, expected {expected_kind}")


def load_folder(
    folder: str | os.PathLike[str], *, sha256: Mapping[str, str] | None = None, model_name: str | None = None
) -> nn.Module:
    """Build the model a checkpoint folder describes and load its weights (float32, eval mode).

    The folder is untrusted input (see :mod:`cl_zoo.checkpoint.checks`): file names, config
    values, headers, dtypes and values are all checked, each failure one ``CheckpointError`` line.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a checkpoint folder")
    config = read_config(folder)
    where = str(folder / CONFIG_NAME)
    try:
        cfg = config_pretrained_cfg(config)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: bad pretrained_cfg ({exc})") from exc
    validate_pretrained_cfg(cfg, where)
    # The registry's pins are authoritative; without them, the digests recorded at save time still
    # catch a truncated download or a corrupted copy.
    pins = dict(config.get("files") or {})
    pins.update(sha256 or {})
    arch = zoo_architecture(config)
    expected = _expected_state(arch, cfg, config["model_args"], where)
    _check_headers(read_headers(folder, pins or None), expected, str(folder))
    model = build_arch(arch, cfg, **config["model_args"])
    load_state_into(model, load_state_dict(folder, pins or None), str(folder), check_finite=True)
    name = config.get("model_name")
    model.model_name = model_name or (name if isinstance(name, str) and name else None) or arch
    model.checkpoint_config = config
    model.checkpoint_source = str(folder)
    return model.eval()


def rerender_card(folder: str | os.PathLike[str]) -> Path:
    """Re-write a checkpoint folder's README.md from its config.json, keeping its hand-added sections.

    What a user runs after editing a card by hand (``cl-zoo card-update FOLDER``): ``cl-zoo
    publish`` accepts only the "How to load" section cl-zoo generates, and this restores it.
    """
    folder = Path(folder)
    config = read_config(folder)
    card = folder / CARD_NAME
    kept = card_module.extra_sections(card.read_text(encoding="utf-8", errors="replace")) if card.is_file() else {}
    atomic_write_text(card, card_module.render_card(config, sections=kept, folder=folder), mkdir=False)
    return card
