"""Embeddings read block by block from one ``.npy`` or a folder of shards, never whole.

An index over a million 512-d vectors must not need the 2 GiB matrix in memory next to the index
it builds. Every file's header is checked first (float dtype, 2-D shape, and a file exactly as long
as the header says, so a truncated copy is refused before any row is read), then rows are read
through short-lived memory maps: a block is copied out and its map closed, so pages of the file
already read do not stay counted in this process's resident memory.

A folder of shards holds ``emb_00000.npy``, ``emb_00001.npy``, ... read in numeric order. A folder
with a ``manifest.json`` (what a sharded ``cl-zoo embed --out DIR/`` writes) is checked against it
first (:func:`cl_zoo.embedding.shards.open_shards`): a shard missing, truncated, replaced by one of
another run or model, or one the manifest does not list is refused in one line before any row is
read, and the manifest's shard list, not a directory listing, says which files are read. A folder
without a manifest (shards written by other tools) is read by name: the numbers must run from 0
without gaps and every shard must have the same number of dims.

:func:`open_rows` is what ``search``/``dedup`` with a saved index read: the row paths and the
metadata of a ``.npy``, ``.parquet`` or shard folder, with the features left on disk (streamed
through :class:`EmbeddingSource` where the format allows).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The .npy / path list / metadata readers are below both this package and embedding/ (cl_zoo.arrays);
# NpyFile, read_npy_header and check_recorded_shape are re-exported here, their old home.
from cl_zoo.arrays import (  # noqa: F401 - re-exported
    NpyFile,
    check_npy_output,
    check_recorded_shape,
    normalize,
    parquet_metadata,
    read_npy_header,
    read_npy_rows,
)
# A folder of shards with a manifest, and a parquet file read whole, are embedding's own outputs
# and readers.
from cl_zoo.embedding.files import load_embeddings
from cl_zoo.embedding.shards import MANIFEST_NAME, ShardSet, open_shards
from cl_zoo.errors import DataError
from cl_zoo.optional import require

SHARD_PATTERN = re.compile(r"^emb_(\d+)\.npy$")
DEFAULT_BLOCK_ROWS = 65_536


def shard_files(folder: str | os.PathLike[str]) -> list[Path]:
    """``emb_00000.npy``, ``emb_00001.npy``, ... of a shard folder, in numeric order, without gaps."""
    folder = Path(folder)
    numbered: dict[int, Path] = {}
    for entry in folder.iterdir():
        match = SHARD_PATTERN.match(entry.name)
        if match:
            number = int(match.group(1))
            if number in numbered:
                raise DataError(f"{folder} holds two shards numbered {number}: {numbered[number].name} and {entry.name}")
            numbered[number] = entry
    if not numbered:
        raise DataError(f"{folder} holds no embedding shards (emb_00000.npy, emb_00001.npy, ...)")
    order = sorted(numbered)
    if order != list(range(len(order))):
        missing = next(i for i in range(len(order) + 1) if i not in numbered)
        raise DataError(f"{folder} is missing shard number {missing} (it has {len(order)} shards up to number {order[-1]})")
    return [numbered[i] for i in order]


@dataclass(frozen=True)
class EmbeddingSource:
    """Rows of one or more checked ``.npy`` files, read as one matrix in order."""

    files: tuple[NpyFile, ...]
    location: Path  # what the user named: a file or a shard folder
    shards: ShardSet | None = field(default=None, compare=False)  # the checked manifest of a cl-zoo embed folder

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def dims(self) -> int:
        return self.files[0].dims

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.files]

    def blocks(self, block_rows: int = DEFAULT_BLOCK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, normalised float32 block)`` in order; blocks do not span files."""
        start = 0
        for file in self.files:
            for lo in range(0, file.rows, block_rows):
                block = file.read(lo, min(lo + block_rows, file.rows))
                yield start + lo, checked_normalized(block, start + lo, file.path)
            start += file.rows

    def take(self, rows: np.ndarray, block_rows: int = DEFAULT_BLOCK_ROWS) -> np.ndarray:
        """The normalised rows at the given global ids (any order), read a block window at a time."""
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        out = np.empty((len(rows), self.dims), np.float32)
        start = 0
        for file in self.files:
            for lo in range(0, file.rows, block_rows):
                hi = min(lo + block_rows, file.rows)
                a, b = np.searchsorted(ordered, [start + lo, start + hi])
                if a < b:
                    block = file.take(ordered[a:b] - start)
                    out[order[a:b]] = checked_normalized(block, int(ordered[a]), file.path)
            start += file.rows
        return out


def checked_normalized(block: np.ndarray, first_row: int, path: Path) -> np.ndarray:
    """Unit-norm rows; a NaN or infinite value is refused (faiss would index garbage)."""
    bad = ~np.isfinite(block).all(axis=1)
    if bad.any():
        raise DataError(f"{path} row {first_row + int(np.flatnonzero(bad)[0])} is not finite (NaN or inf); re-embed with a working model")
    return normalize(block)


def open_source(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> EmbeddingSource:
    """A ``.npy`` file, a folder of ``emb_NNNNN.npy`` shards, or a list of ``.npy`` files, all checked.

    Every header is read and checked against its file before any row is, and the shards must agree
    on dims; so a build never fails half-way through on a bad file. A folder with a
    ``manifest.json`` is a ``cl-zoo embed`` output and is read only as its manifest describes it
    (see the module docstring); a damaged or mixed folder is one :class:`DataError` line.
    """
    shards: ShardSet | None = None
    if isinstance(source, (str, os.PathLike)):
        location = Path(source)
        if location.is_dir() and (location / MANIFEST_NAME).exists():
            shards = open_shards(location)
            paths = shards.emb_files
        elif location.is_dir():
            paths = shard_files(location)
        elif location.is_file():
            if location.suffix.lower() != ".npy":
                raise DataError(f"{location}: an index is built from a .npy file or a folder of .npy shards")
            check_npy_output(location)  # its sidecars, when there, must be the ones committed with it
            paths = [location]
        else:
            raise DataError(f"embeddings file does not exist: {location}")
    else:
        paths = [Path(p) for p in source]
        if not paths:
            raise DataError("no embedding files given")
        location = paths[0].parent
    files = tuple(read_npy_header(p) for p in paths)
    for file in files[1:]:
        if file.dims != files[0].dims:
            raise DataError(f"shards disagree on dims: {files[0].path.name} has {files[0].dims}, {file.path.name} has {file.dims}")
    if not files:  # a manifest listing no shards
        raise DataError(f"{location} holds no embeddings (its {MANIFEST_NAME} lists no shards)")
    result = EmbeddingSource(files, location, shards)
    if result.rows == 0 or result.dims == 0:
        raise DataError(f"{location} holds no embeddings ({result.rows} rows of {result.dims} dims)")
    return result


@dataclass(frozen=True)
class SavedRows:
    """Saved embeddings without their features in memory: what a search through a saved index needs.

    ``search --index-file`` only turns row ids into paths, and ``dedup --index-file`` reads the
    features a block at a time through ``source``; neither needs the matrix in memory, which for a
    shard folder may not fit.
    """

    location: Path
    paths: list[str]
    metadata: dict[str, object]
    rows: int
    dims: int
    source: EmbeddingSource | None  # the features on disk; None for a .parquet (one table, read whole)


def open_rows(embeddings: str | os.PathLike[str]) -> SavedRows:
    """Row paths and metadata of a ``.npy``, a ``.parquet`` or a ``cl-zoo embed`` shard folder, checked.

    The same checks as :func:`cl_zoo.embedding.load_embeddings` that do not need the values: a
    folder against its manifest, a ``.npy`` header against its file and its path listing, the
    recorded count and dims against the data. Values (finiteness) are checked as blocks are read.
    """
    location = Path(embeddings)
    if location.is_dir():
        source = open_source(location)
        if source.shards is None:
            raise DataError(f"{location} has no {MANIFEST_NAME} naming its rows; search and dedup read the folder a cl-zoo embed --out DIR/ run writes")
        paths, meta = source.shards.paths(), source.shards.metadata
        if len(paths) != source.rows:
            raise DataError(f"{location}: its meta tables list {len(paths)} paths for {source.rows} embeddings")
        return SavedRows(location, paths, meta, source.rows, source.dims, source)
    if not location.is_file():
        raise DataError(f"embeddings file does not exist: {location}")
    suffix = location.suffix.lower()
    if suffix == ".parquet":
        return parquet_rows(location)
    if suffix != ".npy":
        raise DataError(f"{location}: embeddings must be a .npy or .parquet file, or a folder written by cl-zoo embed --out DIR/")
    rows = read_npy_rows(location)  # the reader cl_zoo.embedding.load_embeddings uses, values left on disk
    source = open_source(location)  # the same header, as a source to stream (refusing an empty one)
    return SavedRows(location, rows.paths, rows.metadata, source.rows, source.dims, source)


def parquet_rows(path: Path) -> SavedRows:
    """The ``path`` column and ``cl_zoo.*`` metadata of a ``cl-zoo embed`` parquet file, not its embeddings.

    Dims come from the column type (a fixed-size list, as ``cl-zoo embed`` writes) or the recorded
    ``dims``; a file recording neither is read whole by :func:`cl_zoo.embedding.load_embeddings`.
    """
    pa = require("pyarrow", f"reading {path.name}")
    import pyarrow.parquet as pq

    try:
        table_file = pq.ParquetFile(path)
        schema = table_file.schema_arrow
        if not {"path", "embedding"} <= set(schema.names):
            raise DataError(f"{path} has no 'path' and 'embedding' columns; was it written by cl-zoo embed?")
        column = table_file.read(columns=["path"]).column("path")
        kind = schema.field("embedding").type
        raw: dict[bytes, bytes] = dict(schema.metadata or {})
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure (ArrowInvalid, OSError, MemoryError...) is a bad file
        raise DataError(f"{path} is not a readable parquet file ({' '.join(str(exc).split())[:160]})") from None
    meta: dict[str, Any] = parquet_metadata(raw, path)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DataError(f"{path}: the 'path' column holds {column.type}, not strings")
    if column.null_count:
        raise DataError(f"{path}: the 'path' column has {column.null_count} empty (null) rows")
    if pa.types.is_fixed_size_list(kind):
        dims = int(kind.list_size)
    elif "dims" in meta:
        dims = int(meta["dims"])
    else:
        features, paths, whole = load_embeddings(path)
        return SavedRows(path, paths, whole, len(paths), int(features.shape[1]), None)
    try:
        paths = [str(p) for p in column.to_pylist()]
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: the 'path' column holds text that is not UTF-8 ({exc.reason})") from None
    check_recorded_shape(meta, len(paths), dims, path.name, path)
    if paths and dims < 1:
        raise DataError(f"{path} holds {len(paths)} rows of {dims} dims: no embeddings; re-embed with cl-zoo embed")
    return SavedRows(path, paths, meta, len(paths), dims, None)


__all__ = [
    "DEFAULT_BLOCK_ROWS",
    "EmbeddingSource",
    "NpyFile",
    "SavedRows",
    "open_rows",
    "open_source",
    "parquet_rows",
    "read_npy_header",
    "shard_files",
]
