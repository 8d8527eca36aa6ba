"""Old home of :mod:`cl_zoo.embedding.transforms` (``resolve_data_config``, ``create_transform``).

The module moved next to the embedding preprocessing it reuses, so that ``cl_zoo.data`` (image
folders, augmentations) stays below the model and checkpoint packages. Names are served lazily
from the new home; import from there or from ``cl_zoo`` itself.
"""

from cl_zoo.lazy import lazy_exports

_MOVED = ("resolve_data_config", "create_transform", "IN_MEMORY_KINDS", "is_in_memory", "pil_images")

__getattr__, __dir__ = lazy_exports(globals(), {name: f"cl_zoo.embedding.transforms:{name}" for name in _MOVED})
