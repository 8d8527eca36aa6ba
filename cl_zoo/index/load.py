"""Open a saved index for the embeddings a user names, refusing one built from other embeddings.

An index written by ``cl-zoo index`` has a sidecar (:mod:`cl_zoo.index.sidecar`); the index file
must be the one the sidecar describes, the embeddings must have the fingerprint it records, and the
index file, which is untrusted input like any other, is read under the same memory bound and
structure checks as :func:`cl_zoo.index.search.load_index`, extended to the OPQ + IVF-PQ indexes built
for tight budgets. An index without a sidecar (``cl-zoo search --save-index``) goes through
:func:`cl_zoo.index.search.load_index` as before.

The fingerprint is recomputed exactly as the build computed it
(:func:`cl_zoo.index.build.embeddings_fingerprint_of`), so a shard folder is checked against its
manifest (:func:`cl_zoo.index.source.open_source`) before its fingerprint is taken.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cl_zoo.errors import DataError
from cl_zoo.index.build import embeddings_fingerprint_of
from cl_zoo.index.evaluate import apply_params
from cl_zoo.index.fingerprint import embeddings_fingerprint, file_digest
from cl_zoo.index.sidecar import IndexInfo, read_info, sidecar_path
from cl_zoo.index.source import EmbeddingSource, open_source
from cl_zoo.index.search import (
    MAX_EF_SEARCH,
    inverted_lists_problem,
    load_index,
    read_faiss_file,
    require_faiss,
    structure_problem,
)

_PARAM = re.compile(r"^(nprobe|efSearch|quantizer_efSearch)=(\d{1,7})$")


def load_saved_index(
    index_path: str | os.PathLike[str],
    embeddings: str | os.PathLike[str],
    *,
    count: int,
    dims: int,
    source: EmbeddingSource | None = None,
):  # noqa: ANN201 - (faiss.Index, IndexInfo | None)
    """``(index, info)`` for searching ``embeddings`` (``count`` x ``dims``) with ``index_path``.

    ``info`` is None for an index without a sidecar. The sidecar's search parameters are set on
    the index. ``source`` is ``embeddings`` already opened (:func:`open_source`), which spares a
    shard folder a second check against its manifest. Every refusal is one :class:`DataError` line.
    """
    index_path = Path(index_path)
    if not index_path.is_file():
        raise DataError(f"index file does not exist: {index_path}")
    info = read_info(index_path)
    if info is None:
        return load_index(index_path, count=count, dims=dims), None
    rebuild = f"rebuild it: cl-zoo index {embeddings} --out {index_path}"
    if file_digest(index_path) != info.index_digest:
        raise DataError(f"{index_path} is not the index {sidecar_path(index_path).name} describes (the two were separated or one was changed); {rebuild}")
    location = Path(embeddings)
    if location.is_dir():
        fingerprint = embeddings_fingerprint_of(source if source is not None else open_source(location))
    elif location.is_file():
        fingerprint = embeddings_fingerprint([location])  # what the build records for one .npy
    else:
        fingerprint = ""
    if fingerprint != info.fingerprint:
        raise DataError(f"index {index_path} was built from other embeddings than {embeddings} (fingerprint mismatch); {rebuild}")
    if info.n != count or info.dim != dims:
        raise DataError(f"index {index_path} holds {info.n} vectors of {info.dim} dims but {embeddings} has {count} of {dims}; {rebuild}")
    index = read_checked(index_path, info)
    params = checked_params(info.search_params, index_path, index)
    try:
        apply_params(index, params)
    except RuntimeError:
        raise DataError(f"{sidecar_path(index_path)}: search parameters {params!r} do not apply to a {info.factory} index; {rebuild}") from None
    return index, info


def checked_params(params: str, index_path: Path, index=None) -> str:  # noqa: ANN001 - a faiss.Index
    """The sidecar's search parameters, if they are the few names cl-zoo writes with values inside the
    caps the index file itself is held to (:func:`cl_zoo.index.search.structure_problem`): ``efSearch`` and
    ``quantizer_efSearch`` in 1..:data:`~cl_zoo.index.search.MAX_EF_SEARCH`, ``nprobe`` in 1..nlist of
    ``index``. A sidecar is as untrusted as the file: ``efSearch=9999999`` turned a 9 s dedup into
    minutes, ``nprobe=0`` ended in a faiss traceback.
    """
    if not params:
        return params
    where = f"{sidecar_path(index_path)}: search parameter"
    for part in params.split(","):
        match = _PARAM.match(part)
        if not match:
            raise DataError(f"{sidecar_path(index_path)}: unknown search parameters {params[:80]!r}; rebuild the index with cl-zoo index")
        name, value = match.group(1), int(match.group(2))
        top = _nlist(index) if name == "nprobe" else MAX_EF_SEARCH
        if top is not None and not 1 <= value <= top:
            raise DataError(f"{where} {name}={value} is outside 1..{top}; rebuild the index with cl-zoo index")
    return params


def _nlist(index) -> int | None:  # noqa: ANN001 - a faiss.Index
    """The number of inverted lists of an IVF index (inside a pre-transform too); None when it has none."""
    if index is None:
        return None
    faiss = require_faiss()
    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        return 0  # not an IVF index: no nprobe is valid


def read_checked(index_path: Path, info: IndexInfo):  # noqa: ANN201 - a faiss.Index
    """Read the index file under a memory bound and check its tables before any search."""
    faiss = require_faiss()
    size = index_path.stat().st_size
    index = read_faiss_file(index_path, size)
    if isinstance(index, faiss.IndexPreTransform):
        problem = pq_structure_problem(index, faiss, size)
    else:
        problem = structure_problem(index, faiss, size)
    if not problem and (index.ntotal != info.n or index.d != info.dim):
        problem = f"it holds {index.ntotal} vectors of {index.d} dims, its description says {info.n} of {info.dim}"
    if problem:
        raise DataError(f"{index_path} is not a usable faiss index ({problem}); rebuild it with cl-zoo index")
    return index


def pq_structure_problem(index, faiss, size: int) -> str:  # noqa: ANN001 - faiss objects
    """The checks of :func:`cl_zoo.index.search.structure_problem` for ``OPQ,IVF[_HNSW],PQ`` indexes."""
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        return "it does not rank by inner product (cosine)"
    if index.chain.size() != 1:
        return "it has an unexpected chain of transforms"
    transform = faiss.downcast_VectorTransform(index.chain.at(0))
    if not isinstance(transform, faiss.LinearTransform) or not transform.is_trained:
        return "its transform is not a trained rotation"
    d_in, d_out = int(transform.d_in), int(transform.d_out)
    if d_in != index.d or d_out < 1 or faiss.vector_to_array(transform.A).size != d_in * d_out or d_in * d_out * 4 > size:
        return "its rotation matrix does not match its dims"
    ivf = faiss.downcast_index(index.index)
    if not isinstance(ivf, faiss.IndexIVFPQ) or ivf.metric_type != faiss.METRIC_INNER_PRODUCT:
        return f"{type(ivf).__name__} is not a type cl-zoo writes"
    n = int(ivf.ntotal)
    pq = ivf.pq
    if ivf.d != d_out or pq.d != d_out or pq.nbits != 8 or pq.M < 1 or pq.M * pq.dsub != pq.d or pq.code_size != ivf.code_size:
        return "its product quantizer does not match its dims"
    if faiss.vector_to_array(pq.centroids).size != pq.M * pq.ksub * pq.dsub or n != index.ntotal or n * pq.code_size > size:
        return f"it claims {n} codes of {pq.code_size} bytes in {size} bytes"
    quantizer = faiss.downcast_index(ivf.quantizer)
    if not isinstance(quantizer, (faiss.IndexFlat, faiss.IndexHNSWFlat)) or quantizer.d != d_out or quantizer.ntotal != ivf.nlist:
        return "its coarse quantizer does not match its lists"
    return structure_problem(quantizer, faiss, size) or inverted_lists_problem(ivf, faiss)


__all__ = ["load_saved_index"]
