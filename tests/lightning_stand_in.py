"""PyTorch Lightning's names without Lightning: what a lightly ``.ckpt`` pickles, for tests to write one.

Lightning is not a dependency; its checkpoints pickle ``lightning.fabric.utilities.data.AttributeDict``
by that name, so a test that writes such a file makes the name importable while ``torch.save`` runs.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Iterator


class AttributeDict(dict):
    """Lightning's hyper-parameter container, pickled under its real name (see :func:`lightning_names`)."""

    def __getattr__(self, key: str) -> Any:
        return self[key]


AttributeDict.__module__ = "lightning.fabric.utilities.data"


@contextlib.contextmanager
def lightning_names() -> Iterator[None]:
    """Make ``lightning.fabric.utilities.data.AttributeDict`` importable while torch.save pickles it."""
    names = ["lightning", "lightning.fabric", "lightning.fabric.utilities", "lightning.fabric.utilities.data"]
    saved = {n: sys.modules.get(n) for n in names}
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    sys.modules[names[-1]].AttributeDict = AttributeDict  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
