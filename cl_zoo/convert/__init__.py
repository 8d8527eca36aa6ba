"""Moving backbones in and out of the zoo: exports for detectron2, torchvision and timm."""

from cl_zoo.convert.export import (
    EXPORTERS,
    ExportSummary,
    ResNetWeights,
    detectron2_name,
    export_detectron2,
    export_timm,
    export_torchvision,
    resnet_weights,
)

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
