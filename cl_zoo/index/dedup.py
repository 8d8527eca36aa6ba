"""Near-duplicate pairs through a saved (approximate) index instead of exact all-pairs search.

Exact dedup compares every row with every other (quadratic); a saved index answers each row's
"who is within the threshold" from a fraction of the data. The result is approximate in one
direction only: the index may miss a pair (a neighbour in a list not probed, a graph path not
taken), but every pair it proposes is re-scored with the exact cosine of the two embeddings and
kept only if that reaches the threshold, so no pair below the threshold is reported and every
similarity shown is exact. Compressed (PQ) indexes score approximately, so their candidates are
gathered below the threshold by :data:`PQ_MARGIN` before the exact check.
"""

from __future__ import annotations

import numpy as np

from cl_zoo.search import normalize, require_faiss

PQ_MARGIN = 0.05
_BLOCK = 4096


def candidate_margin(index) -> float:  # noqa: ANN001 - a faiss.Index
    """How far below the threshold to gather candidates: 0 where the index stores raw vectors."""
    faiss = require_faiss()
    return PQ_MARGIN if isinstance(index, faiss.IndexPreTransform) else 0.0


def index_similar_pairs(index, features: np.ndarray, threshold: float, block: int = _BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # noqa: ANN001
    """Pairs ``i < j`` the index finds with exact cosine >= ``threshold`` (approximate recall).

    Uses range search where the index supports it; otherwise a k-NN search that doubles k while
    a row's k-th hit still passes the threshold.
    """
    x = normalize(features)
    radius = float(np.nextafter(np.float32(threshold - candidate_margin(index)), np.float32(-np.inf)))
    rows, cols = [], []
    for start in range(0, len(x), block):
        q = x[start : start + block]
        r, c = _range_candidates(index, q, radius, start)
        rows.append(r)
        cols.append(c)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    keep = (c != r) & (c >= 0) & (c < len(x))
    # Approximate search is not symmetric: a pair found from either side counts, once.
    pairs = np.unique(np.stack([np.minimum(r[keep], c[keep]), np.maximum(r[keep], c[keep])], axis=1), axis=0)
    r, c = pairs[:, 0], pairs[:, 1]
    sims = np.einsum("ij,ij->i", x[r], x[c]) if len(r) else np.zeros(0, np.float32)
    exact = sims >= np.float32(threshold)
    return r[exact].astype(np.int64), c[exact].astype(np.int64), sims[exact].astype(np.float32)


def _range_candidates(index, q: np.ndarray, radius: float, start: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
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


def index_nearest_neighbour_scores(index, features: np.ndarray, block: int = _BLOCK) -> np.ndarray:  # noqa: ANN001
    """Each row's exact cosine to the most similar *other* row the index finds (approximate)."""
    x = normalize(features)
    if len(x) < 2:
        return np.zeros(0, np.float32)
    best = np.empty(len(x), np.float32)
    for start in range(0, len(x), block):
        q = x[start : start + block]
        _, ids = index.search(q, min(3, index.ntotal))
        own = np.arange(start, start + len(q))[:, None]
        ids = np.where(ids == own, -1, ids)
        scores = np.where(ids >= 0, np.einsum("ij,ikj->ik", q, x[np.maximum(ids, 0)]), -np.inf)
        best[start : start + len(q)] = scores.max(axis=1)
    return best[np.isfinite(best)]  # rows whose only hit was themselves have no score to show


__all__ = ["PQ_MARGIN", "index_nearest_neighbour_scores", "index_similar_pairs"]
