"""Embeddings read block by block from one ``.npy`` or a folder of shards, never whole.

An index over a million 512-d vectors must not need the 2 GiB matrix in memory next to the index
it builds. Every file's header is checked first (float dtype, 2-D shape, and a file exactly as long
as the header says, so a truncated copy is refused before any row is read), then rows are read
through short-lived memory maps: a block is copied out and its map closed, so pages of the file
already read do not stay counted in this process's resident memory.

A folder of shards holds ``emb_00000.npy``, ``emb_00001.npy``, ... read in numeric order (what a
sharded ``cl-zoo embed`` writes, beside a ``manifest.json``); the numbers must run from 0 without
gaps and every shard must have the same number of dims.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cl_zoo.errors import DataError
from cl_zoo.search import normalize

SHARD_PATTERN = re.compile(r"^emb_(\d+)\.npy$")
DEFAULT_BLOCK_ROWS = 65_536


@dataclass(frozen=True)
class NpyFile:
    """One checked ``.npy`` file: where its rows start and how they are laid out."""

    path: Path
    rows: int
    dims: int
    dtype: np.dtype
    offset: int  # bytes before the first value
    fortran: bool

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as float32, through a map of this file closed before returning."""
        data = np.load(self.path, mmap_mode="r", allow_pickle=False)
        try:
            return np.array(data[start:stop], dtype=np.float32, order="C")
        finally:
            del data  # unmaps: the pages read stop counting as this process's memory

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The given (sorted) rows as float32."""
        data = np.load(self.path, mmap_mode="r", allow_pickle=False)
        try:
            return np.array(data[rows], dtype=np.float32, order="C")
        finally:
            del data


def read_npy_header(path: str | os.PathLike[str]) -> NpyFile:
    """Check a ``.npy`` header against the file before reading a single value.

    The header is a few bytes of text; trusting it would let a truncated or damaged file fail
    half-way through a long build, or map an object array. So: float dtype, two non-negative
    sizes, and the file exactly as long as the header says.
    """
    path = Path(path)
    fmt = np.lib.format
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            major, _ = fmt.read_magic(fh)
            if major == 1:
                shape, fortran, dtype = fmt.read_array_header_1_0(fh)
            elif major in (2, 3):
                shape, fortran, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy format version {major}")
            offset = fh.tell()
    except FileNotFoundError:
        raise DataError(f"embeddings file does not exist: {path}") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - numpy raises ValueError, SyntaxError, EOFError... on bad headers
        raise DataError(f"{path} is not a readable .npy file ({' '.join(str(exc).split())[:160]})") from None
    if dtype.kind != "f" or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise DataError(f"{path} holds {dtype} values, not floating-point embeddings")
    if len(shape) != 2 or any(not isinstance(n, int) or n < 0 for n in shape):
        raise DataError(f"{path} has shape {shape}; embeddings are a 2-D array (rows x dims)")
    expected = offset + shape[0] * shape[1] * dtype.itemsize
    if expected != size:
        what = "truncated" if size < expected else "longer than its header says"
        raise DataError(f"{path} is {what}: {size} bytes, but its header describes a {shape[0]}x{shape[1]} {dtype} array ({expected} bytes)")
    return NpyFile(path, int(shape[0]), int(shape[1]), dtype, offset, bool(fortran))


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
    on dims; so a build never fails half-way through on a bad file.
    """
    if isinstance(source, (str, os.PathLike)):
        location = Path(source)
        if location.is_dir():
            paths = shard_files(location)
        elif location.is_file():
            if location.suffix.lower() != ".npy":
                raise DataError(f"{location}: an index is built from a .npy file or a folder of .npy shards")
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
    result = EmbeddingSource(files, location)
    if result.rows == 0 or result.dims == 0:
        raise DataError(f"{location} holds no embeddings ({result.rows} rows of {result.dims} dims)")
    return result


__all__ = ["DEFAULT_BLOCK_ROWS", "EmbeddingSource", "NpyFile", "open_source", "read_npy_header", "shard_files"]
