"""Retired import paths: each old module or name mapped to its replacement and the release that removes it.

Modules moved as the package took its shape (``cl_zoo.search`` into ``cl_zoo.index``, the loaders into
the factory above the registry, ...). Their old paths keep working for users' scripts, but a shim
that never warns is never removed, so every old path is listed here (timm's
``register_model_deprecations`` is the model) and serves its name through
:func:`retired_exports`, which warns once per name with a ``DeprecationWarning`` pointing at the
caller's line and naming the new path and the release that drops the old one.

Nothing inside cl_zoo imports a retired path (``tests/test_deprecations.py`` checks the source).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

# The release that deletes every path below; the package is 0.1.x.
REMOVED_IN = "0.3.0"

# Whole modules that moved: every public attribute of the new module is served from the old path.
RETIRED_MODULES: dict[str, str] = {
    "cl_zoo.search": "cl_zoo.index.search",
    "cl_zoo.dedup_calibration": "cl_zoo.index.dedup_calibration",
    "cl_zoo.data.transforms": "cl_zoo.embedding.transforms",
    "cl_zoo.convert.export": "cl_zoo.export",
    "cl_zoo.train.dist": "cl_zoo.distributed",
}

_EXPORT_NAMES = ("EXPORTERS", "ExportSummary", "ResNetWeights", "detectron2_name", "export_detectron2", "export_timm",
                 "export_torchvision", "resnet_weights")
_LOADERS = ("load_hub", "load_registered", "load_pretrained", "load_model", "_load_file")

# Names a lower module re-exported from a higher one (an arrow pointing up that the import graph
# cannot see): old module -> {name: the module that owns it}.
RETIRED_NAMES: dict[str, dict[str, str]] = {
    "cl_zoo.registry": {"create_model": "cl_zoo.factory", "check_pretrained_kwargs": "cl_zoo.factory"},
    "cl_zoo.checkpoint.hub": {name: "cl_zoo.factory" for name in _LOADERS},
    "cl_zoo.checkpoint.card": {"rerender_card": "cl_zoo.checkpoint.folder"},
    "cl_zoo.data.named": {"open_named_dataset": "cl_zoo.data.folder"},
    "cl_zoo.convert": {name: "cl_zoo.export" for name in _EXPORT_NAMES},
}

WARNING_TEXT = "{old} is deprecated and will be removed in cl-zoo {removed_in}; use {new}"


def replacement(module: str, name: str) -> str | None:
    """The module that now owns ``module.name``, or ``None`` when that path is not retired."""
    if module in RETIRED_MODULES:
        return RETIRED_MODULES[module] if name == "__all__" or not name.startswith("__") else None
    return RETIRED_NAMES.get(module, {}).get(name)


def retired_exports(namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module whose ``globals()`` is ``namespace``: each retired
    name it once served is imported from its new home on first use, with one ``DeprecationWarning``.

    ``stacklevel=2`` is the frame that read the attribute: for ``from old import name`` and
    ``old.name`` alike, the user's own line. The value is then stored in the module, so later reads
    are plain attribute look-ups (and warn no more).
    """
    module = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        new = replacement(module, name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name, _MISSING)
        if value is _MISSING:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(WARNING_TEXT.format(old=f"{module}.{name}", removed_in=REMOVED_IN, new=f"{new}.{name}"),
                      DeprecationWarning, stacklevel=2)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        names = set(namespace) | set(RETIRED_NAMES.get(module, {}))
        if module in RETIRED_MODULES:
            names |= {n for n in dir(importlib.import_module(RETIRED_MODULES[module])) if not n.startswith("_")}
        return sorted(names)

    return __getattr__, __dir__


_MISSING = object()
