"""Retired path of :mod:`cl_zoo.embedding.transforms` (``resolve_data_config``, ``create_transform``).

The module moved next to the embedding preprocessing it reuses, so that ``cl_zoo.data`` (image
folders, augmentations) stays below the model and checkpoint packages. Its names are still served
from here, with a ``DeprecationWarning`` (:mod:`cl_zoo.deprecations`).
"""

from cl_zoo.deprecations import retired_exports

__getattr__, __dir__ = retired_exports(globals())
