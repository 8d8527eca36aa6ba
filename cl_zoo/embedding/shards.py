"""A folder of numbered embedding shards with a manifest: outputs larger than memory.

One ``.npy`` holding every row cannot outgrow memory gracefully: the rows are concatenated in
memory before it is written, and every reader loads it whole. A shard folder is what
clip-retrieval and img2dataset users expect instead::

    DIR/manifest.json          the run: model fingerprint and fields, preprocessing, inputs, shards
    DIR/emb_00000.npy          float32 (float16 with --half) [rows, dims]
    DIR/meta_00000.parquet     row for row: ``path`` (string) and ``id`` (int64, the image's position
                               in the run's input list; for a WebDataset tar, its position in the tar)
    DIR/failures_00000.csv     path,reason of the shard's images that could not be read (if any)

A shard covers a fixed range of input images, so it is finished or not, independently of every
other: a resumed run never redoes one, and ``torchrun`` ranks split shards between them. Each
shard is written from progress parts already on disk, one part at a time (:func:`write_shard`),
so a run's memory does not grow with the collection.

Everything here is read as untrusted (:func:`open_shards`): the manifest is bounded and
type-checked; every listed shard must exist, have the ``.npy`` header and file length its rows
say (a truncated copy is refused), a ``meta`` table of the same length made by the same model
(its fingerprint is in each table's metadata) and the edge digest the manifest recorded.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cl_zoo.arrays import file_digest, read_npy_header
from cl_zoo.embedding.checks import NonFiniteFeatureError, display_path
from cl_zoo.embedding.progress import Chunk
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import atomic_path, atomic_write_text, read_head, read_bounded_json
from cl_zoo.optional import require

SHARD_FORMAT = "cl-zoo-embedding-shards"
SHARD_FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# Default shard: about a million rows or 1 GiB of features, whichever comes first (clip-retrieval's
# and autofaiss's usual unit); rounded to whole progress chunks.
DEFAULT_SHARD_ROWS = 1_000_000
DEFAULT_SHARD_BYTES = 1 << 30
MAX_SHARD_MANIFEST_BYTES = 64 << 20
_FAILURES_HEAD = b"path,reason"
_OUR_FILE = re.compile(r"^(emb_\d{5,}\.npy|meta_\d{5,}\.parquet|failures_\d{5,}\.csv|manifest\.json)$")


def emb_name(index: int) -> str:
    return f"emb_{index:05d}.npy"


def meta_name(index: int) -> str:
    return f"meta_{index:05d}.parquet"


def failures_name(index: int) -> str:
    return f"failures_{index:05d}.csv"


def is_shard_output(out: str | os.PathLike[str]) -> bool:
    """``--out DIR/`` (a trailing slash, an existing folder, or no file suffix) asks for shards."""
    text = os.fspath(out)
    return text.endswith(("/", os.sep)) or Path(text).is_dir() or Path(text).suffix == ""


def is_shard_folder(path: str | os.PathLike[str]) -> bool:
    return Path(path).is_dir() and (Path(path) / MANIFEST_NAME).is_file()


def default_shard_images(dims: int, itemsize: int, chunk_size: int) -> int:
    """Images per shard: ~1M rows or 1 GiB of features, whichever first, in whole chunks."""
    rows = min(DEFAULT_SHARD_ROWS, DEFAULT_SHARD_BYTES // max(1, dims * itemsize))
    return max(chunk_size, rows // chunk_size * chunk_size)


def named_like_ours(folder: Path) -> list[Path]:
    """The entries of ``folder`` named as a sharded run names its files (whatever they hold)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _OUR_FILE.match(p.name))


def _is_our_manifest(path: Path) -> bool:
    try:
        manifest = read_bounded_json(path, max_bytes=MAX_SHARD_MANIFEST_BYTES, what="shard manifest")
    except ClZooError:
        return False
    return isinstance(manifest, dict) and manifest.get("format") == SHARD_FORMAT


def _not_ours(path: Path) -> str | None:
    """Why ``path`` (named like a shard file) is not one a sharded run wrote; None when it is."""
    if path.is_symlink():
        return "a symbolic link"
    if path.is_dir():
        return "a folder"
    if not path.is_file():
        return "not a regular file"
    if path.name == MANIFEST_NAME:
        return None if _is_our_manifest(path) else f"not a {SHARD_FORMAT} manifest"
    if path.name.startswith("emb_"):
        try:
            read_npy_header(path)
        except DataError:
            return "not a 2-D float .npy"
    elif path.name.startswith("meta_"):
        try:
            if not shard_meta_fingerprint(path)[1]:
                return "a table without cl-zoo's model fingerprint"
        except DataError:
            return "not a shard table with cl-zoo's columns"
    elif read_head(path, len(_FAILURES_HEAD) + 2) not in (_FAILURES_HEAD + b"\r\n", _FAILURES_HEAD + b"\n"):
        return "no path,reason header"
    return None


def our_files(folder: Path) -> list[Path]:
    """The files a sharded run wrote into ``folder``: what ``--resume`` continues and ``--force`` deletes.

    Recognised by content, not only by name: the manifest must be cl-zoo's, a ``meta`` table must
    carry cl-zoo's footer, and ``emb``/``failures`` files (valid in another tool's shard folder too)
    count as cl-zoo's only in a folder one of those marks as a cl-zoo run's. A file with a shard's
    name that is not cl-zoo's, or a folder or link with one, is one :class:`DataError` line naming
    it: it is neither replaced nor deleted.
    """
    named = named_like_ours(folder)
    reasons = {path: _not_ours(path) for path in named}
    marked = any(why is None and (path.name == MANIFEST_NAME or path.name.startswith("meta_")) for path, why in reasons.items())
    for path, why in reasons.items():
        if why is None and not marked:
            why = f"no cl-zoo {MANIFEST_NAME} or shard table beside it"
        if why is not None:
            raise DataError(f"{path} was not written by a cl-zoo embed run ({why}); cl-zoo will neither replace nor delete it: "
                            "move it away or choose another --out")
    return named


@dataclass(frozen=True)
class ShardRecord:
    """One finished shard as the manifest lists it."""

    index: int
    rows: int  # embedded images
    images: int  # input images covered (rows + failures)
    failures: int
    first_id: int  # id of the shard's first input image
    digest: str  # edge digest of the emb file (cl_zoo.arrays.file_digest)
    source: str = ""  # the WebDataset tar it came from, if any

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "emb": emb_name(self.index), "meta": meta_name(self.index), "rows": self.rows,
                "images": self.images, "failures": self.failures, "first_id": self.first_id, "digest": self.digest,
                **({"source": self.source} if self.source else {})}


def write_shard(
    folder: Path,
    index: int,
    chunks: Callable[[], Iterable[Chunk]],
    ref_of: Callable[[int], str],
    *,
    dims: int,
    half: bool,
    fingerprint: str,
    first_id: int,
    run_digest: str = "",
    source: str = "",
) -> ShardRecord:
    """Write shard ``index`` from its chunks, one chunk in memory at a time.

    ``chunks`` is called twice (rows are counted before the ``.npy`` header is written, and the
    data streamed after it), so it should load parts lazily from disk. The emb file goes first,
    then the failures, then ``meta``: a shard counts as finished once its ``meta`` table exists,
    and every file is renamed into place whole.
    """
    dtype = np.dtype(np.float16 if half else np.float32)
    rows = sum(len(c.indices) for c in chunks())
    emb = folder / emb_name(index)
    failures: list[tuple[str, str]] = []
    with atomic_path(emb, suffix=".npy", mkdir=False) as tmp, open(tmp, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, dims)})
        for chunk in chunks():
            failures += [(ref_of(int(i)), r) for i, r in zip(chunk.fail_indices, chunk.fail_reasons)]
            if not len(chunk.indices):
                continue
            if chunk.features.shape[1] != dims:
                raise DataError(f"shard {index}: a progress part has {chunk.features.shape[1]}-d features, not {dims}; run with --force")
            array = chunk.features.astype(dtype)
            if half and not np.isfinite(array).all():
                raise DataError(f"features exceed the float16 range; embed into {folder} without --half")
            if not np.isfinite(array).all():
                row = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
                raise NonFiniteFeatureError(f"feature of {display_path(ref_of(int(chunk.indices[row])))} is not finite; nothing was written")
            fh.write(np.ascontiguousarray(array).tobytes())
    fail_file = folder / failures_name(index)
    if failures:
        write_failure_rows(fail_file, sorted(failures))
    else:
        fail_file.unlink(missing_ok=True)
    _write_meta(folder / meta_name(index), chunks, ref_of, fingerprint, index, first_id, run_digest, len(failures))
    images = rows + len(failures)
    return ShardRecord(index, rows, images, len(failures), first_id, file_digest(emb), source)


def write_failure_rows(path: Path, failures: Sequence[tuple[str, str]]) -> None:
    with atomic_path(path, suffix=".csv", mkdir=False) as tmp, open(tmp, "w", newline="", encoding="utf-8", errors="surrogateescape") as fh:
        writer = csv.writer(fh)
        writer.writerow(["path", "reason"])
        writer.writerows(failures)


def _write_meta(path: Path, chunks: Callable[[], Iterable[Chunk]], ref_of: Callable[[int], str], fingerprint: str, index: int, first_id: int,
                run_digest: str, failures: int) -> None:
    pa = require("pyarrow", "--out DIR/ (sharded embeddings)")
    import pyarrow.parquet as pq

    # Each row's input size and mtime_ns when it was embedded (-1: not a local file, or a part an
    # earlier version saved): what --resume compares a finished shard's inputs by.
    schema = pa.schema([("path", pa.string()), ("id", pa.int64()), ("size", pa.int64()), ("mtime_ns", pa.int64())],
                       metadata={"cl_zoo.model_sha256": fingerprint, "cl_zoo.shard": str(index), "cl_zoo.first_id": str(first_id),
                                 "cl_zoo.run_sha256": run_digest, "cl_zoo.failures": str(failures)})
    with atomic_path(path, suffix=".parquet", mkdir=False) as tmp:
        with pq.ParquetWriter(tmp, schema) as writer:
            for chunk in chunks():
                if not len(chunk.indices):
                    continue
                refs = [ref_of(int(i)) for i in chunk.indices]
                bad = next((r for r in refs if not _utf8(r)), None)
                if bad is not None:
                    raise DataError(f"file name {bad!r} is not UTF-8, which parquet strings must be; write a .npy output instead")
                recorded = {int(i): (size, mtime) for i, size, mtime in (chunk.stats.tolist() if chunk.stats is not None else ())}
                stats = [recorded.get(int(i), (-1, -1)) for i in chunk.indices]
                writer.write_table(pa.table({"path": pa.array(refs, pa.string()), "id": pa.array(chunk.indices, pa.int64()),
                                             "size": pa.array([st[0] for st in stats], pa.int64()),
                                             "mtime_ns": pa.array([st[1] for st in stats], pa.int64())}, schema=schema))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def changed_in_shard(meta: Path, paths: Sequence[str]) -> int:
    """How many of a finished shard's rows were embedded from a file that has another size or
    mtime_ns now (``paths``: the run's inputs, by id); 0 for a shard recording none (an earlier version's)."""
    from cl_zoo.embedding.progress import input_stat

    pq = require("pyarrow.parquet", "--out DIR/ (sharded embeddings)")
    try:
        table = pq.read_table(meta, columns=["id", "size", "mtime_ns"])
    except Exception:  # noqa: BLE001 - no such columns: nothing recorded to compare
        return 0
    ids, sizes, mtimes = (table.column(c).to_pylist() for c in ("id", "size", "mtime_ns"))
    return sum(1 for i, size, mtime in zip(ids, sizes, mtimes)
               if size is not None and size >= 0 and (not 0 <= i < len(paths) or input_stat(paths[i]) != (size, mtime)))


def shard_meta_fingerprint(path: Path) -> tuple[int, str, int]:
    """(rows, model fingerprint, shard number) from a ``meta`` table's footer, without reading its rows."""
    pq = require("pyarrow.parquet", "--out DIR/ (sharded embeddings)")

    try:
        info = pq.ParquetFile(path)
        meta = info.schema_arrow.metadata or {}
        rows = int(info.metadata.num_rows)
        names = set(info.schema_arrow.names)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a damaged shard
        raise DataError(f"{path} is not a readable parquet file ({' '.join(str(exc).split())[:120]})") from None
    if not {"path", "id"} <= names:
        raise DataError(f"{path} has no 'path' and 'id' columns; it is not a cl-zoo embedding shard")
    try:
        shard = int(meta.get(b"cl_zoo.shard", b"-1").decode())
        fingerprint = meta.get(b"cl_zoo.model_sha256", b"").decode()
    except (UnicodeDecodeError, ValueError):
        raise DataError(f"{path}: its cl_zoo metadata is damaged") from None
    return rows, fingerprint, shard


def unfinished_manifest(metadata: dict[str, Any], fingerprint: str, run_digest: str) -> dict[str, Any]:
    """What a run's folder says while it runs (``complete: false``): which model and run, no shards yet."""
    return {"format": SHARD_FORMAT, "version": SHARD_FORMAT_VERSION, "complete": False, **metadata,
            "model_sha256": fingerprint, "run_sha256": run_digest}


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    path = folder / MANIFEST_NAME
    atomic_write_text(path, json.dumps(manifest, indent=1) + "\n", mkdir=False)
    return path


@dataclass
class ShardSet:
    """A checked shard folder: its manifest and, in order, its shards."""

    folder: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def rows(self) -> int:
        return sum(int(r["rows"]) for r in self.records)

    @property
    def dims(self) -> int:
        return int(self.manifest["dims"])

    @property
    def emb_files(self) -> list[Path]:
        return [self.folder / r["emb"] for r in self.records]

    @property
    def metadata(self) -> dict[str, object]:
        """The manifest's fields in the shape :func:`cl_zoo.embedding.load_embeddings` returns."""
        skip = {"shards", "format", "version", "complete"}
        meta = {k: v for k, v in self.manifest.items() if k not in skip}
        meta["count"] = self.rows
        return meta

    def paths(self) -> list[str]:
        """Every row's path, in row order (the ``path`` columns only: no features are read)."""
        pq = require("pyarrow.parquet", "--out DIR/ (sharded embeddings)")

        out: list[str] = []
        for r in self.records:
            try:
                column = pq.read_table(self.folder / r["meta"], columns=["path"]).column("path")
                out += [str(p) for p in column.to_pylist()]
            except Exception as exc:  # noqa: BLE001
                raise DataError(f"{self.folder / r['meta']} is not a readable parquet file ({' '.join(str(exc).split())[:120]})") from None
        return out

    def blocks(self, block_rows: int = 65_536) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, float32 block)`` in order, read through short-lived maps (never all at once)."""
        start = 0
        for path in self.emb_files:
            header = read_npy_header(path)
            for lo in range(0, header.rows, block_rows):
                block = header.read(lo, min(lo + block_rows, header.rows))
                bad = ~np.isfinite(block).all(axis=1)
                if bad.any():
                    raise DataError(f"{path} row {lo + int(np.flatnonzero(bad)[0])} is not finite (NaN or inf); re-embed with a working model")
                yield start + lo, block
            start += header.rows

    def load(self) -> tuple[np.ndarray, list[str], dict[str, object]]:
        """Everything in memory, for folders that fit (what ``search``/``dedup`` read without an index)."""
        features = np.empty((self.rows, self.dims), np.float32)
        for start, block in self.blocks():
            features[start:start + len(block)] = block
        return features, self.paths(), self.metadata


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_NAME
    if not path.exists():
        raise DataError(f"{folder} has no {MANIFEST_NAME}; it is not a finished cl-zoo embed output")
    manifest = read_bounded_json(path, max_bytes=MAX_SHARD_MANIFEST_BYTES, what="shard manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != SHARD_FORMAT:
        raise DataError(f"{path} is not a cl-zoo shard manifest")
    if manifest.get("version") != SHARD_FORMAT_VERSION:
        raise DataError(f"{path} has shard format version {manifest.get('version')!r}; this cl-zoo reads version {SHARD_FORMAT_VERSION}")
    return manifest


def _int_field(record: dict[str, Any], key: str, where: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


def open_shards(folder: str | os.PathLike[str]) -> ShardSet:
    """Check a shard folder against its manifest before a single row is used; one error line if off."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    where = str(folder / MANIFEST_NAME)
    if manifest.get("complete") is not True:
        raise DataError(f"{folder} is an unfinished cl-zoo embed run; finish it with the same command and --resume")
    dims = _int_field(manifest, "dims", where)
    fingerprint = manifest.get("model_sha256")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise DataError(f"{where} records no model fingerprint (model_sha256)")
    records = manifest.get("shards")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{where}: shards must be a list of objects")
    listed = set()
    for n, record in enumerate(records):
        if _int_field(record, "index", where) != n:
            raise DataError(f"{where}: shard {n} is recorded as number {record.get('index')!r}")
        for key in ("emb", "meta"):
            if record.get(key) != (emb_name(n) if key == "emb" else meta_name(n)):
                raise DataError(f"{where}: shard {n}'s {key} file must be {emb_name(n) if key == 'emb' else meta_name(n)}")
        rows = _int_field(record, "rows", where)
        emb, meta = folder / record["emb"], folder / record["meta"]
        listed |= {emb.name, meta.name}
        for path in (emb, meta):
            if not path.is_file():
                raise DataError(f"shard {path.name} listed in {MANIFEST_NAME} is missing from {folder}")
        header = read_npy_header(emb)  # refuses a truncated file
        if header.rows != rows or header.dims != dims:
            raise DataError(f"{emb} holds {header.rows} x {header.dims} features but {MANIFEST_NAME} records {rows} x {dims}")
        # The model first: it says what went wrong; the digest then catches a replaced emb file alone.
        meta_rows, meta_fingerprint, meta_shard = shard_meta_fingerprint(meta)
        if meta_fingerprint != fingerprint:
            raise DataError(f"{meta} was made by another model (fingerprint {meta_fingerprint[:12] or 'none'}, "
                            f"the manifest's is {fingerprint[:12]}); the folder mixes runs")
        if meta_rows != rows or meta_shard != n:
            raise DataError(f"{meta} holds {meta_rows} rows of shard {meta_shard}; {MANIFEST_NAME} records {rows} rows of shard {n}")
        if file_digest(emb) != record.get("digest"):
            raise DataError(f"{emb} is not the file {MANIFEST_NAME} recorded (its digest differs); it was replaced or damaged")
    strays = [p.name for p in folder.glob("emb_*.npy") if p.name not in listed]
    if strays:
        raise DataError(f"{folder} holds {sorted(strays)[0]}, which {MANIFEST_NAME} does not list; the folder mixes runs")
    return ShardSet(folder, manifest, records)


__all__ = [
    "DEFAULT_SHARD_BYTES",
    "DEFAULT_SHARD_ROWS",
    "MANIFEST_NAME",
    "SHARD_FORMAT",
    "SHARD_FORMAT_VERSION",
    "ShardRecord",
    "ShardSet",
    "default_shard_images",
    "emb_name",
    "failures_name",
    "is_shard_folder",
    "is_shard_output",
    "meta_name",
    "named_like_ours",
    "open_shards",
    "our_files",
    "read_manifest",
    "shard_meta_fingerprint",
    "unfinished_manifest",
    "write_failure_rows",
    "write_manifest",
    "write_shard",
]
