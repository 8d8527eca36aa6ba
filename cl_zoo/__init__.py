"""cl-zoo: contrastive self-supervised vision models, from pretraining to detection transfer.

The public API is small: build or load models (``create_model``, ``load_pretrained``,
``load_model``), write checkpoints (``save_pretrained``), list what exists (``list_models``),
preprocess images as a model expects (``resolve_data_config``, ``create_transform``, in timm's
vocabulary) and embed images (``embed``).

``import cl_zoo`` does not import torch: every name below is imported on first use (PEP 562), so
``cl-zoo --help``, ``cl-zoo models`` and a script that only lists models start at once. Importing
the package fills the model registry (:mod:`cl_zoo.models`, torch-free tables), so every
``cl_zoo.*`` module sees the zoo's names.
"""

from __future__ import annotations

__version__ = "0.1.0"

from cl_zoo import models  # noqa: E402,F401  (fills the registry: the one place that imports the tables)
from cl_zoo.errors import CheckpointError, ClZooError, DataError, HubError, ModelArgumentError, ModelNotFoundError  # noqa: E402
from cl_zoo.lazy import lazy_exports  # noqa: E402

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

__getattr__, __dir__ = lazy_exports(globals(), {
    "create_model": "cl_zoo.factory:create_model",
    "load_pretrained": "cl_zoo.factory:load_pretrained",
    "load_model": "cl_zoo.factory:load_model",
    "list_models": "cl_zoo.registry:list_models",
    "register_model": "cl_zoo.registry:register_model",
    "register_pretrained": "cl_zoo.registry:register_pretrained",
    "PretrainedCfg": "cl_zoo.registry:PretrainedCfg",
    "save_pretrained": "cl_zoo.checkpoint.folder:save_pretrained",
    # Batched feature extraction: cl_zoo.embedding.api.embed (a function; cl_zoo.embedding is its package).
    "embed": "cl_zoo.embedding.api:embed",
    "resolve_data_config": "cl_zoo.embedding.transforms:resolve_data_config",
    "create_transform": "cl_zoo.embedding.transforms:create_transform",
})
