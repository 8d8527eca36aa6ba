"""Cosine-similarity search and near-duplicate grouping over saved embeddings (faiss).

Vectors are L2-normalised once, so inner product is cosine similarity and every index type
(exact ``flat``, inverted-file ``ivf``, graph ``hnsw``) ranks by the same score. Index files are
plain faiss files; loading one checks it against the embeddings it claims to index, because a
stale index silently returns the wrong rows.

This is the in-memory half of :mod:`cl_zoo.index` (``cl-zoo search`` and ``dedup`` without a saved
index, and the checks every saved index is opened with); its retired path ``cl_zoo.search`` still
imports, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cl_zoo.arrays import FALLBACK_DEDUP_THRESHOLD, normalize, recorded_threshold
import cl_zoo.checkpoint.hub as checkpoint_hub
from cl_zoo.embedding.reference import resolve_model_reference
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import MAX_CHECKPOINT_CONFIG_BYTES, atomic_path, read_bounded_json
from cl_zoo.optional import require
from cl_zoo.registry import get_pretrained

INDEX_KINDS = ("flat", "ivf", "hnsw")
# The widest HNSW search (efSearch) an index file or an index sidecar may ask for: far above the 1024
# cl-zoo index tunes up to, and a bound on the work one query can cost.
MAX_EF_SEARCH = 1 << 20


def require_faiss(feature: str = "similarity search (cl-zoo search, dedup, index)"):  # noqa: ANN201 - the faiss module
    """The faiss module, or a one-line error naming the extra that installs it."""
    return require("faiss", feature)


def default_nlist(n: int) -> int:
    # faiss wants ~39+ training points per list; sqrt(N) lists is the usual balance of recall/speed.
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


def build_index(
    features: np.ndarray,
    kind: str = "flat",
    *,
    nlist: int | None = None,
    nprobe: int | None = None,
    hnsw_m: int = 32,
    ef_search: int = 128,
):  # noqa: ANN201 - a faiss.Index
    """An inner-product index over the normalised ``features``."""
    faiss = require_faiss()
    x = normalize(features)
    n, d = x.shape
    if n == 0:
        raise DataError("cannot build an index over zero embeddings")
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "ivf":
        nlist = nlist or default_nlist(n)
        if nlist > n:
            raise ClZooError(f"--nlist {nlist} exceeds the number of embeddings ({n})")
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        index.nprobe = min(nlist, nprobe or 16)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = ef_search
    else:
        raise ClZooError(f"unknown index type {kind!r}; use one of {', '.join(INDEX_KINDS)}")
    index.add(x)
    return index


def save_index(index, path: str | os.PathLike[str]) -> Path:  # noqa: ANN001 - a faiss.Index
    """Write a faiss index atomically (temporary name in the same folder, then rename)."""
    faiss = require_faiss()
    final = Path(path)
    if not final.parent.is_dir():
        raise DataError(f"output folder does not exist: {final.parent}")
    with atomic_path(final, mkdir=False) as tmp:
        faiss.write_index(index, str(tmp))
    return final


# What reading an index may allocate beyond its file size: faiss objects, small tables, malloc arenas.
_INDEX_READ_SLACK = 512 << 20


@contextlib.contextmanager
def _address_space_limit(extra: int) -> Iterator[None]:
    """Let this process grow by at most ``extra`` bytes of address space inside the block.

    faiss sizes its arrays from counts in the file before reading them, so a damaged count makes
    it allocate (and zero) gigabytes from a few bytes, or fail with ``std::bad_alloc``. A
    temporary soft ``RLIMIT_AS`` turns any such claim into a ``MemoryError`` at once. Where the
    limit cannot be set (not Linux, or already lower), the block runs unbounded.
    """
    try:
        import resource

        with open("/proc/self/statm") as fh:
            current = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError, IndexError):
        yield
        return
    wanted = current + extra
    if soft != resource.RLIM_INFINITY and soft <= wanted or hard != resource.RLIM_INFINITY and hard < wanted:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def load_index(path: str | os.PathLike[str], *, count: int | None = None, dims: int | None = None):  # noqa: ANN201
    """Read a faiss index, refusing one built over a different set of embeddings.

    The file is untrusted input: faiss's own errors (``RuntimeError``), allocations its counts
    ask for beyond what the file can hold (``MemoryError``, bounded by :func:`_address_space_limit`)
    and the index it yields (a vector count and size that fit the file) all end as one
    :class:`DataError` line.
    """
    faiss = require_faiss()
    path = Path(path)
    if not path.is_file():
        raise DataError(f"index file does not exist: {path}")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{path} is not a faiss index (empty file)")
    index = read_faiss_file(path, size)
    problem = structure_problem(index, faiss, size)
    if problem:
        raise DataError(f"{path} is not a usable faiss index ({problem}); rebuild it (drop --load-index)")
    if count is not None and index.ntotal != count or dims is not None and index.d != dims:
        raise DataError(
            f"index {path} holds {index.ntotal} vectors of {index.d} dims but the embeddings have "
            f"{count} of {dims}; rebuild it (drop --load-index)"
        )
    problem = unit_norm_problem(index, faiss)
    if problem:
        raise DataError(f"index {path} refused: {problem}; build it over L2-normalised rows (as cl-zoo index does)")
    return index


# How far from 1 a stored vector's norm may be and still count as normalised (float32 rounding).
UNIT_NORM_TOLERANCE = 1e-3
NORM_SAMPLE = 256


def unit_norm_problem(index, faiss, sample: int = NORM_SAMPLE) -> str:  # noqa: ANN001 - faiss objects
    """Why ``index``'s inner products are not cosines, or "" when its stored vectors are unit-length.

    Every index cl-zoo builds holds normalised rows, so inner product is cosine. An index built
    elsewhere (autofaiss, a script) over raw rows ranks by inner product too, passes every
    structural check, and returns "cosines" of 20 in a different order; a sample of its stored
    vectors (spread over the whole index) tells the two apart. All-zero rows stay zero when
    normalised, so they pass.
    """
    vectors = stored_vectors(index, faiss, sample)
    if vectors is None or not len(vectors):
        return ""
    with np.errstate(invalid="ignore", over="ignore"):  # a damaged file's NaN or huge values count as off
        norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    off = norms[~(np.abs(norms - 1.0) <= UNIT_NORM_TOLERANCE) & (norms != 0.0)]
    if not len(off):
        return ""
    return (f"its vectors are not unit-length ({len(off)} of {len(norms)} sampled have norms {off.min():.4g} to "
            f"{off.max():.4g}), so its inner products are not cosines")


def stored_vectors(index, faiss, sample: int) -> np.ndarray | None:  # noqa: ANN001 - faiss objects
    """Up to ``sample`` of the vectors a flat, IVF-flat or HNSW-flat index stores, spread over it; None for others."""
    n = int(index.ntotal)
    ids = np.unique(np.linspace(0, n - 1, num=min(sample, n)).astype(np.int64)) if n else np.zeros(0, np.int64)
    if isinstance(index, faiss.IndexHNSWFlat):
        index = faiss.downcast_index(index.storage)
    if isinstance(index, faiss.IndexFlat):
        return np.stack([index.reconstruct(int(i)) for i in ids]) if len(ids) else np.zeros((0, index.d), np.float32)
    if isinstance(index, faiss.IndexIVFFlat):
        return _inverted_list_vectors(index, faiss, sample)
    return None


def _inverted_list_vectors(index, faiss, sample: int) -> np.ndarray:  # noqa: ANN001 - faiss objects
    """Up to ``sample`` vectors of an IVF-flat index, a few from each of its lists (no direct map needed)."""
    lists, d = index.invlists, int(index.d)
    sizes = [lists.list_size(i) for i in range(lists.nlist)]
    filled = [i for i, m in enumerate(sizes) if m]
    per_list = max(1, sample // max(1, len(filled)))
    chunks = []
    for i in filled[:sample]:
        m = min(sizes[i], per_list)
        codes = faiss.rev_swig_ptr(lists.get_codes(i), m * lists.code_size)
        chunks.append(np.frombuffer(bytes(codes), dtype=np.float32).reshape(m, d))
    return np.concatenate(chunks) if chunks else np.zeros((0, d), np.float32)


def read_faiss_file(path: Path, size: int):  # noqa: ANN201 - a faiss.Index
    """``faiss.read_index`` of an untrusted ``size``-byte file, its allocations bounded by the file.

    faiss's own errors and allocations its counts ask for beyond what the file can hold end as one
    :class:`DataError` line; the caller checks the structure of what comes back.
    """
    faiss = require_faiss()
    try:
        with _address_space_limit(4 * size + _INDEX_READ_SLACK):
            return faiss.read_index(str(path))
    except MemoryError:
        raise DataError(f"{path} is not a faiss index (its counts ask for more memory than a {size}-byte file can hold)") from None
    except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
        first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path} is not a faiss index ({first})") from None


def structure_problem(index, faiss, size: int) -> str:  # noqa: ANN001 - faiss objects
    """What makes a freshly read index unsafe to search, or "" when nothing does.

    faiss trusts the ids and offsets it reads; a graph link or list id past the end is an
    out-of-bounds read at search time (a crash, not an error). Only the index types ``--save-index``
    writes (flat, IVF-flat, HNSW-flat over inner product) are accepted, and their tables are checked
    against each other and against the file size.
    """
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        metric = "L2 distance" if index.metric_type == faiss.METRIC_L2 else f"faiss metric {index.metric_type}"
        return f"it ranks by {metric}, not by inner product (cosine)"
    n, d = int(index.ntotal), int(index.d)
    if d < 1 or n < 0 or n * d * 4 > size:
        return f"it claims {n} vectors of {d} dims in {size} bytes"
    if isinstance(index, faiss.IndexFlat):
        return ""
    if isinstance(index, faiss.IndexIVFFlat):
        quantizer = faiss.downcast_index(index.quantizer)
        if not isinstance(quantizer, faiss.IndexFlat) or quantizer.d != d or quantizer.ntotal != index.nlist:
            return "its coarse quantizer does not match its lists"
        return inverted_lists_problem(index, faiss)
    if isinstance(index, faiss.IndexHNSWFlat):
        graph = index.hnsw
        storage = faiss.downcast_index(index.storage)
        if not isinstance(storage, faiss.IndexFlat) or storage.ntotal != n or storage.d != d:
            return "its vector storage does not match the graph"
        levels = faiss.vector_to_array(graph.levels).astype(np.int64)
        offsets = faiss.vector_to_array(graph.offsets).astype(np.int64)
        cum = faiss.vector_to_array(graph.cum_nneighbor_per_level).astype(np.int64)
        neighbors = faiss.vector_to_array(graph.neighbors)
        if len(levels) != n or len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(neighbors):
            return "its graph tables disagree in size"
        if n and (levels.min() < 1 or levels.max() > len(cum) - 1 or levels.max() - 1 != graph.max_level):
            return "its graph levels are out of range"
        if n and not np.array_equal(np.diff(offsets), cum[levels]):
            return "its graph offsets do not match its levels"
        if not _ids_in_range(neighbors, n, allow=-1):
            return "its graph links name vectors that do not exist"
        if n and not 0 <= graph.entry_point < n or not 1 <= graph.efSearch <= MAX_EF_SEARCH:
            return "its graph entry point or search width is out of range"
        return ""
    return f"{type(index).__name__} is not a type cl-zoo writes"


def inverted_lists_problem(index, faiss) -> str:  # noqa: ANN001 - faiss objects
    """What is wrong with an IVF index's lists (sizes, ids, nprobe), or "" (see :func:`structure_problem`)."""
    n, lists = int(index.ntotal), index.invlists
    if lists is None or lists.nlist != index.nlist or lists.code_size != index.code_size:
        return "its inverted lists do not match the index"
    if not 1 <= index.nprobe <= index.nlist:
        return f"nprobe {index.nprobe} is outside 1..{index.nlist}"
    total = 0
    for i in range(lists.nlist):
        m = lists.list_size(i)
        total += m
        if total > n:
            break
        if m and not _ids_in_range(faiss.rev_swig_ptr(lists.get_ids(i), m), n):
            return f"list {i} names vectors that do not exist"
    return "" if total == n else f"its lists hold {total} vectors, not {n}"


def _ids_in_range(ids: np.ndarray, n: int, allow: int | None = None) -> bool:
    ids = np.asarray(ids)
    ok = (ids >= 0) & (ids < n)
    if allow is not None:
        ok |= ids == allow
    return bool(ok.all())


def search(index, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Top-``k`` cosine similarities and row ids per query (-1 ids pad short result lists)."""
    if k < 1:
        raise ClZooError(f"k must be at least 1, got {k}")
    q = normalize(queries)
    if q.shape[1] != index.d:
        raise DataError(f"queries have {q.shape[1]} dims but the index has {index.d}; embed them with the same model")
    scores, ids = index.search(q, min(k, index.ntotal))
    return scores, ids


def similar_pairs(features: np.ndarray, threshold: float, block: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs ``i < j`` with cosine similarity >= ``threshold`` (exact, flat range search)."""
    faiss = require_faiss()
    x = normalize(features)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    # faiss keeps inner products strictly above the radius; nudge it so ">=" holds for the threshold.
    radius = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    rows, cols, sims = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]  # zero rows: no pairs
    for start in range(0, len(x), block):
        lims, dist, labels = index.range_search(x[start : start + block], radius)
        q = np.repeat(np.arange(start, start + len(lims) - 1), np.diff(lims.astype(np.int64)))
        keep = labels > q
        rows.append(q[keep])
        cols.append(labels[keep])
        sims.append(dist[keep])
    return (
        np.concatenate(rows).astype(np.int64),
        np.concatenate(cols).astype(np.int64),
        np.concatenate(sims).astype(np.float32),
    )


def nearest_neighbour_scores(features: np.ndarray, block: int = 4096) -> np.ndarray:
    """Each row's cosine similarity to its most similar *other* row (exact), float32 ``[N]``.

    Their distribution is what a dedup threshold cuts: copies pile up near 1, distinct images
    below; ``cl-zoo dedup --show-scores`` prints it as a histogram.
    """
    faiss = require_faiss()
    x = normalize(features)
    if len(x) < 2:
        return np.zeros(0, np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    best = np.empty(len(x), np.float32)
    for start in range(0, len(x), block):
        scores, ids = index.search(x[start : start + block], 2)
        own = ids == np.arange(start, start + len(ids))[:, None]
        # The row itself is normally first; with exact copies it may come second, so drop it by id.
        best[start : start + len(ids)] = np.where(own[:, 0], scores[:, 1], scores[:, 0])
    return best


def dedup_threshold_for(meta: dict[str, str], embeddings: str | os.PathLike[str] | None = None) -> tuple[float, str]:
    """The default dedup threshold for embeddings with this metadata, and where it came from.

    In order: the calibrated threshold recorded with the embeddings (``cl-zoo embed`` copies it
    from the model's config); the one in the model's own ``config.json`` when the model is a local
    folder or a bundled name (embeddings written before thresholds were recorded); otherwise
    :data:`~cl_zoo.arrays.FALLBACK_DEDUP_THRESHOLD`, which only groups near-identical
    images.
    """
    try:
        value = float(meta.get("dedup_threshold", ""))
        if -1.0 <= value <= 1.0:
            return value, f"calibrated for {meta.get('model_name') or 'the model'}"
    except (TypeError, ValueError):
        pass
    folder = _model_folder(meta, embeddings)
    if folder is not None:
        try:
            value = recorded_threshold(read_bounded_json(folder / "config.json", MAX_CHECKPOINT_CONFIG_BYTES, "checkpoint config"))
        except ClZooError:
            value = None
        if value is not None:
            return value, f"calibrated for {meta.get('model_name') or folder.name}"
    return FALLBACK_DEDUP_THRESHOLD, "no calibrated threshold recorded for the model; the safe default"


def _model_folder(meta: dict[str, str], embeddings: str | os.PathLike[str] | None) -> Path | None:
    """The local checkpoint folder the embeddings' model came from, without loading it."""
    spec = resolve_model_reference(meta, embeddings or ".")
    if spec and Path(spec).is_dir():
        return Path(spec)
    if spec and Path(spec).is_file():
        return Path(spec).parent
    try:
        bundled = get_pretrained(spec).cfg.bundled if spec else None
        return checkpoint_hub.find_bundled(bundled) if bundled else None
    except Exception:  # noqa: BLE001 - an unknown or remote model simply has no local config
        return None


def dedup_groups(features: np.ndarray, threshold: float = 0.99) -> list[list[int]]:
    """Connected groups (size >= 2) of rows linked by similarity >= ``threshold``.

    The default only links near-identical images; a model's calibrated threshold (see
    :func:`dedup_threshold_for`) is usually the better choice.

    Linking is transitive (union-find over the pairs), so a chain a~b~c forms one group even if
    a and c are further apart; groups and their members come in row order.
    """
    if not -1.0 <= threshold <= 1.0:
        raise ClZooError(f"threshold is a cosine similarity in [-1, 1], got {threshold}")
    rows, cols, _ = similar_pairs(features, threshold)
    return groups_from_pairs(len(features), rows, cols)


def groups_from_pairs(n: int, rows: np.ndarray, cols: np.ndarray) -> list[list[int]]:
    """Connected groups (size >= 2) of ``n`` rows linked by the pairs ``(rows[i], cols[i])``.

    Shared by exact dedup (:func:`dedup_groups`) and dedup through a saved approximate index
    (:mod:`cl_zoo.index`), so both group the same pairs the same way: union-find, groups and
    their members in row order.
    """
    parent = np.arange(n)

    def find(i: int) -> int:
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:
            parent[i], i = root, parent[i]
        return int(root)

    for i, j in zip(rows.tolist(), cols.tolist()):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])


__all__ = [
    "INDEX_KINDS",
    "build_index",
    "dedup_groups",
    "dedup_threshold_for",
    "default_nlist",
    "groups_from_pairs",
    "inverted_lists_problem",
    "load_index",
    "nearest_neighbour_scores",
    "normalize",
    "read_faiss_file",
    "require_faiss",
    "save_index",
    "search",
    "similar_pairs",
    "structure_problem",
    "unit_norm_problem",
]
