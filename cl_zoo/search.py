"""Retired path of :mod:`cl_zoo.index.search` (index/ owns search and dedup); it still imports, with a
``DeprecationWarning`` (:mod:`cl_zoo.deprecations`)."""

from cl_zoo.deprecations import retired_exports

__getattr__, __dir__ = retired_exports(globals())
