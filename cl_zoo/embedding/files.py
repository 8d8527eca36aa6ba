"""Embedding files: one ``.npy`` with its sidecars, or one ``.parquet``, written atomically and read as untrusted.

A ``.npy`` output has two sidecars: ``.paths.jsonl`` (its rows' paths, one JSON string per line)
and ``.meta.json``. Its rows are named once: the ``index,path`` ``.csv`` table earlier versions also
wrote said the same thing again, and could not round-trip every name in every CSV reader, so it is
not written. Outputs of earlier versions still read: their ``.paths.txt`` listing,
or, when nothing else names the rows, their ``.csv`` table; and a new output written over an old one
removes the old one's ``.csv`` (only when its first line is cl-zoo's ``index,path`` header), so no
stale table stays beside new embeddings.
"""

from __future__ import annotations

import csv
import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

import numpy as np

# The readers (path list, metadata, .npy header) live below embedding/ and index/, which both read
# these files; they are re-exported here, where the writer's users have always imported them.
from cl_zoo.arrays import (  # noqa: F401 - re-exported
    ARRAY_DIGEST_KEY,
    CSV_SIDECAR,
    LEGACY_PATHS_SIDECAR,
    META_SIDECAR,
    PATHS_DIGEST_KEY,
    PATHS_SIDECAR,
    ROW_TABLE_HEAD,
    check_recorded_shape,
    checked_metadata,
    csv_with_header,
    file_digest,
    old_row_table,
    parquet_metadata,
    path_listing,
    read_metadata,
    read_npy_features,
    read_npy_rows,
    read_path_list,
    sidecar,
)
from cl_zoo.embedding.checks import (
    NonFiniteFeatureError,
    display_path,
)
from cl_zoo.embedding.parts import check_progress_folder
from cl_zoo.embedding.shards import open_shards
from cl_zoo.data.images import is_url
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import (
    MAX_EMBEDDINGS_META_BYTES,
    atomic_path,
    check_replaceable,
    read_bounded_json,
    read_head,
    refuse_inputs_as_outputs,
    sha256_file,
)
from cl_zoo.optional import require

OUTPUT_SUFFIXES = (".npy", ".parquet")


def _atomic_write(final: Path, write: Any) -> None:
    """Let ``write`` fill a same-folder temporary by name (see fileio); no folder is created."""
    with atomic_path(final, mkdir=False) as tmp:
        write(str(tmp))


FAILURES_SIDECAR = ".failures.csv"
PARTS_SIDECAR = ".parts"
# The first line of the failure report cl-zoo writes (csv.writer ends lines with \r\n): its marker.
_FAILURES_HEAD = b"path,reason"


def _is_path_list(path: Path) -> bool:
    """An empty file, or one whose first line is a JSON string (a user's ``.jsonl`` holds objects)."""
    head = read_head(path, 1 << 16)
    if not head:
        return path.stat().st_size == 0
    line, newline, _ = head.partition(b"\n")
    if not newline:
        return False
    try:
        return isinstance(json.loads(line.decode("ascii")), str)
    except (ValueError, RecursionError):
        return False


def _is_metadata(path: Path) -> bool:
    try:
        meta = read_bounded_json(path, MAX_EMBEDDINGS_META_BYTES, "embeddings metadata file")
    except ClZooError:
        return False
    return isinstance(meta, dict) and {"dims", "count", "dtype"} <= meta.keys()


# Sidecar -> (recogniser of cl-zoo's own file, what it is): the only files beside an output it
# replaces or removes (the .csv only removes: see old_row_table).
OWN_SIDECARS = {
    PATHS_SIDECAR: (_is_path_list, "an embeddings path list (.paths.jsonl)"),
    CSV_SIDECAR: (lambda p: csv_with_header(p, ROW_TABLE_HEAD), "an embeddings row table (index,path)"),
    META_SIDECAR: (_is_metadata, "an embeddings metadata file"),
    FAILURES_SIDECAR: (lambda p: csv_with_header(p, _FAILURES_HEAD), "an embed failure report (path,reason)"),
}


def embedding_files(npy: str | os.PathLike[str]) -> list[Path]:
    """An embeddings file and every sidecar cl-zoo writes or once wrote beside it: what a command that
    reads it must not write over."""
    npy = Path(npy)
    return [npy, *(sidecar(npy, s) for s in (*OWN_SIDECARS, LEGACY_PATHS_SIDECAR))]


def sidecars_of(out: str | os.PathLike[str]) -> list[str]:
    """The sidecar suffixes written (or, for a stale failure report, deleted) beside ``out``."""
    npy = Path(out).suffix.lower() == ".npy"
    return [*((PATHS_SIDECAR, META_SIDECAR) if npy else ()), FAILURES_SIDECAR]


def check_output_files(out: str | os.PathLike[str], inputs: Sequence[str | os.PathLike[str]] = ()) -> int | None:
    """Refuse, in one line, an output whose files would replace an input or a file cl-zoo did not write.

    ``out`` may be replaced (the user named it) unless it is one of ``inputs``; each sidecar must be
    absent or recognisably cl-zoo's (:data:`OWN_SIDECARS`); and so must the progress folder
    (:mod:`cl_zoo.embedding.parts`). An old ``.csv`` table of cl-zoo's, which writing ``out``
    removes (:func:`old_row_table`), must not be an input either. Returns the row count a
    ``.meta.json`` of cl-zoo's records when one is there (an earlier output, whose older
    ``.paths.txt`` listing may then be removed).
    """
    out = Path(out)
    names = sidecars_of(out)
    removed = [t for t in (old_row_table(out),) if t is not None]
    refuse_inputs_as_outputs([out, *(sidecar(out, s) for s in names), sidecar(out, PARTS_SIDECAR), *removed], inputs)
    found = {s: check_replaceable(sidecar(out, s), OWN_SIDECARS[s][0], OWN_SIDECARS[s][1]) for s in names}
    check_progress_folder(sidecar(out, PARTS_SIDECAR))
    if not found.get(META_SIDECAR):
        return None
    count = read_bounded_json(sidecar(out, META_SIDECAR), MAX_EMBEDDINGS_META_BYTES).get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _is_legacy_listing_of(path: Path, count: int | None) -> bool:
    """Whether ``path`` is the ``.paths.txt`` an older cl-zoo wrote for an output of ``count`` rows:
    one name per line, as many lines as rows. Anything else there is somebody else's and stays."""
    if count is None or path.is_symlink() or not path.is_file():
        return False
    lines = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            lines += block.count(b"\n")
            if lines > count:
                return False
    return lines == count


def _path_list_text(paths: Sequence[str]) -> str:
    return "".join(json.dumps(p) + "\n" for p in paths)


def _commit_npy(out: Path, array: np.ndarray, paths: Sequence[str], meta: dict[str, object]) -> None:
    """Write the array, its path list and its metadata as one unit: all three under temporary names
    first (a full disk fails here, before anything is renamed), then renamed with the metadata last.

    The metadata records the other two files' digests, so a reader that meets a mix (a rename that
    never happened, a file copied over) refuses it instead of naming one run's rows after another's
    (:func:`cl_zoo.arrays.check_committed_together`).
    """
    with ExitStack() as commit:
        # Entered first, so renamed last: the contexts leave in reverse order.
        info_tmp = commit.enter_context(atomic_path(sidecar(out, META_SIDECAR), mkdir=False))
        listing_tmp = commit.enter_context(atomic_path(sidecar(out, PATHS_SIDECAR), mkdir=False))
        array_tmp = commit.enter_context(atomic_path(out, mkdir=False))
        with open(array_tmp, "wb") as fh:  # a file object: np.save would append ".npy" to a bare name
            np.save(fh, array)
        listing_tmp.write_text(_path_list_text(paths), encoding="ascii")
        sealed = {**meta, ARRAY_DIGEST_KEY: file_digest(array_tmp), PATHS_DIGEST_KEY: sha256_file(listing_tmp)}
        info_tmp.write_text(json.dumps(sealed, indent=1) + "\n")


def write_path_list(final: str | os.PathLike[str], paths: Sequence[str]) -> Path:
    """One JSON string per line, written atomically.

    File names may hold ``\n``, ``\r`` or U+2028, so a plain line list would split them; JSON with
    ``ensure_ascii`` escapes every such character (and any undecodable byte kept by Python as a
    lone surrogate), so each row is exactly one ``\n``-terminated line of ASCII.
    """
    final = Path(final)
    _atomic_write(final, lambda tmp: Path(tmp).write_text(_path_list_text(paths), encoding="ascii"))
    return final


def save_embeddings(
    out: str | os.PathLike[str], features: np.ndarray, paths: Sequence[str], metadata: dict[str, str], *, half: bool = False
) -> list[Path]:
    """Write ``.npy`` (+ ``.paths.jsonl``, ``.meta.json``) or ``.parquet``; returns the files.

    The three files of a ``.npy`` output are one unit (:func:`_commit_npy`): written whole under
    temporary names, then renamed with the metadata, which records the other two's digests, last;
    a failed write (a full disk) leaves an earlier output as it was. Row paths are stored absolute,
    so the file means the same thing from any working directory. A sidecar name already taken by a
    file cl-zoo did not write (a ``train.meta.json`` of the user's beside ``train.npy``) is refused
    before anything is written (:func:`check_output_files`). A ``.paths.txt`` or ``index,path``
    ``.csv`` left by an older version beside an earlier output is removed, so no stale listing
    contradicts the new one; a ``train.csv`` of anybody else's stays as it is.
    Non-finite features are refused (:class:`NonFiniteFeatureError`) before anything is written.
    """
    out = Path(out)
    paths = [p if is_url(p) else os.path.abspath(p) for p in paths]  # URLs (and tar#key of URLs) stay as given
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ClZooError(f"output {out} must end in .npy or .parquet")
    if features.ndim != 2 or len(features) != len(paths):
        raise DataError(f"cannot save {features.shape} features for {len(paths)} paths")
    bad = ~np.isfinite(features).all(axis=1)
    if bad.any():
        raise NonFiniteFeatureError(f"feature of {display_path(paths[int(np.flatnonzero(bad)[0])])} is not finite (NaN or inf); nothing was written to {out}")
    array = features.astype(np.float16 if half else np.float32)
    if half and not np.isfinite(array).all():
        raise DataError(f"features exceed the float16 range; save {out} without --half")
    earlier = check_output_files(out)  # before any write: a sidecar name may hold somebody else's file
    legacy = sidecar(out, LEGACY_PATHS_SIDECAR)
    stale = _is_legacy_listing_of(legacy, earlier)
    old_table = old_row_table(out)
    meta: dict[str, object] = {**metadata, "dims": int(array.shape[1]), "count": len(paths), "dtype": str(array.dtype)}
    if out.suffix.lower() == ".parquet":
        pa = require("pyarrow", "--out F.parquet")
        import pyarrow.parquet as pq

        unencodable = next((p for p in paths if not _utf8_encodable(p)), None)
        if unencodable is not None:
            raise DataError(f"file name {unencodable!r} is not UTF-8, which parquet strings must be; write a .npy output instead")
        values = pa.array(array.reshape(-1), type=pa.float16() if half else pa.float32())
        column = pa.FixedSizeListArray.from_arrays(values, array.shape[1]) if len(paths) else pa.array([], pa.list_(pa.float32(), array.shape[1]))
        table = pa.table({"path": pa.array(list(paths), pa.string()), "embedding": column})
        # bytes only: nested records (int8's quantization) as JSON text, scalars as they print
        table = table.replace_schema_metadata({f"cl_zoo.{k}": json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                                               for k, v in meta.items()})
        _atomic_write(out, lambda tmp: pq.write_table(table, tmp))
        return [out]
    listing, info = sidecar(out, PATHS_SIDECAR), sidecar(out, META_SIDECAR)
    _commit_npy(out, array, paths, meta)
    if stale:  # the listing of the output replaced here (an older version's); a .paths.txt of anybody else's stays
        legacy.unlink(missing_ok=True)
    if old_table is not None:  # the same for an older version's row table
        old_table.unlink(missing_ok=True)
    return [out, listing, info]


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parquet_embeddings(path: Path) -> tuple[np.ndarray, list[str], dict[str, object]]:
    pa = require("pyarrow", f"reading {path.name}")
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        paths_col = table.column("path") if "path" in table.column_names else None
        emb_col = table.column("embedding") if "embedding" in table.column_names else None
        if paths_col is None or emb_col is None:
            raise DataError(f"{path} has no 'path' and 'embedding' columns; was it written by cl-zoo embed?")
        column = emb_col.combine_chunks()
        raw_meta = table.schema.metadata or {}
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure (ArrowInvalid, OSError, MemoryError...) is a bad file
        raise DataError(f"{path} is not a readable parquet file ({' '.join(str(exc).split())[:160]})") from None
    meta = parquet_metadata(raw_meta, path)
    if not (pa.types.is_string(paths_col.type) or pa.types.is_large_string(paths_col.type)):
        raise DataError(f"{path}: the 'path' column holds {paths_col.type}, not strings")
    if paths_col.null_count:
        raise DataError(f"{path}: the 'path' column has {paths_col.null_count} empty (null) rows")
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        raise DataError(f"{path}: the 'embedding' column holds {kind}, not lists of numbers")
    if not pa.types.is_floating(kind.value_type):
        raise DataError(f"{path}: the 'embedding' column holds lists of {kind.value_type}, not floating-point numbers")
    n = len(column)
    if n != len(paths_col):
        raise DataError(f"{path} has {n} embeddings but {len(paths_col)} paths")
    if column.null_count:
        raise DataError(f"{path}: the 'embedding' column has {column.null_count} empty (null) rows")
    if n:
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        dims = int(lengths[0])
        if (lengths != dims).any():
            row = int(np.flatnonzero(lengths != dims)[0])
            raise DataError(f"{path}: embedding rows differ in length ({dims} in row 0, {int(lengths[row])} in row {row}); refusing to reshape them")
    else:
        dims = int(meta.get("dims", 0))  # type: ignore[arg-type]
    if "dims" in meta and meta["dims"] != dims and n:
        raise DataError(f"{path} records dims {meta['dims']} but its embeddings have {dims}")
    values = pc.list_flatten(column) if not pa.types.is_fixed_size_list(kind) else column.flatten()
    if values.null_count:
        raise DataError(f"{path}: the 'embedding' column holds {values.null_count} null numbers")
    if len(values) != n * dims:
        raise DataError(f"{path}: the 'embedding' column holds {len(values)} numbers, not {n} x {dims}")
    features = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, dims)
    try:
        paths = [str(p) for p in paths_col.to_pylist()]
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: the 'path' column holds text that is not UTF-8 ({exc.reason})") from None
    return features, paths, checked_metadata(meta, str(path))


def load_embeddings(path: str | os.PathLike[str]) -> tuple[np.ndarray, list[str], dict[str, object]]:
    """Read what :func:`save_embeddings` (or a sharded ``cl-zoo embed --out DIR/``) wrote: float32 features, paths, metadata.

    These files are inputs like any other: each part is checked (types, sizes, row count against
    the path list and the recorded count, finite values) and anything off is one
    :class:`DataError` line; rows never silently shift against their paths.
    """
    path = Path(path)
    if path.is_dir():
        return open_shards(path).load()  # checked against its manifest first
    if not path.is_file():
        raise DataError(f"embeddings file does not exist: {path}")
    if path.suffix.lower() == ".parquet":
        features, paths, meta = _parquet_embeddings(path)
        where = path.name
    elif path.suffix.lower() == ".npy":
        rows = read_npy_rows(path)  # the path list, metadata and header, checked against each other
        features, paths, meta = read_npy_features(rows.header), rows.paths, rows.metadata
        where = rows.info.name
    else:
        raise DataError(f"{path}: embeddings must be a .npy or .parquet file")
    check_recorded_shape(meta, features.shape[0], features.shape[1], where, path)
    bad = ~np.isfinite(features).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path} row {row} ({display_path(paths[row])}) is not finite (NaN or inf); re-embed with a working model")
    return features, paths, meta


def write_failures(path: str | os.PathLike[str], failures: Sequence[tuple[str, str]]) -> Path:
    """``path,reason`` rows, written atomically."""
    final = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["path", "reason"])
            writer.writerows(failures)

    _atomic_write(final, write)
    return final


