"""Retired path of :mod:`cl_zoo.distributed`, which lives below both ``methods/`` and ``train/`` so the
methods gather their embeddings without importing the trainer's package. Its names are still served
from here, with a ``DeprecationWarning`` (:mod:`cl_zoo.deprecations`).
"""

from cl_zoo.deprecations import retired_exports

__getattr__, __dir__ = retired_exports(globals())
