"""Moved to :mod:`cl_zoo.index.search` (issue 43: index/ owns search and dedup); this old path still imports."""

from __future__ import annotations

from cl_zoo.index.search import *  # noqa: F401,F403 - the old import path, kept for users and scripts
from cl_zoo.index.search import __all__  # noqa: F401
