"""From a name, folder, file or Hub id to a model: the layer above the registry and the checkpoint code.

timm layers it the same way (``_pretrained`` <- ``_registry`` <- ``_builder``/``_hub`` <-
``_factory``): :mod:`cl_zoo.registry` holds the tables and look-ups, :mod:`cl_zoo.checkpoint`
reads and finds folders, and this module, the only one that needs all of them, turns a user's
request into a model. Nothing below imports it, so no import circle runs through the registry.
The retired paths (``cl_zoo.registry.create_model``, ``cl_zoo.checkpoint.hub.load_pretrained``...)
still serve these, with a ``DeprecationWarning`` (:mod:`cl_zoo.deprecations`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file

import cl_zoo.checkpoint.hub as hub
from cl_zoo.checkpoint.checks import accepted_args
from cl_zoo.checkpoint.folder import CONFIG_NAME, load_folder, load_state_into
from cl_zoo.convert.sources import load_release
from cl_zoo.errors import CheckpointError, ClZooError, HubError, ModelArgumentError, ModelNotFoundError
from cl_zoo.registry import (
    DEFAULT_MODEL,
    PretrainedCfg,
    PretrainedEntry,
    build_arch,
    find_pretrained,
    get_arch,
    get_pretrained,
    is_architecture,
    is_pretrained_name,
    pretrained_of,
    suggest_models,
)

__all__ = ["create_model", "check_pretrained_kwargs", "load_registered", "load_hub", "load_pretrained", "load_model"]

# timm's way of asking for no classifier (``create_model(name, num_classes=0)``): what every zoo
# model already is, so the value is accepted and changes nothing.
_HEADLESS = (0, None)


def check_pretrained_kwargs(what: str, kwargs: dict[str, Any], hint: str = "") -> None:
    """Refuse model arguments for a load whose weights already fix the architecture.

    Only ``num_classes=0``/``None`` (timm's "no classifier", which zoo models are) passes; anything
    else would have to change the network the weights were saved from, and silently ignoring it
    would hand back a model that is not what was asked for.
    """
    for key, value in kwargs.items():
        if key == "num_classes":
            if value not in _HEADLESS:
                raise _classifier_refused(what, value)
            continue
        raise ModelArgumentError(f"{what} cannot take {key}={value!r}: the checkpoint fixes the architecture; leave it out{hint}")


def _classifier_refused(what: str, value: Any) -> ModelArgumentError:
    return ModelArgumentError(
        f"{what} cannot take num_classes={value!r}: zoo models are headless feature extractors (forward gives "
        f"[B, model.num_features]); put torch.nn.Linear(model.num_features, {value!r}) on top, or pass num_classes=0"
    )


def _architecture_kwargs(name: str, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for ``arch``'s builder, every one checked against what the builder accepts."""
    accepted = accepted_args(get_arch(arch).builder)
    out = {}
    for key, value in kwargs.items():
        if key == "num_classes" and key not in accepted:
            if value not in _HEADLESS:
                raise _classifier_refused(f"create_model({name!r})", value)
            continue
        if key not in accepted:
            known = ", ".join(sorted(accepted)) or "no arguments"
            raise ModelArgumentError(f"create_model({name!r}) does not take {key}={value!r}; {arch} accepts {known}")
        out[key] = value
    return out


def _build(name: str, arch: str, cfg: PretrainedCfg | None, base: dict[str, Any], kwargs: dict[str, Any]) -> nn.Module:
    """``build_arch`` with the caller's arguments; a builder refusing their values is one line, not a traceback."""
    args = _architecture_kwargs(name, arch, kwargs)
    try:
        model = build_arch(arch, cfg, **{**base, **args})
    except (TypeError, ValueError) as exc:
        if not args:
            raise  # no user argument involved: a bug, keep the traceback
        given = ", ".join(f"{k}={v!r}" for k, v in args.items())
        text = " ".join(str(exc).split())[:200]
        raise ModelArgumentError(f"create_model({name!r}, {given}) cannot build {arch}: {text}") from None
    model.model_name = name
    return model


def create_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build a model by architecture or pretrained name.

    ``create_model("resnet50")`` gives random weights; ``create_model("dcl_resnet18_cifar.cifar10",
    pretrained=True)`` downloads (or finds bundled/cached) weights and verifies their checksum.
    ``pretrained=False`` on a pretrained name builds its architecture with its preprocessing config
    but random weights.

    ``kwargs`` go to the architecture's builder (``width=0.5``, ``in_chans=1``...); one it does not
    accept raises :class:`~cl_zoo.errors.ModelArgumentError` naming it, never goes unread. With
    ``pretrained=True`` the weights fix the architecture, so only ``num_classes=0`` (timm's "no
    classifier", which every zoo model is) is accepted. ``num_classes`` > 0 is refused: zoo models
    have no classifier head to replace.
    """
    entry = find_pretrained(name)
    if entry is not None:
        if pretrained:
            return load_registered(entry, **kwargs)
        return _build(name, entry.arch, entry.cfg, entry.model_kwargs, kwargs)
    if is_architecture(name):
        if pretrained:
            tags = pretrained_of(name)
            hint = f" (pretrained: {', '.join(sorted(tags))})" if tags else ""
            raise ModelNotFoundError(
                f"{name!r} is an architecture; pick pretrained weights by their full name{hint}"
            )
        return _build(name, name, None, {}, kwargs)
    get_arch(name)  # raises "unknown model ...; did you mean ..."
    raise AssertionError("unreachable")


def load_hub(source: str, sha256: dict[str, str] | None = None, cache_dir: str | None = None) -> nn.Module:
    """A checkpoint repo on the Hub (``hf-hub:owner/name[@rev]``), downloaded once into the HF cache."""
    repo_id, revision = hub.parse_hub_id(source)
    folder = hub.download_folder(repo_id, revision, cache_dir=cache_dir)
    model = load_folder(folder, sha256=sha256)
    model.checkpoint_source = f"{hub.HUB_PREFIX}{repo_id}@{revision or 'main'}"
    return model


def load_registered(entry: PretrainedEntry, **kwargs: Any) -> nn.Module:
    """Load a registered pretrained model from the first source that works (bundled folder, the
    Hub, the publisher's release).

    ``kwargs`` are model arguments, which the weights fix: only timm's ``num_classes=0`` passes;
    any other is refused in one line rather than dropped unread.

    Hub look-ups go through the :mod:`~cl_zoo.checkpoint.hub` module's attributes (``hub.find_bundled``),
    so a test that replaces one there is honoured.
    """
    check_pretrained_kwargs(f"create_model({entry.name!r}, pretrained=True)", kwargs, ", or build random weights with pretrained=False")
    cfg = entry.cfg
    tried: list[str] = []
    errors: list[ClZooError] = []
    if cfg.bundled and (folder := hub.find_bundled(cfg.bundled)) is not None:
        try:
            model = load_folder(folder, sha256=cfg.sha256, model_name=entry.name)
            model.checkpoint_source = str(folder)
            return model
        except CheckpointError as exc:
            errors.append(exc)
            tried.append(f"bundled {folder} ({exc})")
    elif cfg.bundled:
        tried.append(f"model_cards/{cfg.bundled} is not bundled with this install (a wheel ships only {DEFAULT_MODEL})")
    if (repo_id := hub.registered_repo_id(cfg)) is not None:
        try:
            model = load_hub(hub.HUB_PREFIX + repo_id + (f"@{cfg.revision}" if cfg.revision else ""), cfg.sha256 or None)
            model.model_name = entry.name
            return model
        except ClZooError as exc:
            errors.append(exc)
            tried.append(f"hf-hub:{repo_id} ({exc})")
            if cfg.bundled and isinstance(exc, HubError):
                tried.append(
                    "a cl-zoo checkout's model_cards/ serves it without the network: "
                    "set CL_ZOO_MODEL_CARDS=/path/to/cl-zoo/model_cards"
                )
    if cfg.url:
        try:
            return load_release(entry)
        except ClZooError as exc:
            errors.append(exc)
            tried.append(str(exc))  # already names every source of the release
    message = f"cannot load {entry.name}: " + "; ".join(tried or ["no source is configured"])
    # A source that answered with bad bytes (checksum, shapes) is an integrity problem, not an
    # availability one: keep its type so callers can tell "corrupt" from "unreachable".
    raise (CheckpointError if any(isinstance(e, CheckpointError) for e in errors) else HubError)(message)


def load_pretrained(source: str | os.PathLike[str], **kwargs: object) -> nn.Module:
    """Load a checkpoint from a folder, a safetensors/.pth file, ``hf-hub:owner/name[@rev]``, or a
    registered pretrained name."""
    text = os.fspath(source)
    path = Path(text)
    if text.startswith(hub.HUB_PREFIX) or not path.is_file():
        # Only a bare weights file takes arch/model arguments; elsewhere config.json fixes them.
        check_pretrained_kwargs(f"load_pretrained({text!r})", kwargs)
    if text.startswith(hub.HUB_PREFIX):
        return load_hub(text)
    if path.is_dir():
        return load_folder(path)
    if path.is_file():
        return _load_file(path, **kwargs)
    if is_pretrained_name(text):
        return create_model(text, pretrained=True)
    if path.suffix or os.sep in text:
        # A dotted name is a path or a pretrained name (arch.tag): a typo of the latter gets its suggestions.
        close = [] if os.sep in text or (os.altsep and os.altsep in text) else suggest_models(text)
        if close:
            raise CheckpointError(f"{text} is neither a registered model nor an existing path; did you mean {', '.join(close)}?")
        raise CheckpointError(f"{text} does not exist")

    get_pretrained(text)  # raises the "unknown model ... did you mean" error
    raise AssertionError("unreachable")


def _load_file(path: Path, arch: str | None = None, **model_args: object) -> nn.Module:
    """A lone weights file: beside its config.json, or with an explicit architecture."""
    if path.name == CONFIG_NAME or (path.suffix == ".safetensors" and (path.parent / CONFIG_NAME).is_file()):
        check_pretrained_kwargs(f"load_pretrained({str(path)!r})", {**({"arch": arch} if arch else {}), **model_args})
        return load_folder(path.parent)
    if arch is None:
        raise CheckpointError(
            f"{path} is a bare weights file; load the folder that holds it with its config.json, "
            "or pass arch=<architecture>"
        )
    if path.suffix == ".safetensors":
        try:
            state = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file ({' '.join(str(exc).split())[:200]})") from exc
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling refusal is a user-facing error
            raise CheckpointError(f"{path} cannot be loaded safely (weights_only=True): {str(exc).splitlines()[0]}") from exc
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a mapping of tensor names to tensors")
    model = create_model(arch, **model_args)
    load_state_into(model, state, str(path), check_finite=True)
    return model.eval()


def load_model(spec: str | os.PathLike[str] | nn.Module) -> nn.Module:
    """Turn a user's ``--model`` value into a model in eval mode.

    Accepts a registered pretrained name, a checkpoint folder or file, ``hf-hub:...``, or an
    architecture without parameters (``pixels``). Architectures with parameters are refused: random
    features are almost never what a user meant.
    """
    if isinstance(spec, nn.Module):
        return spec.eval()
    text = os.fspath(spec)
    if is_architecture(text):
        model = create_model(text)
        if any(True for _ in model.parameters()):
            raise ClZooError(
                f"{text!r} is an architecture with random weights; pass a pretrained name "
                "(`cl-zoo models --pretrained`), a checkpoint folder or hf-hub:owner/name"
            )
        return model.eval()
    return load_pretrained(text)
