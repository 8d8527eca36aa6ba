"""The zoo's models. Importing this package fills the registry, the one place that does: the
architecture table (:mod:`~cl_zoo.models.archs`) and the pretrained tables
(:mod:`~cl_zoo.models.pretrained`, :mod:`~cl_zoo.models.releases`), all torch-free, so ``import
cl_zoo`` can import it. The family modules (``resnet``, ``cmc_dual``, ``alexnet``, ``pixels``) hold
the torch code; they are imported on the first build of one of their architectures, or when one of
the classes below is first read."""

from cl_zoo.lazy import lazy_exports
from cl_zoo.models import archs, pretrained, releases  # noqa: F401  (registration)

__all__ = ["ResNet", "CMCDualEncoder", "SmallAlexNet", "Pixels"]

__getattr__, __dir__ = lazy_exports(globals(), {
    "ResNet": "cl_zoo.models.resnet:ResNet",
    "CMCDualEncoder": "cl_zoo.models.cmc_dual:CMCDualEncoder",
    "SmallAlexNet": "cl_zoo.models.alexnet:SmallAlexNet",
    "Pixels": "cl_zoo.models.pixels:Pixels",
})
