"""Retired path of :mod:`cl_zoo.export` (backbone exports for detectron2, torchvision and timm).

Exporting starts from a model (``cl_zoo.factory``), which itself reads release sources from
``cl_zoo.convert``; the exporters moved to the package root so that ``convert`` stays below the
factory. Its names are still served from here, with a ``DeprecationWarning`` (:mod:`cl_zoo.deprecations`).
"""

from cl_zoo.deprecations import retired_exports

__getattr__, __dir__ = retired_exports(globals())
