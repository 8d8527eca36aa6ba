"""Backbone families (one module each). Importing this package registers every architecture and
the zoo's pretrained entries."""

from cl_zoo.models import alexnet, cmc_dual, pixels, resnet  # noqa: F401  (registration)
from cl_zoo.models import pretrained, releases  # noqa: F401  (pretrained tables)
from cl_zoo.models.alexnet import SmallAlexNet
from cl_zoo.models.cmc_dual import CMCDualEncoder
from cl_zoo.models.pixels import Pixels
from cl_zoo.models.resnet import ResNet

__all__ = ["ResNet", "CMCDualEncoder", "SmallAlexNet", "Pixels"]
