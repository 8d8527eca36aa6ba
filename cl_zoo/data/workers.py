"""How many decoding processes to start when the user does not say.

A fixed default (it used to be 4) oversubscribes small machines: on 2 cores every DataLoader prints
a warning that it may freeze, and the extra processes only add contention. The default is the CPUs
this process may actually run on (its affinity mask, which containers and ``taskset`` narrow),
capped so that a 128-core server does not fork 128 decoders for one model.
"""

from __future__ import annotations

import os

MAX_DEFAULT_WORKERS = 8


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def default_workers(cap: int = MAX_DEFAULT_WORKERS) -> int:
    """Decoding workers when none are asked for: the usable CPUs, at most ``cap``."""
    return min(cap, usable_cpus())


__all__ = ["MAX_DEFAULT_WORKERS", "default_workers", "usable_cpus"]
