"""Where weights come from: bundled folders, the Hugging Face Hub (and its cache), local paths.

All Hub traffic goes through ``huggingface_hub`` (``snapshot_download``), so ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``, ``HF_HOME``/``HF_HUB_CACHE`` and tokens behave exactly as users expect from the
rest of the ecosystem. Resolution order for a registered name (:func:`cl_zoo.factory.load_registered` follows it):

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

from cl_zoo.bundled import bundled_folder
from cl_zoo.checkpoint.layout import CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME
from cl_zoo.errors import HubError, is_transport_error  # noqa: F401 - is_transport_error: also its old import path
from cl_zoo.fileio import file_lock
from cl_zoo.text import is_repo_id
from cl_zoo.deprecations import retired_exports
from cl_zoo.registry import ZOO_NAMESPACE

if TYPE_CHECKING:
    from cl_zoo.registry import PretrainedCfg

HUB_PREFIX = "hf-hub:"
# The zoo's own checkpoints live in ``<namespace>/NAME`` (ZOO_NAMESPACE, defined in the registry
# beside the table that names them); CL_ZOO_HUB_NAMESPACE=X reads them from a fork's or mirror's X.
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
    if not is_repo_id(repo_id):
        raise HubError(f"bad Hub id {source!r}: expected hf-hub:owner/name[@revision]")
    return repo_id, revision or None


def _env_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_settings() -> dict[str, object]:
    """Endpoint, offline flag and cache folder as the environment says *now*.

    ``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_HOME``/``HF_HUB_CACHE``
    once, at import. A notebook or test that sets them afterwards would be silently ignored, so
    they are re-read on every call and passed explicitly (``None`` keeps the library's default).
    """
    from huggingface_hub import constants  # huggingface_hub: a heavy import, made only when the Hub is used

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
    from huggingface_hub import constants  # huggingface_hub: a heavy import, made only when the Hub is used

    root = Path(cache_dir or constants.HF_HUB_CACHE)
    return root / ".locks" / "cl-zoo" / f"models--{repo_id.replace('/', '--')}.lock"


def download_folder(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """Fetch (or find in the cache) a checkpoint repo; returns the local snapshot folder."""
    from huggingface_hub import snapshot_download  # heavy import, made only when the Hub is used
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
        from huggingface_hub import constants  # huggingface_hub: a heavy import, made only when the Hub is used

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


def registered_repo_id(cfg: "PretrainedCfg") -> str | None:
    """The Hub repo a registered entry is read from now: the zoo's own follow CL_ZOO_HUB_NAMESPACE."""
    if cfg.hf_hub_id and cfg.bundled and cfg.hf_hub_id == f"{ZOO_NAMESPACE}/{cfg.bundled}":
        return zoo_repo_id(cfg.bundled)
    return cfg.hf_hub_id


# Loading a model from a source is the factory's (above this module); the old import paths
# (``from cl_zoo.checkpoint.hub import load_pretrained``) still work, with a DeprecationWarning.
__getattr__, __dir__ = retired_exports(globals())
