"""A cheap identity for a set of embedding files, recorded with every index built from them.

A saved index used with other embeddings returns rows that mean nothing, silently. Hashing a
multi-gigabyte matrix on every search would cost more than the search, so the fingerprint covers
what changes whenever the embeddings do: each file's size, its first and last MiB, and the model
fields of its ``.meta.json`` (a re-embedding with another model keeps the size). It is not a
defence against deliberate tampering; it catches "index built from other embeddings".

For a shard folder written by ``cl-zoo embed --out DIR/`` the files are the ``emb`` shards its
``manifest.json`` lists, in order, and the manifest's model fields count once. The manifest's own
per-shard ``digest`` is :func:`cl_zoo.arrays.file_digest`, which this module uses too (shards are checked against it before an
index is built or used, see :func:`cl_zoo.embedding.shards.open_shards`), and a shard made by
another model is refused there by its model fingerprint, so the two checks agree on what "the
same embeddings" means.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from cl_zoo.arrays import EDGE_BYTES, file_digest, sidecar  # noqa: F401 - EDGE_BYTES, file_digest: re-exported
from cl_zoo.embedding.shards import MANIFEST_NAME
from cl_zoo.errors import ClZooError
from cl_zoo.fileio import MAX_EMBEDDINGS_META_BYTES, read_bounded_json

MODEL_FIELDS = ("model", "model_name", "revision")
MANIFEST = MANIFEST_NAME


def model_fields(meta_file: Path) -> dict[str, str]:
    """The model fields of a ``.meta.json`` / ``manifest.json``; {} when absent or unreadable."""
    try:
        meta = read_bounded_json(meta_file, MAX_EMBEDDINGS_META_BYTES, "embeddings metadata file")
    except ClZooError:
        return {}
    return {k: str(meta[k]) for k in MODEL_FIELDS if isinstance(meta, dict) and k in meta}


def embeddings_fingerprint(files: Sequence[str | os.PathLike[str]], folder: str | os.PathLike[str] | None = None) -> str:
    """``sha256:<hex>`` over every file's :func:`file_digest` and model fields, in order.

    ``folder`` is a shard folder whose ``manifest.json`` model fields count too.
    """
    h = hashlib.sha256()
    for path in map(Path, files):
        h.update(file_digest(path).encode())
        h.update(json.dumps(model_fields(sidecar(path, ".meta.json")), sort_keys=True).encode())
    if folder is not None:
        h.update(json.dumps(model_fields(Path(folder) / MANIFEST), sort_keys=True).encode())
    return "sha256:" + h.hexdigest()


__all__ = ["embeddings_fingerprint", "file_digest"]
