"""How good a built index is: recall@10 against exact search, and query latency.

Queries are rows of the data (a seeded sample, held out of training where the data allows), and
each query's own row is dropped from both the exact and the approximate neighbour lists: it is
trivially found and would lift every recall by about 1/k. Exact neighbours come from brute force
over the data streamed block by block, so evaluation needs no second copy of the matrix.

Search parameters are tuned on the same queries: the smallest ``efSearch`` / ``nprobe`` on a
doubling ladder that reaches the target recall (0.9), or, where quantization caps recall below it,
the point where doubling stops paying (less than 2% more recall, relative).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from cl_zoo.index.source import DEFAULT_BLOCK_ROWS, EmbeddingSource
from cl_zoo.index.search import require_faiss

RECALL_K = 10
TARGET_RECALL = 0.9
# Doubling the search effort for less than 2% more recall (relative) means quantization caps it.
_PLATEAU_GAIN = 0.02
_LATENCY_BATCH = 100


@dataclass(frozen=True)
class Evaluation:
    """What tuning settled on and what it measured."""

    search_params: str
    recall: float
    target_met: bool
    latency_ms: float
    tried: tuple[tuple[str, float], ...]  # (params, recall) in the order tried


def exact_neighbours(source: EmbeddingSource, queries: np.ndarray, k: int, block_rows: int = DEFAULT_BLOCK_ROWS) -> np.ndarray:
    """Ids of the ``k`` highest inner products of each (normalised) query over all rows, streamed."""
    faiss = require_faiss()
    k = min(k, source.rows)
    best_s = np.full((len(queries), k), -np.inf, np.float32)
    best_i = np.full((len(queries), k), -1, np.int64)
    for start, block in source.blocks(block_rows):
        s, i = faiss.knn(queries, block, min(k, len(block)), metric=faiss.METRIC_INNER_PRODUCT)
        all_s = np.concatenate([best_s, s], axis=1)
        all_i = np.concatenate([best_i, i + start], axis=1)
        top = np.argsort(-all_s, axis=1, kind="stable")[:, :k]
        best_s = np.take_along_axis(all_s, top, axis=1)
        best_i = np.take_along_axis(all_i, top, axis=1)
    return best_i


def drop_self(ids: np.ndarray, own: np.ndarray, k: int) -> np.ndarray:
    """Each row's ids without the query's own id, cut to ``k`` (padded with -1)."""
    out = np.full((len(ids), k), -1, np.int64)
    for r, (row, me) in enumerate(zip(ids, own)):
        kept = row[(row != me) & (row >= 0)][:k]
        out[r, : len(kept)] = kept
    return out


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of each query's true neighbours (-1 padding ignored) that were found."""
    hits, total = 0, 0
    for f, t in zip(found, truth):
        t = t[t >= 0]
        hits += len(np.intersect1d(f[f >= 0], t))
        total += len(t)
    return hits / total if total else 1.0


def parameter_ladder(index, kind: str) -> list[str]:  # noqa: ANN001 - a faiss.Index
    """Search settings to try, cheapest first."""
    faiss = require_faiss()
    if kind == "hnsw":
        return [f"efSearch={ef}" for ef in (16, 32, 64, 128, 256, 512, 1024)]
    if kind in ("ivf-flat", "opq-ivf-pq"):
        nlist = faiss.extract_index_ivf(index).nlist
        # Doubling up to every list (an exhaustive scan reaches exact recall for IVF-Flat): a fixed cap
        # at 2048 left a 4000-list index at recall 0.79 with no setting that could reach the target.
        probes = sorted({min(2**i, nlist) for i in range(max(1, nlist).bit_length() + 1)})
        if kind == "ivf-flat":
            return [f"nprobe={p}" for p in probes]
        hnsw_quantizer = isinstance(faiss.downcast_index(faiss.extract_index_ivf(index).quantizer), faiss.IndexHNSW)
        return [f"nprobe={p},quantizer_efSearch={max(2 * p, 64)}" if hnsw_quantizer else f"nprobe={p}" for p in probes]
    return [""]


def apply_params(index, params: str) -> None:  # noqa: ANN001 - a faiss.Index
    """Set a faiss ParameterSpace string ("" changes nothing)."""
    if params:
        require_faiss().ParameterSpace().set_index_parameters(index, params)


def search_ids(index, queries: np.ndarray, k: int) -> np.ndarray:  # noqa: ANN001
    return index.search(queries, min(k, index.ntotal))[1]


def median_latency_ms(index, queries: np.ndarray, k: int = RECALL_K, batch: int = _LATENCY_BATCH) -> float:  # noqa: ANN001
    """Median milliseconds per query over batches of ``batch`` queries (one warm-up batch first)."""
    chunks = [queries[i : i + batch] for i in range(0, len(queries), batch)] or [queries]
    index.search(chunks[0], min(k, index.ntotal))
    per_query = []
    for chunk in chunks:
        t0 = time.perf_counter()
        index.search(chunk, min(k, index.ntotal))
        per_query.append((time.perf_counter() - t0) * 1000 / len(chunk))
    return float(np.median(per_query))


def tune_and_measure(index, kind: str, queries: np.ndarray, query_ids: np.ndarray, truth: np.ndarray, k: int = RECALL_K) -> Evaluation:  # noqa: ANN001
    """Pick search parameters for the target recall, leave them set on ``index``, measure latency.

    ``truth`` holds each query's exact ``k + 1`` neighbours (own row included; it is dropped here).
    """
    k_eff = min(k, index.ntotal - 1)
    if k_eff < 1:
        return Evaluation("", 1.0, True, median_latency_ms(index, queries, 1), ())
    exact = drop_self(truth, query_ids, k_eff)
    tried: list[tuple[str, float]] = []
    chosen, chosen_recall = "", 0.0
    for params in parameter_ladder(index, kind):
        apply_params(index, params)
        recall = recall_at_k(drop_self(search_ids(index, queries, k_eff + 1), query_ids, k_eff), exact)
        tried.append((params, recall))
        if recall >= TARGET_RECALL:
            chosen, chosen_recall = params, recall
            break
        if tried[:-1] and recall < tried[-2][1] * (1 + _PLATEAU_GAIN):
            chosen, chosen_recall = tried[-2]  # doubling stopped paying: keep the cheaper setting
            break
        chosen, chosen_recall = params, recall
    apply_params(index, chosen)
    return Evaluation(chosen, chosen_recall, chosen_recall >= TARGET_RECALL, median_latency_ms(index, queries, k), tuple(tried))


__all__ = ["RECALL_K", "TARGET_RECALL", "Evaluation", "apply_params", "exact_neighbours", "recall_at_k", "tune_and_measure"]
