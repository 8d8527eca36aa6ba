"""Moving backbones in and out of the zoo: exports for detectron2, torchvision and timm.

The export names are imported from :mod:`cl_zoo.export` (numpy and torch) on first use,
so the release sources (:mod:`~cl_zoo.convert.sources`) can be read without them.
"""

from cl_zoo.lazy import lazy_exports

__all__ = [
    "EXPORTERS",
    "ExportSummary",
    "ResNetWeights",
    "detectron2_name",
    "export_detectron2",
    "export_timm",
    "export_torchvision",
    "resnet_weights",
]

__getattr__, __dir__ = lazy_exports(globals(), {name: f"cl_zoo.export:{name}" for name in __all__})
