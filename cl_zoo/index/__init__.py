"""Saved faiss indexes built to a memory budget: ``cl-zoo index``, reused by ``search`` and ``dedup``.

One concept per module: :mod:`~cl_zoo.index.plan` picks the index (autofaiss's rule),
:mod:`~cl_zoo.index.source` reads embeddings block by block, :mod:`~cl_zoo.index.build` trains,
fills, evaluates and saves, :mod:`~cl_zoo.index.evaluate` measures recall@10 and latency,
:mod:`~cl_zoo.index.sidecar` and :mod:`~cl_zoo.index.fingerprint` record what an index was built
from, :mod:`~cl_zoo.index.load` opens one for a given set of embeddings, and
:mod:`~cl_zoo.index.dedup` finds near-duplicate pairs through one. :mod:`~cl_zoo.index.search` is
the in-memory side (exact and small faiss indexes over a loaded matrix, near-duplicate groups, and
the checks a saved faiss file is opened with) and :mod:`~cl_zoo.index.dedup_calibration` measures a
model's near-duplicate threshold; their retired top-level paths (``cl_zoo.search``,
``cl_zoo.dedup_calibration``) still import, with a ``DeprecationWarning``.

The ``.npy`` / path list / metadata readers this package shares with :mod:`cl_zoo.embedding` are in
:mod:`cl_zoo.arrays`, below both. From :mod:`cl_zoo.embedding` this package imports only what is
embedding's own: its shard-folder format (``open_shards``, ``ShardSet``, ``MANIFEST_NAME``), its
whole-file loader (``load_embeddings``, for a parquet file), the model reference its metadata records
(``resolve_model_reference``) and, to calibrate, its model loading and feature extraction.

``search.build_index`` (an in-memory index of a loaded matrix) and :func:`build_index` (a saved index
built to a memory budget) are different functions; only the second is exported here under that name.
"""

from __future__ import annotations

from cl_zoo.index.build import (
    BuildResult,
    build_index,
    default_sample_size,
    embeddings_fingerprint_of,
)
from cl_zoo.index.dedup_calibration import (
    CONFIG_KEY,
    FALLBACK_DEDUP_THRESHOLD,
    DedupCalibration,
    calibrate_dedup_threshold,
    recorded_threshold,
)
from cl_zoo.index.dedup import (
    PQ_MARGIN,
    index_nearest_neighbour_scores,
    index_similar_pairs,
)
from cl_zoo.index.evaluate import RECALL_K, TARGET_RECALL, Evaluation
from cl_zoo.index.fingerprint import embeddings_fingerprint, file_digest
from cl_zoo.index.load import load_saved_index
from cl_zoo.index.memory import format_bytes, parse_memory, peak_rss_bytes
from cl_zoo.index.plan import IndexPlan, choose_index
from cl_zoo.index.search import (
    INDEX_KINDS,
    dedup_groups,
    dedup_threshold_for,
    groups_from_pairs,
    load_index,
    nearest_neighbour_scores,
    normalize,
    require_faiss,
    save_index,
    similar_pairs,
)
from cl_zoo.index.sidecar import IndexInfo, read_info, sidecar_path
from cl_zoo.index.source import EmbeddingSource, SavedRows, open_rows, open_source, read_npy_header

__all__ = [
    "CONFIG_KEY",
    "FALLBACK_DEDUP_THRESHOLD",
    "INDEX_KINDS",
    "PQ_MARGIN",
    "RECALL_K",
    "SavedRows",
    "TARGET_RECALL",
    "BuildResult",
    "DedupCalibration",
    "EmbeddingSource",
    "Evaluation",
    "IndexInfo",
    "IndexPlan",
    "build_index",
    "calibrate_dedup_threshold",
    "choose_index",
    "dedup_groups",
    "dedup_threshold_for",
    "default_sample_size",
    "embeddings_fingerprint",
    "embeddings_fingerprint_of",
    "file_digest",
    "format_bytes",
    "groups_from_pairs",
    "index_nearest_neighbour_scores",
    "index_similar_pairs",
    "load_index",
    "load_saved_index",
    "nearest_neighbour_scores",
    "normalize",
    "open_rows",
    "open_source",
    "parse_memory",
    "peak_rss_bytes",
    "read_info",
    "read_npy_header",
    "recorded_threshold",
    "require_faiss",
    "save_index",
    "sidecar_path",
    "similar_pairs",
]
