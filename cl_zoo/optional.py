"""Optional dependencies: the one place that knows which extra installs which package.

A plain ``pip install cl-zoo`` carries only what embedding a local folder of images needs; faiss,
pyarrow, matplotlib, tensorboard, fsspec, webdataset, pycocotools, OpenVINO, NNCF and timm come
with extras (``pyproject.toml``) and are imported lazily, where a feature first needs them. A
missing one must end a command in one line that says which extra to install, not in an
ImportError traceback, and the line must name an extra that exists:
``tests/test_optional_dependencies.py`` checks every extra named here against ``pyproject.toml``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from cl_zoo.errors import ClZooError

# Top-level module -> the cl-zoo extra that installs it (the smallest one; ``all`` has them all).
EXTRAS: dict[str, str] = {
    "faiss": "index",
    "pyarrow": "parquet",
    "matplotlib": "plots",
    "tensorboard": "train",
    "fsspec": "remote",
    "aiohttp": "remote",
    "webdataset": "remote",
    "braceexpand": "remote",
    "pycocotools": "detection",
    "openvino": "openvino",
    "nncf": "int8",
    "timm": "timm",
}


class MissingExtraError(ClZooError):
    """A feature's optional package is not installed; the message names the extra to install."""


def install_hint(extra: str) -> str:
    """The pip command for ``extra``, quoted so that shells do not expand the brackets."""
    return f"pip install 'cl-zoo[{extra}]'"


def _top(module: str) -> str:
    return module.partition(".")[0]


def missing_message(modules: str | list[str], feature: str, extra: str | None = None) -> str:
    """``FEATURE needs PACKAGE, which is not installed: pip install 'cl-zoo[EXTRA]'``.

    ``extra`` overrides the table where a feature's own extra is the better advice (``int8`` for
    OpenVINO under ``--precision int8``, ``remote`` for pyarrow under tar shards).
    """
    names = [_top(m) for m in ([modules] if isinstance(modules, str) else modules)]
    chosen = extra or EXTRAS[names[0]]
    verb = "is" if len(names) == 1 else "are"
    return f"{feature} needs {' and '.join(names)}, which {verb} not installed: {install_hint(chosen)}"


def is_installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (graceful fallbacks ask this).

    A ``None`` in ``sys.modules`` (how tests hide a package) counts as not installed, as does a
    submodule whose parent package is missing.
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, feature: str, extra: str | None = None) -> ModuleType:
    """``module`` imported, or :class:`MissingExtraError` whose one line names the extra to install.

    ``feature`` is what the user asked for, in their words (``cl-zoo knn``, ``--out F.parquet``),
    so the line says why the package is needed as well as how to get it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc.name is None or module == exc.name or module.startswith(f"{exc.name}.")
        if isinstance(exc, ModuleNotFoundError) and missing:
            raise MissingExtraError(missing_message(module, feature, extra)) from None
        # Installed but broken (a missing shared library, an ABI mismatch): not the same advice.
        reason = " ".join(str(exc).split())[:160]
        raise MissingExtraError(f"{feature} needs {_top(module)}, which is installed but does not import ({reason}); "
                                f"reinstall it: {install_hint(extra or EXTRAS[_top(module)])}") from None


def require_url_reader(ref: str) -> ModuleType:
    """fsspec for ``ref``'s scheme, with aiohttp for http(s) (fsspec's HTTP backend, ``fsspec[http]``).

    fsspec itself comes with torch and huggingface_hub, so without the ``remote`` extra an https
    URL would otherwise fail inside fsspec, per file, with a message that names no extra.
    """
    scheme = ref.partition(":")[0].lower()
    fsspec = require("fsspec", f"reading {scheme}:// URLs")
    if scheme in ("http", "https"):
        require("aiohttp", f"reading {scheme}:// URLs")
    return fsspec


__all__ = ["EXTRAS", "MissingExtraError", "install_hint", "is_installed", "missing_message", "require", "require_url_reader"]
