"""Retired path of :mod:`cl_zoo.index.dedup_calibration` (index/ owns search and dedup); it still imports,
with a ``DeprecationWarning`` (:mod:`cl_zoo.deprecations`). Cards calibrated before the move record
``cl_zoo.dedup_calibration.calibrate_dedup_threshold`` as their method: that label still names this path."""

from cl_zoo.deprecations import retired_exports

__getattr__, __dir__ = retired_exports(globals())
