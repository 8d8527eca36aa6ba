"""Old home of the distributed helpers, kept so ``cl_zoo.train.dist`` imports go on working.

They live in :mod:`cl_zoo.distributed`, below both ``methods/`` and ``train/``: the methods gather
their embeddings there without importing the trainer's package (no ``methods -> train`` arrow).
"""

from __future__ import annotations

from cl_zoo.distributed import (
    barrier,
    gather,
    get_rank,
    get_world_size,
    is_distributed,
    is_main,
    local_slice,
)

__all__ = ["barrier", "gather", "get_rank", "get_world_size", "is_distributed", "is_main", "local_slice"]
