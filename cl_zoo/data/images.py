"""Finding image files and decoding them robustly.

Every command that reads user images (``embed``, ``search``, ``knn``...) goes through these two
functions so that they agree on which files count as images, in which order they come, and why a
file was refused. Decoding never raises a bare PIL/OS error: a bad file becomes an
:class:`ImageDecodeError` carrying a short ``reason`` that goes into a failures report, so one
truncated JPEG among a million skips one row instead of ending the run.

JPEGs are decoded with PIL's draft mode: libjpeg scales the DCT by 1/2, 1/4 or 1/8 while decoding,
so a 2400x1600 photo needed at 256 px costs a fraction of a full decode. The decoding core,
:func:`decode_image`, takes an open binary file or bytes, so images that never were local files
(a member of a WebDataset tar, an ``http://`` download) are refused for the same reasons as files.

Path lists are text (one path a line), JSON lines (one JSON string a line, as ``cl-zoo embed``'s
``.paths.jsonl`` sidecar: the one format in which every file name round-trips), CSV/TSV tables or
Parquet tables; their size is bounded
(:data:`MAX_LIST_BYTES`) because a 10 GB file named ``frames.txt`` by mistake must be refused, not
read into memory. A file is read as a list only under a list's name (:data:`PATH_LIST_EXTENSIONS`).
"""

from __future__ import annotations

import csv
import errno
import io
import os
import re
import struct
import urllib.parse
import warnings
from typing import IO, Callable, Iterable, Iterator

from PIL import Image, UnidentifiedImageError

from cl_zoo.errors import DataError
from cl_zoo.fileio import open_regular_file
from cl_zoo.optional import require
from cl_zoo.text import exception_line as _one_line, mib as _mib, parse_json_lines

# The one list of accepted extensions (lower case; names are compared lower-cased). ImageFolder
# discovery (cl_zoo.data.folder) imports it, so labelled and unlabelled inputs accept the same files.
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif"}
)


class ImageDecodeError(DataError):
    """One image that cannot be used; ``reason`` is a short phrase for the failures report."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read image {path}: {reason}")
        self.path = path
        self.reason = reason


def is_image_path(path: str | os.PathLike[str]) -> bool:
    """Whether a name has one of the supported image extensions (case-insensitive)."""
    return os.path.splitext(os.fspath(path))[1].lower() in IMAGE_EXTENSIONS


# "scheme://": two or more scheme characters, so a Windows drive ("C://") never reads as a URL.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+://")


def is_url(ref: str | os.PathLike[str]) -> bool:
    """Whether ``ref`` is a ``scheme://...`` URL (fsspec's syntax) rather than a plain local path.

    Only the text is looked at, never the file system: a list file can name ``http://`` images, and
    those must stay URLs instead of being joined onto the list's folder like relative paths.
    """
    return bool(_URL.match(os.fspath(ref)))


def is_hidden_name(name: str) -> bool:
    """Whether a folder walk skips this name (local folders here, remote ones in cl_zoo.embedding.inputs)."""
    # ".DS_Store", "._photo.jpg" (macOS resource forks look like JPEGs but are not), "__MACOSX".
    return name.startswith(".") or name == "__MACOSX"


class LinkSafeWalk:
    """``os.walk(top, followlinks=True)`` that enters every real directory at most once.

    Folder symlinks are followed (datasets are often assembled from links into shared storage),
    but a link back to a folder already walked or to an ancestor of ``top`` (``up -> ..``) would
    repeat the same images, or never end. Each directory's real path is remembered; a directory
    whose real path was seen, or that contains ``top``, is skipped and counted in ``repeats``, so
    callers can say how much they left out. Among siblings, real folders come before links, so the
    path kept for a linked-twice folder is its own one.
    """

    def __init__(self, top: str, *, onerror: Callable[[OSError], None] | None = None, hidden: Callable[[str], bool] | None = None) -> None:
        self.top = top
        self.onerror = onerror
        self.hidden = hidden or is_hidden_name
        self.repeats = 0  # directories skipped because their real path was already walked

    def __iter__(self) -> Iterator[tuple[str, list[str]]]:
        """Yield ``(dirpath, filenames)`` top-down; sub-folders in a deterministic order."""
        top_real = os.path.realpath(self.top)
        visited = {top_real}
        for dirpath, dirnames, filenames in os.walk(self.top, onerror=self.onerror, followlinks=True):
            kept = []
            for name in sorted((d for d in dirnames if not self.hidden(d)), key=lambda d: (os.path.islink(os.path.join(dirpath, d)), d)):
                real = os.path.realpath(os.path.join(dirpath, name))
                if real in visited or top_real.startswith(real.rstrip(os.sep) + os.sep):
                    self.repeats += 1
                    continue
                visited.add(real)
                kept.append(name)
            dirnames[:] = sorted(kept)
            yield dirpath, [f for f in filenames if not self.hidden(f)]


class FoundImages(list):
    """A list of image paths that also says how many linked folders were skipped as repeats."""

    repeats: int = 0


def _walk_images(folder: str) -> tuple[list[str], int]:
    """Image files under ``folder`` and the number of folders skipped as symlink repeats."""
    found: list[str] = []

    def refuse(exc: OSError) -> None:
        # An unreadable top folder is the user's mistake; an unreadable subfolder deep inside
        # a large tree should not stop the scan, but must not vanish silently either.
        if os.path.normpath(exc.filename or "") == os.path.normpath(folder):
            raise DataError(f"cannot read folder {folder}: {exc.strerror}") from None
        warnings.warn(f"skipping unreadable folder {exc.filename}: {exc.strerror}", stacklevel=3)

    walk = LinkSafeWalk(folder, onerror=refuse)
    for root, files in walk:
        found.extend(os.path.join(root, f) for f in files if is_image_path(f))
    return found, walk.repeats


# Path lists in these formats are tables: the paths are one column of each row.
TABLE_LIST_EXTENSIONS: dict[str, str] = {".csv": ",", ".tsv": "\t"}
PARQUET_LIST_EXTENSIONS: frozenset[str] = frozenset({".parquet"})
# Path lists in this format hold one JSON string per line: cl-zoo embed's ``.paths.jsonl`` sidecar.
JSON_LIST_EXTENSIONS: frozenset[str] = frozenset({".jsonl"})
# Every name a path list may have: a file is read as a list only by its suffix, because any other
# file (a README, a model, a video) read as one became hundreds of "missing image" warnings.
PATH_LIST_EXTENSIONS: frozenset[str] = frozenset(
    {".txt", *TABLE_LIST_EXTENSIONS, *PARQUET_LIST_EXTENSIONS, *JSON_LIST_EXTENSIONS}
)
PATH_COLUMNS = ("path", "filepath", "file_path", "filename", "file", "image", "image_path")
# The largest path list read: the file for text/CSV/TSV lists (any non-image input is read as one),
# the decoded path column for Parquet. 1 GiB is some 15 million 64-character paths; collections
# larger than that belong in folders or WebDataset shards. Read at call time, so tests can lower it.
MAX_LIST_BYTES: int = 1 << 30
# The most rows a path list may have, checked before any row is materialised (a Parquet list by its
# metadata, a text one by its line breaks): a 160 KB Parquet file can declare 50M rows, and each
# row costs a Python string (~100 bytes) however short its text. 2^24 keeps the 15M paths above.
MAX_LIST_ROWS: int = 1 << 24
_LINE_BREAKS = (b"\n", b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", "\x85".encode(), "\u2028".encode(), "\u2029".encode())


def list_extension(name: str) -> str:
    """The lower-cased extension of a list's name or URL (a URL's query string is not part of it)."""
    if is_url(name):
        name = urllib.parse.urlsplit(name).path
    return os.path.splitext(name)[1].lower()


def _table_column(rows: list[list[str]], present: Callable[[str], bool]) -> list[str]:
    """The path cells of a CSV/TSV: the ``path`` column under a header, else the first column.

    A first row is a header when it names a path column, or when its first cell is neither an
    existing file (``present``) nor an image name nor a URL while the second row's is (``index,path``
    from ``cl-zoo embed`` is found by its ``path`` column; ``filename,label`` by the second rule).
    """
    rows = [r for r in rows if r and any(c.strip() for c in r) and not r[0].lstrip().startswith("#")]
    if not rows:
        return []
    header = [c.strip().lower() for c in rows[0]]
    named = next((header.index(name) for name in PATH_COLUMNS if name in header), None)
    if named is not None:
        return [r[named].strip() for r in rows[1:] if len(r) > named and r[named].strip()]

    def looks_like_path(cell: str) -> bool:
        cell = cell.strip()
        return is_image_path(cell) or is_url(cell) or present(cell)

    first = rows[0][0]
    if len(rows) > 1 and not looks_like_path(first) and looks_like_path(rows[1][0]):
        rows = rows[1:]
    return [r[0].strip() for r in rows if r[0].strip()]


def _parquet_paths(source: bytes | IO[bytes], name: str) -> list[str]:
    """The path column of a Parquet table: a :data:`PATH_COLUMNS` name, else the first text column.

    Only that column is read, in record batches, so ``cl-zoo embed``'s own ``.parquet`` output (a
    ``path`` column beside gigabytes of embeddings) is a usable list; the decoded paths are bounded
    by :data:`MAX_LIST_BYTES`, because a small file can expand into far more text than it holds.
    """
    pa = require("pyarrow", "a .parquet list of paths")
    import pyarrow.parquet as pq

    def textual(kind: pa.DataType) -> bool:
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))

    unreadable = (pa.ArrowException, OSError, ValueError, EOFError)
    try:
        table = pq.ParquetFile(pa.BufferReader(source) if isinstance(source, bytes) else source)
        fields = list(table.schema_arrow)
    except unreadable as exc:
        raise DataError(f"{name} is not a readable Parquet list of paths ({_one_line(exc)})") from None
    by_name: dict[str, pa.Field] = {}
    for field in fields:
        by_name.setdefault(field.name.strip().lower(), field)
    chosen = next((by_name[c] for c in PATH_COLUMNS if c in by_name), None)
    if chosen is None:
        chosen = next((f for f in fields if textual(f.type)), None)
        if chosen is None:
            raise DataError(f"{name} has no text column of paths (looked for {', '.join(PATH_COLUMNS)}, then any string column)")
    elif not textual(chosen.type):
        raise DataError(f"column {chosen.name!r} of {name} holds {chosen.type}, not text paths")
    # What the metadata declares is checked before a row is decoded: a few kilobytes of Parquet can
    # declare millions of rows, and decoding them first costs hundreds of MiB or a MemoryError.
    meta = table.metadata
    if meta.num_rows > MAX_LIST_ROWS:
        raise DataError(f"{name} declares {meta.num_rows} rows, more than {MAX_LIST_ROWS}, the limit for a list of paths")
    column = table.schema_arrow.get_field_index(chosen.name)
    declared = sum(meta.row_group(g).column(column).total_uncompressed_size for g in range(meta.num_row_groups)) \
        if column >= 0 and meta.num_columns == len(fields) else 0
    room = MAX_LIST_BYTES + 4 * meta.num_rows + (1 << 16)  # the characters plus Parquet's length prefixes and page headers
    if declared > room:
        raise DataError(f"the path column of {name} holds {_mib(declared)} uncompressed, more than the {_mib(room)} "
                        f"{meta.num_rows} paths within the {_mib(MAX_LIST_BYTES)} limit for a list of paths can take")
    cells: dict[str, None] = {}  # repeated rows are one entry (discovery deduplicates them anyway), in first-seen order
    total = 0
    limit = MAX_LIST_BYTES
    try:
        for batch in table.iter_batches(batch_size=8192, columns=[chosen.name]):
            for value in batch.column(0).to_pylist():
                value = (value or "").strip()
                if value:
                    total += len(value)
                    if total > limit:
                        raise DataError(f"the paths in {name} add up to more than {_mib(limit)}, the limit for a list of paths")
                    cells.setdefault(value)
    except unreadable as exc:
        raise DataError(f"{name} is not a readable Parquet list of paths ({_one_line(exc)})") from None
    return list(cells)


def parse_path_list(data: bytes, name: str, present: Callable[[str], bool] | None = None) -> list[str]:
    """The entries of a path list held in ``data``, as written (relative entries not yet joined).

    ``name`` (a path or URL) picks the format by its extension and names the list in errors;
    ``present`` says whether a cell is an existing file, for the CSV header rule of
    :func:`_table_column` (a remote list has no such test and relies on names alone). A
    ``.parquet`` list is a table (:func:`_parquet_paths`), a ``.csv``/``.tsv`` one too, so
    ``cl-zoo embed``'s own outputs or a ``filename,label`` sheet work; a ``.jsonl`` list has one JSON
    string per line (:func:`parse_json_lines`, e.g. an output's ``.paths.jsonl``); any other file has
    one path per line with ``#`` comments.
    """
    extension = list_extension(name)
    if extension in PARQUET_LIST_EXTENSIONS:
        return _parquet_paths(data, name)
    rows = sum(data.count(mark) for mark in _LINE_BREAKS)  # every break splitlines/csv honours, counted in the bytes
    if rows > MAX_LIST_ROWS:
        raise DataError(f"{name} has {rows} lines, more than {MAX_LIST_ROWS}, the limit for a list of paths")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{name} is neither an image (by extension) nor a UTF-8 list of paths") from None
    if extension in JSON_LIST_EXTENSIONS:
        return parse_json_lines(text, name)
    delimiter = TABLE_LIST_EXTENSIONS.get(extension)
    if delimiter is not None:
        try:
            return _table_column(list(csv.reader(io.StringIO(text), delimiter=delimiter)), present or (lambda _: False))
        except csv.Error as exc:
            raise DataError(f"{name} is not a readable CSV list of paths ({exc})") from None
    cells = [line.strip() for line in text.splitlines()]
    return [c for c in cells if c and not c.startswith("#")]


def _read_list(list_file: str) -> list[str]:
    """Entries of a local path list; relative entries are relative to the list's own folder.

    URL entries (``http://...``) stay URLs. The list is refused, with one :class:`DataError` line,
    when it is larger than :data:`MAX_LIST_BYTES` (for Parquet: when its path column is), before
    anything is read.
    """
    base = os.path.dirname(list_file)

    def present(cell: str) -> bool:
        return os.path.exists(cell if os.path.isabs(cell) else os.path.join(base, cell))

    limit = MAX_LIST_BYTES
    try:
        with open(list_file, "rb") as fh:
            if list_extension(list_file) in PARQUET_LIST_EXTENSIONS:
                cells = _parquet_paths(fh, list_file)
            else:
                size = os.fstat(fh.fileno()).st_size
                data = fh.read(limit + 1) if size <= limit else b""
                if size > limit or len(data) > limit:
                    raise DataError(
                        f"{list_file} is neither an image (by extension) nor a list of paths of at most "
                        f"{_mib(limit)} (it has {_mib(max(size, len(data)))})"
                    )
                cells = parse_path_list(data, list_file, present)
    except OSError as exc:
        raise DataError(f"cannot read {list_file}: {exc.strerror or _one_line(exc)}") from None
    return [c if is_url(c) else os.path.normpath(c if os.path.isabs(c) else os.path.join(base, c)) for c in cells]


def discover_images(paths: Iterable[str | os.PathLike[str]]) -> FoundImages:
    """Image files named by ``paths``, deduplicated, in sorted order.

    Folders are walked with :class:`LinkSafeWalk`: linked folders are followed once, never in a
    loop; the result's ``repeats`` counts the linked folders skipped as already walked, for the
    caller to report. Each entry may be an image file, a folder (searched recursively, hidden entries skipped) or a
    file listing paths (a ``.txt`` file one per line, ``#`` comments; a ``.jsonl`` file one JSON string per line; a
    ``.csv``/``.tsv``/``.parquet`` file gives its ``path`` column, or its first text one; URL entries
    stay URLs); any other file is refused (:data:`PATH_LIST_EXTENSIONS`). Files listed in a list are kept
    even when they are missing or broken, so that they show up in the failures report of whatever
    reads them; a path given directly that does not exist, or a source with no image at all, is a
    user mistake and raises :class:`DataError`.
    """
    found: set[str] = set()
    repeats = 0
    given = [os.fspath(p) for p in paths]
    if not given:
        raise DataError("no input paths given")
    for raw in given:
        path = os.path.normpath(raw)
        if os.path.isdir(path):
            images, skipped = _walk_images(path)
            repeats += skipped
            if not images:
                raise DataError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) found in folder {raw}")
        elif os.path.isfile(path) and is_image_path(path):
            images = [path]
        elif os.path.isfile(path) and list_extension(path) not in PATH_LIST_EXTENSIONS:
            raise DataError(f"{raw} is neither an image ({', '.join(sorted(IMAGE_EXTENSIONS))}) nor a list of paths "
                            f"({', '.join(sorted(PATH_LIST_EXTENSIONS))}); a list of paths is read only under one of those names")
        elif os.path.isfile(path):
            images = []
            for entry in _read_list(path):
                if os.path.isdir(entry):
                    listed, skipped = _walk_images(entry)
                    images.extend(listed)
                    repeats += skipped
                else:
                    images.append(entry)
            if not images:
                raise DataError(f"list file {raw} names no paths")
        elif os.path.lexists(path):
            raise DataError(f"{raw} is neither a file nor a folder")
        else:
            raise DataError(f"path does not exist: {raw}")
        found.update(images)
    result = FoundImages(sorted(found))
    result.repeats = repeats
    return result


def os_reason(exc: OSError) -> str:
    """A short failures-report phrase for an OS error, whichever module opened the file."""
    if exc.errno == errno.ENOENT:
        return "file not found"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EISDIR:
        return "is a directory"
    return exc.strerror or str(exc)


def _open_file(path: str):  # noqa: ANN202 - a binary file object
    return open_regular_file(path)  # a FIFO in a folder or list must not block the run


def to_rgb(img: Image.Image) -> Image.Image:
    """A decoded image as RGB, the one conversion every image gets, read from a file or handed over in memory.

    Palette transparency goes through RGBA (PIL warns otherwise); 16-bit greyscale (PNG/TIFF) is
    scaled to 8 bits instead of being clipped to white.
    """
    if img.mode == "P" and "transparency" in img.info:
        return img.convert("RGBA").convert("RGB")
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        return img.point(lambda v: v / 256).convert("L").convert("RGB")
    return img.convert("RGB")


def decode_image(source: bytes | bytearray | memoryview | IO[bytes], name: str, min_short_side: int | None = None) -> Image.Image:
    """Decode an image held in ``source`` (bytes, or a binary file open at its start) to RGB.

    The core of :func:`load_image`, for images that are not local files: a WebDataset tar member, a
    download. ``name`` only labels the :class:`ImageDecodeError`; the reasons are the same as for
    files, so a failures report reads alike whatever the images came from.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ImageDecodeError(name, "empty file")
        source = io.BytesIO(source)
    try:
        try:
            size: int | None = os.fstat(source.fileno()).st_size
        except (AttributeError, io.UnsupportedOperation):
            size = None  # an in-memory or remote file: PIL finds an empty one unrecognisable
        if size == 0:
            raise ImageDecodeError(name, "empty file")
        img = Image.open(source)
        with img:
            # Between 1x and 2x the limit PIL only warns; treat that as the refusal it stands for.
            limit = Image.MAX_IMAGE_PIXELS
            if limit and img.size[0] * img.size[1] > limit:
                raise ImageDecodeError(
                    name, f"decompression bomb ({img.size[0]}x{img.size[1]} pixels > limit {limit})"
                )
            if min_short_side and img.format == "JPEG":
                # draft() keeps both sides >= the requested box, so the shorter side stays >= min.
                img.draft("RGB", (min_short_side, min_short_side))
            rgb = to_rgb(img)
            rgb.load()
            return rgb
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(name, f"decompression bomb ({exc})") from None
    except UnidentifiedImageError:
        raise ImageDecodeError(name, "not an image (unrecognised format)") from None
    except OSError as exc:
        text = str(exc)
        if "truncated" in text or "broken data stream" in text or "premature end" in text.lower():
            raise ImageDecodeError(name, f"truncated image ({text})") from None
        if exc.errno is not None:
            raise ImageDecodeError(name, os_reason(exc)) from None
        raise ImageDecodeError(name, f"corrupt image ({text})") from None
    except (ValueError, SyntaxError, EOFError, IndexError, struct.error) as exc:
        # PIL plugins raise these on malformed headers.
        raise ImageDecodeError(name, f"corrupt image ({type(exc).__name__}: {exc})") from None


def load_image(path: str | os.PathLike[str], min_short_side: int | None = None) -> Image.Image:
    """Decode an image file to RGB (first frame of animations), raising :class:`ImageDecodeError`.

    With ``min_short_side``, JPEGs are decoded at the smallest DCT scale whose shorter side is still
    at least that many pixels; other formats are decoded in full. Images above PIL's
    decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``) are refused before any pixel is decoded.
    The file is streamed to PIL, never read whole: :func:`decode_image` does the decoding.
    """
    path = os.fspath(path)
    try:
        fh = _open_file(path)
    except OSError as exc:
        raise ImageDecodeError(path, os_reason(exc)) from None
    with fh:
        return decode_image(fh, path, min_short_side)


__all__ = [
    "IMAGE_EXTENSIONS",
    "JSON_LIST_EXTENSIONS",
    "MAX_LIST_BYTES",
    "MAX_LIST_ROWS",
    "PATH_LIST_EXTENSIONS",
    "PATH_COLUMNS",
    "FoundImages",
    "ImageDecodeError",
    "LinkSafeWalk",
    "decode_image",
    "discover_images",
    "is_hidden_name",
    "is_image_path",
    "is_url",
    "list_extension",
    "load_image",
    "os_reason",
    "parse_json_lines",
    "parse_path_list",
    "to_rgb",
]
