"""Pretraining: recipes, the trainer, DDP launch, checkpoint/resume and logging.

Heavy modules (the trainer, torch.distributed) are imported lazily so ``from cl_zoo.train import
Recipe`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from cl_zoo.train.recipe import Recipe, resolve_recipe_path

__all__ = ["Recipe", "resolve_recipe_path", "Trainer", "pretrain"]


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "pretrain"):
        from cl_zoo.train import loop

        return getattr(loop, name)
    raise AttributeError(name)
