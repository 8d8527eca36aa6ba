"""Build a faiss index to a memory budget, block by block, and save it with its description.

The matrix is never in memory whole: the index is trained on a seeded random sample of rows, then
rows are added one block (65,536 rows, fewer under a tight budget) at a time, and evaluated against
exact neighbours computed by streaming the blocks again. What stays resident is the index itself
(at most the budget, by the plan in :mod:`cl_zoo.index.plan`), a few copies of one block, and
during training the sample, capped so its copies stay within the budget and freed before adding.

Everything that can be refused (a missing or truncated file, shards that disagree, a budget too
small, an output folder that does not exist) is refused before training starts, and the index and
its sidecar are written under temporary names and renamed into place only once the index is known
to fit the budget: a failed build leaves an existing index untouched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cl_zoo.errors import DataError
from cl_zoo.fileio import atomic_path, atomic_write_json
from cl_zoo.index.evaluate import (
    RECALL_K,
    Evaluation,
    exact_neighbours,
    tune_and_measure,
)
from cl_zoo.index.fingerprint import embeddings_fingerprint, file_digest
from cl_zoo.index.memory import format_bytes, peak_rss_bytes
from cl_zoo.index.plan import MIN_POINTS_PER_LIST, IndexPlan, choose_index, plan_nlist
from cl_zoo.index.sidecar import IndexInfo, sidecar_path
from cl_zoo.index.source import DEFAULT_BLOCK_ROWS, EmbeddingSource, open_source
from cl_zoo.index.search import require_faiss
from cl_zoo.validation import check_seed

EVAL_QUERIES = 1_000
# PQ codebooks have 256 centroids per sub-quantizer; k-means wants 39 points per centroid.
PQ_MIN_TRAIN_ROWS = 256 * MIN_POINTS_PER_LIST
_TRAIN_POINTS_PER_LIST = 40
_MIN_TRAIN_ROWS = 1 << 16
# Copies of the training sample alive at once while faiss trains (see default_sample_size).
_TRAINING_COPIES = 4
# Copies of a block alive at once while adding (the rows, OPQ's rotated copy, IVF residuals):
# blocks are kept to a 16th of the budget so these stay small beside the index.
_BLOCK_BUDGET_SHARE = 16
_MIN_BLOCK_ROWS = 4_096

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    """A saved index: its description (also in the sidecar), the plan and the tuning trail."""

    info: IndexInfo
    plan: IndexPlan
    evaluation: Evaluation
    index_path: Path
    sidecar_path: Path


def default_sample_size(n: int, dim: int, max_memory_bytes: int) -> int:
    """Training rows: 40 per inverted list (at least 65,536 for PQ codebooks), within the budget.

    faiss's k-means wants 39+ points per centroid and gains little past 256; 40 keeps a million
    vectors' training to a few minutes on two cores. Training holds about four copies of the
    sample (the rows, OPQ's rotated copy, the IVF residuals, k-means buffers; measured), so the
    sample is capped at a quarter of the budget; it is freed before the index grows.
    """
    wanted = max(_TRAIN_POINTS_PER_LIST * plan_nlist(n), _MIN_TRAIN_ROWS)
    affordable = max(PQ_MIN_TRAIN_ROWS, max_memory_bytes // _TRAINING_COPIES // (dim * 4))
    return int(min(n, wanted, affordable))


def block_rows_for(dim: int, max_memory_bytes: int, block_rows: int = DEFAULT_BLOCK_ROWS) -> int:
    """Rows per block: ``block_rows``, fewer where a block would exceed a 16th of the budget."""
    return int(min(block_rows, max(_MIN_BLOCK_ROWS, max_memory_bytes // _BLOCK_BUDGET_SHARE // (dim * 4))))


def embeddings_fingerprint_of(source: EmbeddingSource) -> str:
    """The fingerprint ``search``/``dedup`` recompute from the embeddings a user names."""
    return embeddings_fingerprint(source.paths, source.location if source.location.is_dir() else None)


def build_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | EmbeddingSource,
    out_path: str | os.PathLike[str],
    max_memory_bytes: int,
    *,
    sample_size: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    eval_queries: int = EVAL_QUERIES,
) -> BuildResult:
    """Plan, train, fill, evaluate and save an index over ``source`` within ``max_memory_bytes``.

    ``source`` is a ``.npy`` file, a folder of ``emb_NNNNN.npy`` shards or a list of ``.npy``
    files. Writes ``out_path`` and ``out_path + ".json"`` (see :class:`IndexInfo`).
    """
    check_seed("--seed", seed)  # numpy refuses a negative one only after the source is opened
    faiss = require_faiss()
    say = progress or (lambda message: None)
    started = time.perf_counter()
    src = source if isinstance(source, EmbeddingSource) else open_source(source)
    n, dim = src.rows, src.dims
    out_path = Path(out_path)
    if not out_path.parent.is_dir():
        raise DataError(f"output folder does not exist: {out_path.parent}")
    if out_path.is_dir():
        raise DataError(f"output {out_path} is a folder; name the index file (e.g. {out_path / 'index.faiss'})")
    if sample_size is not None and sample_size < 1:
        raise DataError(f"--sample must be at least 1, got {sample_size}")
    block_rows = block_rows_for(dim, max_memory_bytes, block_rows)
    train_rows = min(n, sample_size) if sample_size else default_sample_size(n, dim, max_memory_bytes)
    plan = choose_index(n, dim, max_memory_bytes, train_rows=train_rows)
    if plan.kind == "opq-ivf-pq" and train_rows < PQ_MIN_TRAIN_ROWS:
        raise DataError(f"{plan.factory} needs at least {PQ_MIN_TRAIN_ROWS} training rows for its codebooks; --sample is {train_rows}")
    say(f"plan: {plan.factory} ({plan.reason})")
    fingerprint = embeddings_fingerprint_of(src)

    rng = np.random.default_rng(seed)
    needs_training = plan.kind in ("ivf-flat", "opq-ivf-pq")
    train_ids = np.sort(rng.choice(n, size=train_rows, replace=False)) if needs_training else np.zeros(0, np.int64)
    query_ids = held_out_queries(rng, n, train_ids, min(eval_queries, n))

    index = faiss.index_factory(dim, plan.factory, faiss.METRIC_INNER_PRODUCT)
    if needs_training:
        ivf = faiss.extract_index_ivf(index)
        ivf.cp.seed = seed  # k-means starts from the same centroids on every run with this seed
        if plan.kind == "opq-ivf-pq":
            shorten_opq_training(index, faiss)
        say(f"training on {train_rows} sampled rows ({format_bytes(train_rows * dim * 4)})")
        sample = src.take(train_ids, block_rows)
        index.train(sample)
        del sample
    added = 0
    for _, block in src.blocks(block_rows):
        index.add(block)
        added += len(block)
        say(f"added {added}/{n}")

    say(f"evaluating recall@{RECALL_K} on {len(query_ids)} queries against exact search")
    queries = src.take(query_ids, block_rows)
    truth = exact_neighbours(src, queries, RECALL_K + 1, block_rows)
    evaluation = tune_and_measure(index, plan.kind, queries, query_ids, truth, RECALL_K)
    return save_built_index(
        index, out_path, plan, evaluation,
        n=n, dim=dim, fingerprint=fingerprint, max_memory_bytes=max_memory_bytes, started=started,
        sources=[str(p.resolve()) for p in src.paths], sample_size=int(len(train_ids)), seed=seed,
        eval_queries=len(query_ids),
    )


# OPQ alternates PQ training and a rotation fit; faiss's 50 rounds on 65,536 rows take many minutes
# for 512-d vectors on two cores, while the rotation has mostly settled after a few rounds. The
# final codebooks get 10 k-means iterations on 64 points per centroid (faiss: 25 on 256), which
# costs a few points of recall at most and a tenth of the time with 2-dim sub-vectors.
OPQ_ITERATIONS = 8
OPQ_FIRST_PQ_ITERATIONS = 8
OPQ_TRAIN_ROWS = 1 << 14
PQ_ITERATIONS = 10
PQ_POINTS_PER_CENTROID = 64


def shorten_opq_training(index, faiss) -> None:  # noqa: ANN001 - faiss objects
    """Fewer OPQ rounds on fewer rows, shorter codebook k-means (see :data:`OPQ_ITERATIONS`)."""
    opq = faiss.downcast_VectorTransform(index.chain.at(0))
    opq.niter = OPQ_ITERATIONS
    opq.niter_pq_0 = OPQ_FIRST_PQ_ITERATIONS
    opq.max_train_points = OPQ_TRAIN_ROWS
    pq = faiss.downcast_index(index.index).pq
    pq.cp.niter = PQ_ITERATIONS
    pq.cp.max_points_per_centroid = PQ_POINTS_PER_CENTROID


def held_out_queries(rng: np.random.Generator, n: int, train_ids: np.ndarray, count: int) -> np.ndarray:
    """``count`` seeded rows for evaluation, outside the training sample when enough rows are."""
    pool = np.ones(n, bool)
    pool[train_ids] = False
    candidates = np.flatnonzero(pool) if pool.sum() >= count else np.arange(n)
    return np.sort(rng.choice(candidates, size=count, replace=False))


def save_built_index(
    index, out_path: Path, plan: IndexPlan, evaluation: Evaluation, *, n: int, dim: int, fingerprint: str,  # noqa: ANN001
    max_memory_bytes: int, started: float, sources: list[str], sample_size: int, seed: int, eval_queries: int,
) -> BuildResult:
    """Write the index and its sidecar atomically, refusing an index larger than the budget."""
    faiss = require_faiss()
    info_path = sidecar_path(out_path)
    with atomic_path(out_path, mkdir=False) as tmp:
        faiss.write_index(index, str(tmp))
        size = tmp.stat().st_size
        if size > max_memory_bytes:
            raise DataError(
                f"the built index is {format_bytes(size)}, over the {format_bytes(max_memory_bytes)} budget "
                f"(estimated {format_bytes(plan.estimated_bytes)}); nothing was written"
            )
        info = IndexInfo(
            factory=plan.factory, kind=plan.kind, n=n, dim=dim, fingerprint=fingerprint,
            max_memory_bytes=max_memory_bytes, index_bytes=size, index_digest=file_digest(tmp),
            search_params=evaluation.search_params, recall_at_10=round(evaluation.recall, 4),
            recall_target_met=evaluation.target_met, latency_ms=round(evaluation.latency_ms, 4),
            build_seconds=round(time.perf_counter() - started, 2), reason=plan.reason, nlist=plan.nlist,
            sources=sources, sample_size=sample_size, seed=seed, eval_queries=eval_queries,
            peak_rss_bytes=peak_rss_bytes(),
        )
        atomic_write_json(info_path, info.to_json(), mkdir=False)
    return BuildResult(info, plan, evaluation, out_path, info_path)


__all__ = ["BuildResult", "build_index", "default_sample_size", "embeddings_fingerprint_of"]
