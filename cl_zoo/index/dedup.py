"""Near-duplicate pairs through a saved (approximate) index instead of exact all-pairs search.

Exact dedup compares every row with every other (quadratic); a saved index answers each row's
"who is within the threshold" from a fraction of the data. The result is approximate in one
direction only: the index may miss a pair (a neighbour in a list not probed, a graph path not
taken), but every pair it proposes is re-scored with the exact cosine of the two embeddings and
kept only if that reaches the threshold, so no pair below the threshold is reported and every
similarity shown is exact. Compressed (PQ) indexes score approximately, so their candidates are
gathered below the threshold by :data:`PQ_MARGIN` before the exact check.

The rows may be an array in memory or an :class:`~cl_zoo.index.source.EmbeddingSource` on disk (a
``.npy`` or a shard folder): queries are read one block at a time and the candidates' vectors for
the exact check are fetched by id, a bounded number at a time, so deduplicating a collection
larger than memory needs the index and a few blocks, never the whole matrix.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cl_zoo.index.source import EmbeddingSource
from cl_zoo.index.search import normalize, require_faiss

PQ_MARGIN = 0.05
_BLOCK = 4096
# Candidate pairs re-scored at once: bounds the rows fetched for the exact check (16k x dims floats).
_PAIR_CHUNK = 16_384

Rows = np.ndarray | EmbeddingSource


def candidate_margin(index) -> float:  # noqa: ANN001 - a faiss.Index
    """How far below the threshold to gather candidates: 0 where the index stores raw vectors."""
    faiss = require_faiss()
    return PQ_MARGIN if isinstance(index, faiss.IndexPreTransform) else 0.0


def row_count(features: Rows) -> int:
    return features.rows if isinstance(features, EmbeddingSource) else len(features)


def normalized_blocks(features: Rows, block: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, unit-norm block)``: read from disk for a source, sliced (not copied whole) for an array."""
    if isinstance(features, EmbeddingSource):
        yield from features.blocks(block)
        return
    for start in range(0, len(features), block):
        yield start, normalize(features[start : start + block])


def normalized_rows(features: Rows, ids: np.ndarray) -> np.ndarray:
    """The unit-norm rows at ``ids`` (sorted, distinct)."""
    if isinstance(features, EmbeddingSource):
        return features.take(ids)
    return normalize(features[ids])


def exact_scores(features: Rows, q: np.ndarray, own: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Exact cosine of block rows ``own`` (block positions) with rows ``others`` (global ids), chunked."""
    sims = np.empty(len(own), np.float32)
    for lo in range(0, len(own), _PAIR_CHUNK):
        hi = min(lo + _PAIR_CHUNK, len(own))
        wanted, inverse = np.unique(others[lo:hi], return_inverse=True)
        sims[lo:hi] = np.einsum("ij,ij->i", q[own[lo:hi]], normalized_rows(features, wanted)[inverse.reshape(-1)])
    return sims


def index_similar_pairs(index, features: Rows, threshold: float, block: int = _BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # noqa: ANN001
    """Pairs ``i < j`` the index finds with exact cosine >= ``threshold`` (approximate recall).

    Uses range search where the index supports it; otherwise a k-NN search that doubles k while
    a row's k-th hit still passes the threshold. ``features`` is an array or an
    :class:`EmbeddingSource` read block by block.
    """
    n = row_count(features)
    radius = float(np.nextafter(np.float32(threshold - candidate_margin(index)), np.float32(-np.inf)))
    lows, highs, scores = [], [], []
    for start, q in normalized_blocks(features, block):
        r, c = _range_candidates(index, q, radius, start)
        keep = (c != r) & (c >= 0) & (c < n)
        r, c = r[keep], c[keep]
        if not len(r):
            continue
        sims = exact_scores(features, q, r - start, c)
        exact = sims >= np.float32(threshold)
        r, c = r[exact], c[exact]
        lows.append(np.minimum(r, c))
        highs.append(np.maximum(r, c))
        scores.append(sims[exact])
    if not lows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    # Approximate search is not symmetric: a pair found from either side counts, once.
    pairs, first = np.unique(np.stack([np.concatenate(lows), np.concatenate(highs)], axis=1), axis=0, return_index=True)
    return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64), np.concatenate(scores)[first].astype(np.float32)


def _range_candidates(index, q: np.ndarray, radius: float, start: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    if isinstance(index, require_faiss().IndexHNSW):
        # faiss's HNSW range search aborts the process (an uncaught C++ exception from a parallel
        # region) once a call holds more queries than its interrupt-check period, about
        # 1e8 / (levels * dims * efSearch): 4,068 at 512 dims, efSearch 16, 3 levels (faiss 1.15).
        # Its results are capped by efSearch anyway; the k-NN search below is not.
        return _knn_candidates(index, q, radius, start)
    try:
        lims, _, labels = index.range_search(q, radius)
    except RuntimeError:  # an index type without range search
        return _knn_candidates(index, q, radius, start)
    own = np.repeat(np.arange(start, start + len(q)), np.diff(lims.astype(np.int64)))
    return own, labels.astype(np.int64)


def _knn_candidates(index, q: np.ndarray, radius: float, start: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    k, rows, cols = 16, [], []
    pending = np.arange(len(q))
    while len(pending):
        k = min(k, index.ntotal)
        scores, ids = index.search(q[pending], k)
        hit = (scores > radius) & (ids >= 0)
        full = hit[:, -1] & (k < index.ntotal)  # the k-th hit passes: there may be more
        done = ~full
        r = np.repeat(pending[done] + start, hit[done].sum(axis=1))
        rows.append(r)
        cols.append(ids[done][hit[done]])
        pending, k = pending[full], k * 2
    return np.concatenate(rows), np.concatenate(cols).astype(np.int64)


def index_nearest_neighbour_scores(index, features: Rows, block: int = _BLOCK) -> np.ndarray:  # noqa: ANN001
    """Each row's exact cosine to the most similar *other* row the index finds (approximate).

    ``features`` is an array or an :class:`EmbeddingSource` read block by block.
    """
    n = row_count(features)
    if n < 2:
        return np.zeros(0, np.float32)
    best = np.empty(n, np.float32)
    for start, q in normalized_blocks(features, block):
        _, ids = index.search(q, min(3, index.ntotal))
        own = np.arange(start, start + len(q))[:, None]
        ids = np.where((ids == own) | (ids >= n), -1, ids)
        found = ids >= 0
        scores = np.full(ids.shape, -np.inf, np.float32)
        scores[found] = exact_scores(features, q, np.nonzero(found)[0], ids[found].astype(np.int64))
        best[start : start + len(q)] = scores.max(axis=1)
    return best[np.isfinite(best)]  # rows whose only hit was themselves have no score to show


__all__ = ["PQ_MARGIN", "Rows", "index_nearest_neighbour_scores", "index_similar_pairs"]
