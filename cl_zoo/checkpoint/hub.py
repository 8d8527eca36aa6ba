"""Where weights come from: bundled folders, the Hugging Face Hub (and its cache), local paths.

All Hub traffic goes through ``huggingface_hub`` (``snapshot_download``), so ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``, ``HF_HOME``/``HF_HUB_CACHE`` and tokens behave exactly as users expect from the
rest of the ecosystem. Resolution order for a registered name:

1. the folder under ``model_cards/`` (``CL_ZOO_MODEL_CARDS``, the installed package -- a wheel has
   only the default -- or the checkout), same bytes as the Hub repo, verified by sha256 so a stale
   copy is not used silently: offline and instant;
2. the Hub repo (the zoo's own: ``<namespace>/<name>``, :func:`zoo_repo_id`), downloaded once into
   the HF cache and verified against the registry's sha256 pins;
3. a published third-party release, from its own ordered sources (converted on first use, see
   :mod:`cl_zoo.convert.sources`).

When every source fails the error names each one tried and why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from cl_zoo.bundled import bundled_folder
from cl_zoo.checkpoint.folder import (
    CONFIG_NAME,
    INDEX_NAME,
    WEIGHTS_NAME,
    load_folder,
    load_state_into,
)
from cl_zoo.errors import CheckpointError, ClZooError, HubError
from cl_zoo.registry import DEFAULT_MODEL
from cl_zoo.fileio import file_lock

if TYPE_CHECKING:
    from cl_zoo.registry import PretrainedCfg, PretrainedEntry

HUB_PREFIX = "hf-hub:"
# The Hub namespace (user or organisation) of the zoo's own checkpoints: every registered zoo model
# ``NAME`` lives in the repo ``<namespace>/NAME``, pinned by the sha256 of its weight files (never by
# a revision, which would have to exist before the registry could name it). A fork or a company
# mirror publishes the zoo elsewhere with ``cl-zoo publish --all --namespace X`` and points cl-zoo at
# it with CL_ZOO_HUB_NAMESPACE=X.
ZOO_NAMESPACE = "cl-zoo"
ZOO_NAMESPACE_ENV = "CL_ZOO_HUB_NAMESPACE"


def is_namespace(text: str) -> bool:
    """Whether ``text`` can be a Hub user or organisation name (letters, digits, ``-``, ``_``, ``.``)."""
    return bool(text) and "/" not in text and text.replace("-", "").replace("_", "").replace(".", "").isalnum()


def zoo_namespace() -> str:
    """The namespace the zoo's own Hub repos are read from and published to, as the environment says now."""
    namespace = os.environ.get(ZOO_NAMESPACE_ENV, "").strip() or ZOO_NAMESPACE
    if not is_namespace(namespace):
        raise HubError(f"{ZOO_NAMESPACE_ENV}={namespace!r} is not a Hub user or organisation name")
    return namespace


def zoo_repo_id(name: str) -> str:
    """``<namespace>/<name>``: the Hub repo of the zoo checkpoint registered (and bundled) as ``name``."""
    return f"{zoo_namespace()}/{name}"


def model_card_dirs() -> list[Path]:
    """Folders that may hold bundled checkpoints, most specific first."""
    dirs = []
    if env := os.environ.get("CL_ZOO_MODEL_CARDS"):
        dirs.append(Path(env))
    dirs.append(bundled_folder("model_cards"))  # inside the installed package, or the checkout's
    return dirs


def find_bundled(name: str) -> Path | None:
    for base in model_card_dirs():
        folder = base / name
        if (folder / CONFIG_NAME).is_file():
            return folder
    return None


def parse_hub_id(source: str) -> tuple[str, str | None]:
    """``hf-hub:owner/name@rev`` -> (``owner/name``, ``rev``)."""
    spec = source[len(HUB_PREFIX):] if source.startswith(HUB_PREFIX) else source
    repo_id, _, revision = spec.partition("@")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise HubError(f"bad Hub id {source!r}: expected hf-hub:owner/name[@revision]")
    return repo_id, revision or None


# The HTTP stacks huggingface_hub has shipped on: requests/urllib3 (0.x), httpx/httpcore (1.x), httpx2.
_TRANSPORT_MODULES = frozenset({"httpx", "httpx2", "httpcore", "requests", "urllib3"})


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the Hub client's HTTP stack failing to connect, time out or speak HTTP.

    huggingface_hub lets those through untyped (``httpx2.ConnectError`` ...), and which stack it uses
    changes between its versions, so the check goes by the exception's module rather than by a class
    that may not exist in the installed version. Every Hub call of cl-zoo (download, publish,
    release sources) turns them into one "cannot be reached" line with this.
    """
    return type(exc).__module__.split(".")[0] in _TRANSPORT_MODULES


def _env_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_settings() -> dict[str, object]:
    """Endpoint, offline flag and cache folder as the environment says *now*.

    ``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_HOME``/``HF_HUB_CACHE``
    once, at import. A notebook or test that sets them afterwards would be silently ignored, so
    they are re-read on every call and passed explicitly (``None`` keeps the library's default).
    """
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT")
    offline_env = os.environ.get("HF_HUB_OFFLINE")
    offline = _env_true(offline_env) if offline_env is not None else bool(constants.HF_HUB_OFFLINE)
    cache_dir = os.environ.get("HF_HUB_CACHE")
    if cache_dir is None and os.environ.get("HF_HOME"):
        cache_dir = os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return {
        "endpoint": endpoint.rstrip("/") if endpoint else None,
        "local_files_only": offline,
        "cache_dir": os.path.expanduser(cache_dir) if cache_dir else None,
    }


def _download_lock(repo_id: str, cache_dir: str | None) -> Path:
    """The lock serialising cl-zoo processes that fetch one repo: beside its cache entry, under the
    cache's ``.locks/`` (which ``huggingface_hub``'s cache scan skips)."""
    from huggingface_hub import constants

    root = Path(cache_dir or constants.HF_HUB_CACHE)
    return root / ".locks" / "cl-zoo" / f"models--{repo_id.replace('/', '--')}.lock"


def download_folder(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """Fetch (or find in the cache) a checkpoint repo; returns the local snapshot folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    settings = hub_settings()
    try:
        with file_lock(_download_lock(repo_id, cache_dir or settings["cache_dir"])):
            path = snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache_dir or settings["cache_dir"],
                endpoint=settings["endpoint"],
                local_files_only=settings["local_files_only"],
                allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, INDEX_NAME, "model-*.safetensors", "README.md"],
            )
    except RepositoryNotFoundError as exc:
        raise HubError(f"Hub repo {repo_id} not found (or private without a token)") from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"Hub repo {repo_id} has no revision {revision!r}") from exc
    except LocalEntryNotFoundError as exc:
        from huggingface_hub import constants

        where = "HF_HUB_OFFLINE=1 forbids network access" if settings["local_files_only"] else (
            f"{settings['endpoint'] or constants.ENDPOINT} cannot be reached"
        )
        raise HubError(f"Hub repo {repo_id}{'@' + revision if revision else ''} is not cached and {where}; "
                       "download it once with network access (it stays in the Hugging Face cache), "
                       "or point HF_HUB_CACHE at a cache that holds it") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise HubError(f"could not download {repo_id}: {' '.join(str(exc).split())[:200]}") from exc
    except Exception as exc:  # noqa: BLE001 - transport errors of the client's HTTP stack (httpx2)
        if not is_transport_error(exc):
            raise
        raise HubError(f"could not download {repo_id}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from exc
    return Path(path)


def load_hub(source: str, sha256: dict[str, str] | None = None, cache_dir: str | None = None) -> nn.Module:
    repo_id, revision = parse_hub_id(source)
    folder = download_folder(repo_id, revision, cache_dir=cache_dir)
    model = load_folder(folder, sha256=sha256)
    model.checkpoint_source = f"{HUB_PREFIX}{repo_id}@{revision or 'main'}"
    return model


def registered_repo_id(cfg: "PretrainedCfg") -> str | None:
    """The Hub repo a registered entry is read from now: the zoo's own follow CL_ZOO_HUB_NAMESPACE."""
    if cfg.hf_hub_id and cfg.bundled and cfg.hf_hub_id == f"{ZOO_NAMESPACE}/{cfg.bundled}":
        return zoo_repo_id(cfg.bundled)
    return cfg.hf_hub_id


def load_registered(entry: "PretrainedEntry", **kwargs: object) -> nn.Module:
    """Load a registered pretrained model from the first source that works."""
    cfg = entry.cfg
    tried: list[str] = []
    errors: list[ClZooError] = []
    if cfg.bundled and (folder := find_bundled(cfg.bundled)) is not None:
        try:
            model = load_folder(folder, sha256=cfg.sha256, model_name=entry.name)
            model.checkpoint_source = str(folder)
            return model
        except CheckpointError as exc:
            errors.append(exc)
            tried.append(f"bundled {folder} ({exc})")
    elif cfg.bundled:
        tried.append(f"model_cards/{cfg.bundled} is not bundled with this install (a wheel ships only {DEFAULT_MODEL})")
    if (repo_id := registered_repo_id(cfg)) is not None:
        try:
            model = load_hub(HUB_PREFIX + repo_id + (f"@{cfg.revision}" if cfg.revision else ""), cfg.sha256 or None)
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
            from cl_zoo.convert.sources import load_release

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
    from cl_zoo.registry import check_pretrained_kwargs, create_model, is_pretrained_name

    text = os.fspath(source)
    path = Path(text)
    if text.startswith(HUB_PREFIX) or not path.is_file():
        # Only a bare weights file takes arch/model arguments; elsewhere config.json fixes them.
        check_pretrained_kwargs(f"load_pretrained({text!r})", kwargs)
    if text.startswith(HUB_PREFIX):
        return load_hub(text)
    if path.is_dir():
        return load_folder(path)
    if path.is_file():
        return _load_file(path, **kwargs)
    if is_pretrained_name(text):
        return create_model(text, pretrained=True)
    from cl_zoo.registry import get_pretrained, suggest_models

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
    from cl_zoo.registry import create_model

    if path.name == CONFIG_NAME or (path.suffix == ".safetensors" and (path.parent / CONFIG_NAME).is_file()):
        from cl_zoo.registry import check_pretrained_kwargs

        check_pretrained_kwargs(f"load_pretrained({str(path)!r})", {**({"arch": arch} if arch else {}), **model_args})
        return load_folder(path.parent)
    if arch is None:
        raise CheckpointError(
            f"{path} is a bare weights file; load the folder that holds it with its config.json, "
            "or pass arch=<architecture>"
        )
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

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
    from cl_zoo.registry import create_model, is_architecture

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
