"""Old home of :mod:`cl_zoo.export` (backbone exports for detectron2, torchvision and timm).

Exporting starts from a model (``cl_zoo.factory``), which itself reads release sources from
``cl_zoo.convert``; the exporters moved to the package root so that ``convert`` stays below the
factory. Names are served lazily from the new home.
"""

from cl_zoo.lazy import lazy_exports

_MOVED = ("EXPORTERS", "ExportSummary", "ResNetWeights", "detectron2_name", "export_detectron2", "export_timm",
          "export_torchvision", "resnet_weights", "check_standard_layout", "detectron2_state", "torchvision_state", "TARGETS")

__getattr__, __dir__ = lazy_exports(globals(), {name: f"cl_zoo.export:{name}" for name in _MOVED})
