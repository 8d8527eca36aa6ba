"""cl-zoo: contrastive self-supervised vision models, from pretraining to detection transfer.

The public API is small: build or load models (``create_model``, ``load_pretrained``,
``load_model``), write checkpoints (``save_pretrained``), list what exists (``list_models``),
preprocess images as a model expects (``resolve_data_config``, ``create_transform``, in timm's
vocabulary) and embed images (``embed``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from cl_zoo.checkpoint import save_pretrained
from cl_zoo.errors import CheckpointError, ClZooError, DataError, HubError, ModelArgumentError, ModelNotFoundError
from cl_zoo.checkpoint.hub import load_model, load_pretrained
from cl_zoo.registry import PretrainedCfg, create_model, list_models, register_model, register_pretrained


# The three below import the embedding package on first call, not here, to keep ``import cl_zoo`` light.


def embed(*args: Any, **kwargs: Any) -> Any:
    """Embed image files, folders or in-memory images; see :func:`cl_zoo.embedding.api.embed`."""
    from cl_zoo.embedding.api import embed as _embed

    return _embed(*args, **kwargs)


def resolve_data_config(model_or_name: Any, **overrides: Any) -> dict[str, Any]:
    """timm's data config for a model; see :func:`cl_zoo.data.transforms.resolve_data_config`."""
    from cl_zoo.data.transforms import resolve_data_config as _resolve

    return _resolve(model_or_name, **overrides)


def create_transform(model_or_name_or_config: Any, is_training: bool = False) -> Any:
    """PIL image -> the tensor a model is fed; see :func:`cl_zoo.data.transforms.create_transform`."""
    from cl_zoo.data.transforms import create_transform as _create

    return _create(model_or_name_or_config, is_training=is_training)


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
    "resolve_data_config",
    "create_transform",
    "ClZooError",
    "ModelNotFoundError",
    "ModelArgumentError",
    "CheckpointError",
    "HubError",
    "DataError",
]
