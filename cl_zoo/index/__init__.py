"""Saved faiss indexes built to a memory budget: ``cl-zoo index``, reused by ``search`` and ``dedup``.

One concept per module: :mod:`~cl_zoo.index.plan` picks the index (autofaiss's rule),
:mod:`~cl_zoo.index.source` reads embeddings block by block, :mod:`~cl_zoo.index.build` trains,
fills, evaluates and saves, :mod:`~cl_zoo.index.evaluate` measures recall@10 and latency,
:mod:`~cl_zoo.index.sidecar` and :mod:`~cl_zoo.index.fingerprint` record what an index was built
from, :mod:`~cl_zoo.index.load` opens one for a given set of embeddings, and
:mod:`~cl_zoo.index.dedup` finds near-duplicate pairs through one.
"""

from __future__ import annotations

from cl_zoo.index.build import (
    BuildResult,
    build_index,
    default_sample_size,
    embeddings_fingerprint_of,
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
from cl_zoo.index.sidecar import IndexInfo, read_info, sidecar_path
from cl_zoo.index.source import EmbeddingSource, SavedRows, open_rows, open_source, read_npy_header

__all__ = [
    "PQ_MARGIN",
    "RECALL_K",
    "SavedRows",
    "TARGET_RECALL",
    "BuildResult",
    "EmbeddingSource",
    "Evaluation",
    "IndexInfo",
    "IndexPlan",
    "build_index",
    "choose_index",
    "default_sample_size",
    "embeddings_fingerprint",
    "embeddings_fingerprint_of",
    "file_digest",
    "format_bytes",
    "index_nearest_neighbour_scores",
    "index_similar_pairs",
    "load_saved_index",
    "open_rows",
    "open_source",
    "parse_memory",
    "peak_rss_bytes",
    "read_info",
    "read_npy_header",
    "sidecar_path",
]
