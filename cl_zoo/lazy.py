"""PEP 562 lazy attributes: a module names what it re-exports, and each is imported on first use.

Why: ``import cl_zoo`` (and so every ``cl-zoo`` command, ``--help`` included) must not pay for
torch, so a package's public names (``cl_zoo.create_model``, ``cl_zoo.checkpoint.load_folder``)
are served from the modules below it on first use. Targets are ``"module:attribute"`` strings
resolved with :func:`importlib.import_module`. Retired paths use :mod:`cl_zoo.deprecations`, which
warns.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(namespace: dict[str, Any], names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module whose ``globals()`` is ``namespace``, serving
    ``names`` (``{attr: "pkg.mod:attr"}``) on first access.

    A resolved value is stored in the module's globals, so later look-ups are plain attribute reads
    (and ``monkeypatch.setattr`` on the module behaves as for any attribute).
    """
    module = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, attr = target.partition(":")
        value = getattr(importlib.import_module(where), attr)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
