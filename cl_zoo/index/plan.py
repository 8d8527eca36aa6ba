"""Which faiss index to build for N vectors of D dims under a memory budget.

The rule is autofaiss's (``autofaiss/external/optimize.py``, ``get_optimal_index_keys_v2`` and
``get_optimal_quantization``, version 2.18.0), which follows the faiss wiki's "Guidelines to
choose an index", reimplemented here rather than depended on (autofaiss pins its own stack):

* fewer than 1,000 vectors: ``Flat`` (exact search is as fast as anything at that size);
* fewer than 10,000: an HNSW graph (too few vectors to train a quantizer), ``Flat`` when the
  graph does not fit;
* an ``HNSW32`` graph when the vectors plus graph links (``N * (4D + 2*32*4)`` bytes) fit the
  budget: the best speed/recall trade-off there is;
* an inverted file over raw vectors, ``IVF{nlist},Flat``, up to about 1,000,000 vectors when
  ``N * 4D`` plus the centroids fit;
* otherwise product quantization, ``OPQ{m}_{D'},IVF{nlist}[_HNSW32],PQ{m}x8``: ``m`` is the
  largest of 256, 128, 64, 48, 32, 24, 16, 8, 4 below D whose codes (``m`` bytes plus an 8-byte
  id per vector) fit the budget; the coarse quantizer is itself an HNSW graph from 1,000 lists on.

Deviations, each for a reason: the graph is always M=32 (autofaiss narrows M to fit, or uses 15
below 10k vectors; one M keeps one set of search parameters and estimates); HNSW is only chosen up
to :data:`HNSW_MAX_VECTORS` vectors, because graph insertion on a few CPU cores takes tens of
minutes beyond that while IVF trains in one; IVF-Flat is taken up to and *including* 1,000,000
vectors (autofaiss: strictly below), so a round million that fits keeps exact scores; ``nlist`` is
``4*sqrt(N)`` (autofaiss rounds it to a power of two, and jumps to 16,384+ lists from 1M vectors,
which take hours to train on a CPU), bounded so every list gets 39 training points; OPQ's output
dimension ``D'`` is D rounded up to a multiple of ``m`` (autofaiss's ``(min(D//m, 6)+1)*m`` can
drop dimensions); the PQ codes skip faiss's polysemous training (``PQ{m}x8np``: it only serves
Hamming-threshold search, which autofaiss also turns off with ``ht=2048``), and OPQ runs 8
alternations on at most 16,384 rows instead of 50 on 65,536 (see :mod:`cl_zoo.index.build`).
Estimates count what faiss stores, including the OPQ matrix and the PQ codebooks
autofaiss neglects, so a plan that fits here fits on disk and in memory.

Vectors are L2-normalised and compared by inner product (cosine), as in :mod:`cl_zoo.index.search`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cl_zoo.errors import DataError
from cl_zoo.index.memory import format_bytes

FLAT_MAX_VECTORS = 1_000
QUANTIZATION_MIN_VECTORS = 10_000
HNSW_MAX_VECTORS = 250_000
IVF_FLAT_MAX_VECTORS = 1_000_000
HNSW_M = 32
PQ_CODE_SIZES = (256, 128, 64, 48, 32, 24, 16, 8, 4)
# Coarse quantizers of this many lists or more are searched through an HNSW graph (autofaiss).
HNSW_QUANTIZER_MIN_LISTS = 1_000
# faiss warns below 39 training points per centroid; k-means is poor below that.
MIN_POINTS_PER_LIST = 39
# Per inverted list: the two std::vectors and their bookkeeping.
_LIST_OVERHEAD = 64
# Headers, small tables, the factory's own objects.
_FIXED_OVERHEAD = 64 << 10
_ID_BYTES = 8


@dataclass(frozen=True)
class IndexPlan:
    """A chosen index: what to build, why, and what it will weigh."""

    factory: str  # faiss.index_factory string
    kind: str  # "flat", "hnsw", "ivf-flat" or "opq-ivf-pq"
    nlist: int  # inverted lists (0 where there are none)
    estimated_bytes: int
    reason: str
    pq_bytes: int = 0  # bytes per vector code (PQ only)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def plan_nlist(n: int, train_rows: int | None = None) -> int:
    """About ``4*sqrt(n)`` lists, at most one per 39 training rows (and at least one)."""
    rows = n if train_rows is None else min(n, train_rows)
    return max(1, min(int(round(4 * math.sqrt(n))), rows // MIN_POINTS_PER_LIST))


def flat_bytes(n: int, dim: int) -> int:
    return n * dim * 4 + _FIXED_OVERHEAD


def hnsw_bytes(n: int, dim: int, m: int = HNSW_M) -> int:
    """Raw vectors plus graph links: 2M on level 0, about M/(M-1) above it, and 12 bytes of tables."""
    links = 2 * m + 2
    return n * (dim * 4 + links * 4 + 12) + _FIXED_OVERHEAD


def ivf_flat_bytes(n: int, dim: int, nlist: int) -> int:
    return n * (dim * 4 + _ID_BYTES) + nlist * (dim * 4 + _LIST_OVERHEAD) + _FIXED_OVERHEAD


def opq_dim(dim: int, pq_bytes: int) -> int:
    """OPQ's output dimension: ``dim`` rounded up to a multiple of the number of sub-quantizers."""
    return -(-dim // pq_bytes) * pq_bytes


def ivf_pq_bytes(n: int, dim: int, nlist: int, pq_bytes: int) -> int:
    """Codes and ids, centroids (and their HNSW graph), the OPQ rotation and the PQ codebooks."""
    out = opq_dim(dim, pq_bytes)
    size = n * (pq_bytes + _ID_BYTES) + nlist * (out * 4 + _LIST_OVERHEAD)
    if nlist >= HNSW_QUANTIZER_MIN_LISTS:
        size += hnsw_bytes(nlist, 0) - _FIXED_OVERHEAD  # graph only; the vectors are counted above
    size += dim * out * 4 + out * 4  # OPQ matrix and bias
    size += 256 * out * 4  # 8-bit PQ codebooks: 256 centroids per sub-quantizer
    return size + _FIXED_OVERHEAD


def ivf_pq_factory(dim: int, nlist: int, pq_bytes: int) -> str:
    coarse = f"IVF{nlist}_HNSW{HNSW_M}" if nlist >= HNSW_QUANTIZER_MIN_LISTS else f"IVF{nlist}"
    # "np": no polysemous training, a slow annealing that only pays with Hamming-threshold search.
    return f"OPQ{pq_bytes}_{opq_dim(dim, pq_bytes)},{coarse},PQ{pq_bytes}x8np"


def choose_index(n: int, dim: int, max_memory_bytes: int, *, train_rows: int | None = None) -> IndexPlan:
    """The index autofaiss's rule picks for ``n`` x ``dim`` vectors in ``max_memory_bytes``.

    ``train_rows`` (default ``n``) bounds the number of inverted lists, which each need 39
    training points. Raises :class:`DataError` when not even the most compressed index fits.
    """
    if n < 1 or dim < 1:
        raise DataError(f"cannot index {n} vectors of {dim} dims")
    if max_memory_bytes < 1:
        raise DataError(f"the memory budget must be positive, got {max_memory_bytes} bytes")
    budget = format_bytes(max_memory_bytes)
    flat = flat_bytes(n, dim)
    if n < FLAT_MAX_VECTORS and flat <= max_memory_bytes:
        return IndexPlan("Flat", "flat", 0, flat, f"{n} < {FLAT_MAX_VECTORS} vectors: exact search is as fast as any index")
    hnsw = hnsw_bytes(n, dim)
    if n < QUANTIZATION_MIN_VECTORS:
        if hnsw <= max_memory_bytes:
            return IndexPlan(f"HNSW{HNSW_M}", "hnsw", 0, hnsw, f"{n} < {QUANTIZATION_MIN_VECTORS} vectors, too few to train a quantizer; vectors + graph ({format_bytes(hnsw)}) fit {budget}")
        if flat <= max_memory_bytes:
            return IndexPlan("Flat", "flat", 0, flat, f"{n} < {QUANTIZATION_MIN_VECTORS} vectors, too few to train a quantizer; the HNSW graph ({format_bytes(hnsw)}) does not fit {budget}, raw vectors do")
        raise DataError(
            f"a {budget} budget is too small for {n} vectors of {dim} dims: raw vectors need {format_bytes(flat)} "
            f"and fewer than {QUANTIZATION_MIN_VECTORS} vectors cannot train a compressed index"
        )
    if n <= HNSW_MAX_VECTORS and hnsw <= max_memory_bytes:
        return IndexPlan(f"HNSW{HNSW_M}", "hnsw", 0, hnsw, f"vectors + HNSW{HNSW_M} graph ({format_bytes(hnsw)}) fit {budget}: the best recall per query time")
    nlist = plan_nlist(n, train_rows)
    ivf = ivf_flat_bytes(n, dim, nlist)
    why_not_hnsw = (
        f"{n} > {HNSW_MAX_VECTORS} vectors (graph building too slow on CPU)" if n > HNSW_MAX_VECTORS
        else f"the HNSW graph ({format_bytes(hnsw)}) does not fit {budget}"
    )
    if n <= IVF_FLAT_MAX_VECTORS and ivf <= max_memory_bytes:
        return IndexPlan(f"IVF{nlist},Flat", "ivf-flat", nlist, ivf, f"{why_not_hnsw}; raw vectors in {nlist} inverted lists ({format_bytes(ivf)}) fit {budget}")
    why_not_ivf = (
        f"{n} > {IVF_FLAT_MAX_VECTORS} vectors" if n > IVF_FLAT_MAX_VECTORS
        else f"raw vectors ({format_bytes(ivf)}) do not fit {budget}"
    )
    for pq_bytes in PQ_CODE_SIZES:
        if pq_bytes >= dim:
            continue
        size = ivf_pq_bytes(n, dim, nlist, pq_bytes)
        if size <= max_memory_bytes:
            return IndexPlan(
                ivf_pq_factory(dim, nlist, pq_bytes), "opq-ivf-pq", nlist, size,
                f"{why_not_hnsw}; {why_not_ivf}; {pq_bytes}-byte PQ codes ({format_bytes(size)}) are the largest that fit {budget}",
                pq_bytes,
            )
    smallest = min(p for p in PQ_CODE_SIZES if p < dim) if dim > min(PQ_CODE_SIZES) else None
    if smallest is None:
        raise DataError(f"{dim}-dim vectors are too short to compress and raw vectors ({format_bytes(flat)}) do not fit {budget}")
    need = ivf_pq_bytes(n, dim, nlist, smallest)
    raise DataError(
        f"a {budget} budget is too small for {n} vectors of {dim} dims: even the most compressed index "
        f"({ivf_pq_factory(dim, nlist, smallest)}) needs {format_bytes(need)}; raise --max-memory"
    )


__all__ = [
    "FLAT_MAX_VECTORS",
    "HNSW_M",
    "HNSW_MAX_VECTORS",
    "IVF_FLAT_MAX_VECTORS",
    "PQ_CODE_SIZES",
    "QUANTIZATION_MIN_VECTORS",
    "IndexPlan",
    "choose_index",
    "plan_nlist",
]
