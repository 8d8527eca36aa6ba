"""Moved to :mod:`cl_zoo.index.dedup_calibration` (issue 43: index/ owns search and dedup); this old path
still imports (model cards record ``cl_zoo.dedup_calibration.calibrate_dedup_threshold`` as their method)."""

from __future__ import annotations

from cl_zoo.index.dedup_calibration import *  # noqa: F401,F403 - the old import path, kept for users and scripts
from cl_zoo.index.dedup_calibration import __all__  # noqa: F401
