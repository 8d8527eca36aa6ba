"""Moving backbones into the zoo: release sources (:mod:`~cl_zoo.convert.sources`), readers of
author-released checkpoints (:mod:`~cl_zoo.convert.readers`) and mirrors.

The exporters once served from here live in :mod:`cl_zoo.export`, above the factory; their old
names still work, with a ``DeprecationWarning`` (:mod:`cl_zoo.deprecations`).
"""

from cl_zoo.deprecations import retired_exports

__getattr__, __dir__ = retired_exports(globals())
