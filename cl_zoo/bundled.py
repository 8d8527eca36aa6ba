"""Files that ship inside cl-zoo besides its code: recipes, the detectron2 launcher, model cards.

The repository keeps them in readable top-level folders (``recipes/``, ``transfer/detectron2/``,
``model_cards/``). pyproject.toml maps each folder in as a package, ``cl_zoo._bundled.<kind>``, so
a wheel carries that one copy and an installed cl-zoo finds it through the import system
(``importlib``), wherever pip put it. Nothing is copied into ``cl_zoo/``: there is no second copy
to drift from the first.

An editable install or a checkout on ``PYTHONPATH`` has no ``cl_zoo._bundled`` package (setuptools'
editable finder cannot import a package mapped under a folder that does not exist), but there the
code *is* the source tree, so the same folders are read in place beside ``cl_zoo/``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

Bundle = Literal["recipes", "detectron2", "model_cards"]

# Where each bundle lives in the repository (mirrors [tool.setuptools.package-dir]).
SOURCE_FOLDERS: dict[str, str] = {
    "recipes": "recipes",
    "detectron2": "transfer/detectron2",
    "model_cards": "model_cards",
}
_SOURCE_ROOT = Path(__file__).resolve().parent.parent


def installed_folder(kind: Bundle) -> Path | None:
    """The bundle inside an installed wheel (``cl_zoo/_bundled/<kind>``), or None when not installed so."""
    package = f"{__package__}._bundled.{kind}"
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # no cl_zoo._bundled at all: an editable install or a plain checkout
        return None
    # The bundles are data folders without __init__.py, i.e. namespace packages: their location is
    # the spec's search path (importlib.resources.files would wrap it in a MultiplexedPath).
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if Path(location).is_dir():
            return Path(location)
    return None


def bundled_folder(kind: Bundle) -> Path:
    """The folder holding a bundle, installed or in the source tree.

    Never raises: callers that need a file from it say which one is missing, with context.
    """
    if kind not in SOURCE_FOLDERS:
        raise ValueError(f"unknown bundle {kind!r}")  # a bug in the caller, not a user mistake
    return installed_folder(kind) or _SOURCE_ROOT / SOURCE_FOLDERS[kind]
