"""The JSON file saved beside an index (``INDEX.faiss.json``): what it indexes and how to search it.

``search`` and ``dedup`` read it to refuse an index built from other embeddings (the
fingerprint) and to search with the parameters the build measured its recall with (``nprobe``,
``efSearch``), so the recall printed at build time is the recall users get.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import read_bounded_json

FORMAT = "cl-zoo-index/1"
_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class IndexInfo:
    """Everything recorded about a built index."""

    factory: str
    kind: str
    n: int
    dim: int
    fingerprint: str  # of the embeddings, see cl_zoo.index.fingerprint
    max_memory_bytes: int
    index_bytes: int
    index_digest: str  # file_digest of the index file: catches an index and sidecar that were separated
    search_params: str  # faiss ParameterSpace string ("nprobe=16", "efSearch=64", "")
    recall_at_10: float
    recall_target_met: bool
    latency_ms: float  # median per query, batches of queries
    build_seconds: float
    reason: str
    nlist: int = 0
    sources: list[str] = field(default_factory=list)
    sample_size: int = 0
    seed: int = 0
    eval_queries: int = 0
    peak_rss_bytes: int = 0
    format: str = FORMAT

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def sidecar_path(index_path: str | os.PathLike[str]) -> Path:
    """``x.faiss`` -> ``x.faiss.json``."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.name + ".json")


def is_index_description(path: Path) -> bool:
    """Whether ``path`` is an index description cl-zoo wrote, the only file ``cl-zoo index`` replaces
    beside its output (anything else there, or an unreadable file, is the user's)."""
    try:
        data = read_bounded_json(path, _MAX_BYTES, "index description")
    except ClZooError:
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def read_info(index_path: str | os.PathLike[str]) -> IndexInfo | None:
    """The sidecar of ``index_path``, or None when there is none (an index from ``--save-index``)."""
    path = sidecar_path(index_path)
    if not path.is_file():
        return None
    try:
        data = read_bounded_json(path, _MAX_BYTES, "index description")
    except DataError as exc:
        raise DataError(f"{exc}; rebuild the index with cl-zoo index") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path} is not a cl-zoo index description ({FORMAT}); rebuild the index with cl-zoo index")
    known = {f.name: f for f in fields(IndexInfo)}
    values = {k: v for k, v in data.items() if k in known}
    missing = [name for name, f in known.items() if name not in values and f.default is MISSING and f.default_factory is MISSING]
    types = {"int": int, "str": str, "float": (int, float), "bool": bool, "list[str]": list}
    for name, value in values.items():
        want = types.get(str(known[name].type))
        if want is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            raise DataError(f"{path}: {name} has the wrong type ({type(value).__name__}); rebuild the index with cl-zoo index")
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)}; rebuild the index with cl-zoo index")
    return IndexInfo(**values)


__all__ = ["FORMAT", "IndexInfo", "is_index_description", "read_info", "sidecar_path"]
