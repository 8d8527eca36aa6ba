"""cl-zoo: contrastive self-supervised vision models, from pretraining to detection transfer.

The public API is small: build or load models (``create_model``, ``load_pretrained``,
``load_model``), write checkpoints (``save_pretrained``), list what exists (``list_models``),
and embed images (``embed``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from cl_zoo.checkpoint import save_pretrained
from cl_zoo.errors import CheckpointError, ClZooError, DataError, HubError, ModelNotFoundError
from cl_zoo.checkpoint.hub import load_model, load_pretrained
from cl_zoo.registry import PretrainedCfg, create_model, list_models, register_model, register_pretrained


def embed(*args: Any, **kwargs: Any) -> Any:
    """Embed images; see :func:`cl_zoo.embed.embed` (imported lazily to keep ``import cl_zoo`` light)."""
    from cl_zoo.embedding import embed as _embed

    return _embed(*args, **kwargs)


__all__ = [
    "__version__",
    "create_model",
    "list_models",
    "register_model",
    "register_pretrained",
    "PretrainedCfg",
    "load_pretrained",
    "load_model",
    "save_pretrained",
    "embed",
    "ClZooError",
    "ModelNotFoundError",
    "CheckpointError",
    "HubError",
    "DataError",
]
