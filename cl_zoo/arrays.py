"""Saved embeddings as read from disk: the ``.npy`` header, the row path list, the metadata sidecar.

Both the embedding writer (:mod:`cl_zoo.embedding`: resuming, checking its own shards, loading an
output back) and the index (:mod:`cl_zoo.index`: building from, searching and deduplicating saved
embeddings) read the same files, so the readers live here, below both, and neither imports the
other for them. Only numpy, the standard library and cl-zoo's leaf modules (errors, fileio, text)
are imported.

Everything read is untrusted (outputs get copied, truncated, replaced): a ``.npy`` header is checked
against its file before a value is read, a path list is parsed strictly, metadata fields must have
their recorded types, and any mismatch between the three is one :class:`DataError` line.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cl_zoo.errors import DataError
from cl_zoo.fileio import MAX_EMBEDDINGS_META_BYTES, read_bounded_json, read_head, sha256_file
from cl_zoo.text import one_line, parse_json_lines

__all__ = [
    "ARRAY_DIGEST_KEY",
    "CONFIG_KEY",
    "CSV_SIDECAR",
    "EDGE_BYTES",
    "FALLBACK_DEDUP_THRESHOLD",
    "LEGACY_PATHS_SIDECAR",
    "META_SIDECAR",
    "PATHS_DIGEST_KEY",
    "PATHS_SIDECAR",
    "ROW_TABLE_HEAD",
    "NpyFile",
    "NpyRows",
    "check_committed_together",
    "check_npy_output",
    "check_recorded_shape",
    "checked_metadata",
    "csv_with_header",
    "file_digest",
    "normalize",
    "old_row_table",
    "parquet_metadata",
    "path_listing",
    "read_metadata",
    "read_npy_features",
    "read_npy_header",
    "read_npy_rows",
    "read_path_list",
    "recorded_threshold",
    "sidecar",
]

# --------------------------------------------------------------------------------------------------
# Sidecar names beside a .npy output
# --------------------------------------------------------------------------------------------------

PATHS_SIDECAR = ".paths.jsonl"
LEGACY_PATHS_SIDECAR = ".paths.txt"
# The index,path row table earlier versions wrote beside a .npy: read when nothing else names the
# rows, removed when a new output replaces the old one, never written.
CSV_SIDECAR = ".csv"
META_SIDECAR = ".meta.json"
# The first line of the row table cl-zoo wrote (csv.writer ends lines with \r\n): its marker.
ROW_TABLE_HEAD = b"index,path"


def sidecar(out: str | os.PathLike[str], suffix: str) -> Path:
    """``emb.npy`` -> ``emb<suffix>`` (``.paths.jsonl``, ``.meta.json``, ``.failures.csv``, ``.parts``...)."""
    out = Path(out)
    return out.with_name(out.stem + suffix)


def csv_with_header(path: Path, header: bytes) -> bool:
    """Whether ``path`` is a regular file whose first line is ``header`` (how cl-zoo knows its own CSVs)."""
    head = read_head(path, len(header) + 2)  # a "\n" line end leaves the next row's first byte in it
    return head.startswith((header + b"\r\n", header + b"\n"))


def old_row_table(out: str | os.PathLike[str]) -> Path | None:
    """The ``index,path`` ``.csv`` an earlier version wrote beside a ``.npy`` ``out``, if one is there.

    Writing ``out`` removes it, since its rows would contradict the new ones. Anything else with that
    name (a ``train.csv`` of labels beside ``--out train.npy``, a link, a folder) is not ours and is
    left alone: that name is no longer written, so there is nothing to refuse.
    """
    if Path(out).suffix.lower() != ".npy":
        return None
    table = sidecar(out, CSV_SIDECAR)
    return table if csv_with_header(table, ROW_TABLE_HEAD) else None  # read_head: links and non-files read as b""


def path_listing(embeddings: str | os.PathLike[str]) -> Path:
    """The sidecar naming the rows of a ``.npy``: ``.paths.jsonl``, else an old ``.paths.txt``, else
    an old ``index,path`` ``.csv`` (the name returned, when none is there, is ``.paths.jsonl``)."""
    listing = sidecar(embeddings, PATHS_SIDECAR)
    if listing.is_file():
        return listing
    legacy = sidecar(embeddings, LEGACY_PATHS_SIDECAR)
    if legacy.is_file():
        return legacy
    return old_row_table(embeddings) or listing


# --------------------------------------------------------------------------------------------------
# The three readers: path list, metadata, .npy header
# --------------------------------------------------------------------------------------------------


def read_path_list(listing: str | os.PathLike[str]) -> list[str]:
    """The row paths of an embeddings file: ``.paths.jsonl`` lines, an old ``.paths.txt`` or ``.csv``.

    Old listings hold one raw name per ``\\n``-terminated line (what earlier versions wrote), so
    they are split on ``\\n`` only: splitting on every Unicode line break, as before, miscounted
    rows whose names hold ``\\r`` or U+2028.
    """
    listing = Path(listing)
    try:
        data = listing.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {listing}: {exc.strerror or exc}") from None
    if listing.name.endswith(CSV_SIDECAR):
        return _read_row_table(data, listing)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{listing} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if listing.name.endswith(LEGACY_PATHS_SIDECAR):
        return lines
    return parse_json_lines(text, str(listing))


def _read_row_table(data: bytes, listing: Path) -> list[str]:
    """The paths of an ``index,path`` table an earlier version wrote, checked row by row.

    Those tables were written with ``surrogateescape`` (a name that is not UTF-8 as its own bytes),
    so they are read back the same way, and the CSV quoting keeps names with line breaks whole.
    """
    rows = csv.reader(io.StringIO(data.decode("utf-8", errors="surrogateescape"), newline=""))
    try:
        if next(rows, None) != ["index", "path"]:
            raise DataError(f"{listing} does not start with cl-zoo's index,path header")
        paths = []
        for n, row in enumerate(rows):
            if len(row) != 2 or row[0] != str(n):
                raise DataError(f"{listing} row {n + 2} is not '{n},<path>'")
            paths.append(row[1])
    except csv.Error as exc:
        raise DataError(f"{listing} is not a readable CSV table ({exc})") from None
    return paths


def read_metadata(info: str | os.PathLike[str]) -> dict[str, object]:
    """A ``.meta.json`` sidecar: a JSON object whose recorded fields have their recorded types."""
    info = Path(info)
    meta = read_bounded_json(info, MAX_EMBEDDINGS_META_BYTES, "embeddings metadata file")
    if not isinstance(meta, dict):
        raise DataError(f"{info} holds a JSON {type(meta).__name__}, not an object")
    return checked_metadata(meta, str(info))


def checked_metadata(meta: dict[str, object], where: str) -> dict[str, object]:
    """Refuse recorded fields of the wrong type, which later steps would trip over."""
    for key in ("dims", "count"):
        if key in meta and (isinstance(meta[key], bool) or not isinstance(meta[key], int) or meta[key] < 0):  # type: ignore[operator]
            raise DataError(f"{where}: {key} must be a non-negative integer, got {meta[key]!r}")
    for key in ("model", "model_name", "source", "revision", "dtype", "array_digest", "listing_sha256"):
        if key in meta and not isinstance(meta[key], str):
            raise DataError(f"{where}: {key} must be a string, got {type(meta[key]).__name__}")
    return meta


def parquet_metadata(raw: dict[bytes, bytes], path: str | os.PathLike[str]) -> dict[str, object]:
    """The ``cl_zoo.*`` fields of a Parquet embeddings file's schema metadata, text checked, numbers parsed."""
    meta: dict[str, object] = {}
    for k, v in raw.items():
        if k.startswith(b"cl_zoo."):
            try:
                meta[k.decode()[len("cl_zoo."):]] = v.decode()
            except UnicodeDecodeError:
                raise DataError(f"{path}: metadata {k!r} is not UTF-8 text") from None
    for key in ("dims", "count"):  # numbers, as in .meta.json
        if key in meta:
            text = str(meta[key]).strip()
            if not text.isdigit() or not text.isascii():
                raise DataError(f"{path}: metadata {key} must be a non-negative integer, got {text[:40]!r}")
            meta[key] = int(text)
    return meta


def check_recorded_shape(meta: dict[str, object], rows: int, dims: int, where: str, location: Path) -> None:
    """Refuse metadata recording another count or dims than the data: the files do not belong together."""
    for key, actual in (("count", rows), ("dims", dims)):
        if key in meta and meta[key] != actual and rows:
            raise DataError(f"{where} records {key} {meta[key]} but {location} has {actual}; the files do not belong together")


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
        raise DataError(f"{path} is not a readable .npy file ({one_line(exc, 160)})") from None
    if dtype.kind != "f" or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise DataError(f"{path} holds {dtype} values, not floating-point embeddings")
    if len(shape) != 2 or any(not isinstance(n, int) or n < 0 for n in shape):
        raise DataError(f"{path} has shape {shape}; embeddings are a 2-D array (rows x dims)")
    if shape[0] and not shape[1]:  # every reader (index, search, dedup, load_embeddings) meets this check
        raise DataError(f"{path} holds {shape[0]} rows of 0 dims: no embeddings; re-embed with cl-zoo embed")
    expected = offset + shape[0] * shape[1] * dtype.itemsize
    if expected != size:
        what = "truncated" if size < expected else "longer than its header says"
        raise DataError(f"{path} is {what}: {size} bytes, but its header describes a {shape[0]}x{shape[1]} {dtype} array ({expected} bytes)")
    return NpyFile(path, int(shape[0]), int(shape[1]), dtype, offset, bool(fortran))


def read_npy_features(path: str | os.PathLike[str] | NpyFile) -> np.ndarray:
    """A 2-D float ``.npy`` as float32, its header checked (:func:`read_npy_header`) before any data is read.

    The header is only a few bytes of text; trusting it would let a small file ask for an array
    of 10^14 elements, an object array (pickles) or strings. The data is then read through a memory
    map, bounded by the file. An already checked :class:`NpyFile` is read as it is.
    """
    header = path if isinstance(path, NpyFile) else read_npy_header(path)
    shape = (header.rows, header.dims)
    if header.rows * header.dims == 0:
        return np.zeros(shape, np.float32)
    try:
        data = np.memmap(header.path, dtype=header.dtype, mode="r", offset=header.offset, shape=shape,
                         order="F" if header.fortran else "C")
        return np.array(data, dtype=np.float32, order="C")
    except (OSError, ValueError) as exc:
        raise DataError(f"{header.path} is not a readable .npy file ({exc})") from None


# --------------------------------------------------------------------------------------------------
# One .npy output with its sidecars, read as a whole
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NpyRows:
    """A ``.npy`` output's checked header, its row paths and its metadata; the values stay on disk."""

    header: NpyFile
    paths: list[str]
    metadata: dict[str, object]
    listing: Path  # the path list read (``.paths.jsonl``, or an older version's)
    info: Path  # the ``.meta.json`` (absent: metadata is {})


def read_npy_rows(path: str | os.PathLike[str]) -> NpyRows:
    """The path list, metadata and header of the ``.npy`` output ``path``, checked against each other.

    What :func:`cl_zoo.embedding.load_embeddings` (which then reads the values) and
    :func:`cl_zoo.index.open_rows` (which streams them) both need: a path listing must be there, the
    metadata (when there) well typed, the header consistent with the file, and the three must agree
    on the row count (and the metadata on the dims).
    """
    path = Path(path)
    listing = path_listing(path)
    if not listing.is_file():
        raise DataError(f"{path} has no {listing.name} beside it naming its rows")
    info = sidecar(path, META_SIDECAR)
    meta = read_metadata(info) if info.is_file() else {}
    header = read_npy_header(path)
    paths = read_path_list(listing)
    if len(paths) != header.rows:
        raise DataError(f"{path} has shape {(header.rows, header.dims)} but {listing.name} lists {len(paths)} paths")
    check_recorded_shape(meta, header.rows, header.dims, info.name, path)
    check_committed_together(meta, path, listing, info)
    return NpyRows(header, paths, meta, listing, info)


# What a ``.meta.json`` records of the two files it was committed with: the writer renames it last,
# so an array or path list that is not the one it names (a write that stopped half-way, a file
# copied over) is refused instead of read under somebody else's row names.
ARRAY_DIGEST_KEY = "array_digest"
PATHS_DIGEST_KEY = "listing_sha256"


def check_committed_together(meta: dict[str, object], path: Path, listing: Path, info: Path) -> None:
    """Refuse an array or path list other than the ones ``meta`` records the digests of.

    Metadata without digests (written by an earlier version) is read as before: its row count and
    dims are all there is to check.
    """
    advice = "the files do not belong together (an interrupted write, or a file copied over); re-embed with cl-zoo embed"
    recorded = meta.get(ARRAY_DIGEST_KEY)
    if recorded is not None and recorded != file_digest(path):
        raise DataError(f"{path.name} does not match the array {info.name} records: {advice}")
    recorded = meta.get(PATHS_DIGEST_KEY)
    if recorded is not None and listing.name.endswith(PATHS_SIDECAR) and listing.is_file() and recorded != sha256_file(listing):
        raise DataError(f"{listing.name} does not match the path list {info.name} records: {advice}")


def check_npy_output(path: str | os.PathLike[str]) -> None:
    """For readers of a ``.npy`` that need only its values (an index build): refuse it when its
    ``.meta.json`` records another array or path list (:func:`check_committed_together`)."""
    path = Path(path)
    info = sidecar(path, META_SIDECAR)
    if info.is_file():
        check_committed_together(read_metadata(info), path, path_listing(path), info)


# --------------------------------------------------------------------------------------------------
# What the rows are compared by
# --------------------------------------------------------------------------------------------------


def normalize(features: np.ndarray) -> np.ndarray:
    """Float32, C-contiguous, unit L2 norm per row (all-zero rows stay zero)."""
    x = np.ascontiguousarray(features, dtype=np.float32)
    if x.ndim != 2:
        raise DataError(f"embeddings must be a 2-D array, got shape {x.shape}")
    if len(x) and not x.shape[1]:  # every search, dedup and index path normalises first: one refusal for all
        raise DataError(f"{len(x)} embeddings of 0 dims hold nothing to compare; re-embed with cl-zoo embed")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


EDGE_BYTES = 1 << 20


def file_digest(path: str | os.PathLike[str], edge: int = EDGE_BYTES) -> str:
    """sha256 over a file's size and its first and last ``edge`` bytes.

    What a shard manifest records per shard and what an index's fingerprint is built from
    (:mod:`cl_zoo.index.fingerprint`); changing it would make every manifest's digests disagree with
    their shards.
    """
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(edge))
        if size > edge:
            fh.seek(max(edge, size - edge))
            h.update(fh.read(edge))
    return h.hexdigest()


# Threshold for a model that records none: high enough that only near-identical images group.
FALLBACK_DEDUP_THRESHOLD = 0.99
# The key of a model's config.json under which its calibration (cl_zoo.index.dedup_calibration) is
# recorded; ``cl-zoo embed`` copies its threshold into the embeddings' metadata as ``dedup_threshold``.
CONFIG_KEY = "dedup"


def recorded_threshold(config: dict[str, Any] | None) -> float | None:
    """The calibrated near-duplicate threshold a model's ``config.json`` records, if any.

    Here rather than beside the calibration because the embedding writer records it in the
    metadata it writes, and ``dedup`` reads it back from there.
    """
    section = config.get(CONFIG_KEY) if isinstance(config, dict) else None
    value = section.get("threshold") if isinstance(section, dict) else None
    return float(value) if isinstance(value, (int, float)) and -1.0 <= value <= 1.0 else None
