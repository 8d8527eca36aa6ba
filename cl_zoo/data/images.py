"""Finding image files and decoding them robustly.

Every command that reads user images (``embed``, ``search``, ``knn``...) goes through these two
functions so that they agree on which files count as images, in which order they come, and why a
file was refused. Decoding never raises a bare PIL/OS error: a bad file becomes an
:class:`ImageDecodeError` carrying a short ``reason`` that goes into a failures report, so one
truncated JPEG among a million skips one row instead of ending the run.

JPEGs are decoded with PIL's draft mode: libjpeg scales the DCT by 1/2, 1/4 or 1/8 while decoding,
so a 2400x1600 photo needed at 256 px costs a fraction of a full decode.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import struct
import warnings
from typing import Callable, Iterable, Iterator

from PIL import Image, UnidentifiedImageError

from cl_zoo.errors import DataError

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


def _hidden(name: str) -> bool:
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
        self.hidden = hidden or _hidden
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
PATH_COLUMNS = ("path", "filepath", "file_path", "filename", "file", "image", "image_path")


def _table_column(rows: list[list[str]], base: str) -> list[str]:
    """The path cells of a CSV/TSV: the ``path`` column under a header, else the first column.

    A first row is a header when it names a path column, or when its first cell is neither an
    existing file nor an image name while the second row's is (``index,path`` from ``cl-zoo embed``
    is found by its ``path`` column; ``filename,label`` by the second rule).
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
        return is_image_path(cell) or os.path.exists(cell if os.path.isabs(cell) else os.path.join(base, cell))

    first = rows[0][0]
    if len(rows) > 1 and not looks_like_path(first) and looks_like_path(rows[1][0]):
        rows = rows[1:]
    return [r[0].strip() for r in rows if r[0].strip()]


def _read_list(list_file: str) -> list[str]:
    """Entries of a path list; relative entries are relative to the list's own folder.

    A ``.csv``/``.tsv`` list is read as a table (see :func:`_table_column`), so ``cl-zoo embed``'s
    own ``embeddings.csv`` or a ``filename,label`` sheet works; any other file has one path per
    line with ``#`` comments.
    """
    try:
        with open(list_file, encoding="utf-8-sig", newline="") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        raise DataError(f"{list_file} is neither an image (by extension) nor a UTF-8 list of paths") from None
    except OSError as exc:
        raise DataError(f"cannot read {list_file}: {exc.strerror}") from None
    base = os.path.dirname(list_file)
    delimiter = TABLE_LIST_EXTENSIONS.get(os.path.splitext(list_file)[1].lower())
    if delimiter is not None:
        try:
            cells = _table_column(list(csv.reader(io.StringIO(text), delimiter=delimiter)), base)
        except csv.Error as exc:
            raise DataError(f"{list_file} is not a readable CSV list of paths ({exc})") from None
    else:
        cells = [line.strip() for line in text.splitlines()]
        cells = [c for c in cells if c and not c.startswith("#")]
    return [os.path.normpath(c if os.path.isabs(c) else os.path.join(base, c)) for c in cells]


def discover_images(paths: Iterable[str | os.PathLike[str]]) -> FoundImages:
    """Image files named by ``paths``, deduplicated, in sorted order.

    Folders are walked with :class:`LinkSafeWalk`: linked folders are followed once, never in a
    loop; the result's ``repeats`` counts the linked folders skipped as already walked, for the
    caller to report. Each entry may be an image file, a folder (searched recursively, hidden entries skipped) or a
    text file listing paths (one per line, ``#`` comments; a ``.csv``/``.tsv`` file gives its
    ``path`` column, or its first). Files listed in a text file are kept
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


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "file not found"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EISDIR:
        return "is a directory"
    return exc.strerror or str(exc)


def _open_file(path: str):  # noqa: ANN202 - a binary file object
    return open(path, "rb")


def load_image(path: str | os.PathLike[str], min_short_side: int | None = None) -> Image.Image:
    """Decode an image to RGB (first frame of animations), raising :class:`ImageDecodeError`.

    With ``min_short_side``, JPEGs are decoded at the smallest DCT scale whose shorter side is still
    at least that many pixels; other formats are decoded in full. Images above PIL's
    decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``) are refused before any pixel is decoded.
    """
    path = os.fspath(path)
    try:
        fh = _open_file(path)
    except OSError as exc:
        raise ImageDecodeError(path, _os_reason(exc)) from None
    with fh:
        try:
            if os.fstat(fh.fileno()).st_size == 0:
                raise ImageDecodeError(path, "empty file")
            img = Image.open(fh)
            with img:
                # Between 1x and 2x the limit PIL only warns; treat that as the refusal it stands for.
                limit = Image.MAX_IMAGE_PIXELS
                if limit and img.size[0] * img.size[1] > limit:
                    raise ImageDecodeError(
                        path, f"decompression bomb ({img.size[0]}x{img.size[1]} pixels > limit {limit})"
                    )
                if min_short_side and img.format == "JPEG":
                    # draft() keeps both sides >= the requested box, so the shorter side stays >= min.
                    img.draft("RGB", (min_short_side, min_short_side))
                if img.mode == "P" and "transparency" in img.info:
                    rgb = img.convert("RGBA").convert("RGB")
                elif img.mode in ("I;16", "I;16B", "I;16L", "I"):
                    # 16-bit greyscale PNG/TIFF: scale to 8 bits instead of clipping to white.
                    rgb = img.point(lambda v: v / 256).convert("L").convert("RGB")
                else:
                    rgb = img.convert("RGB")
                rgb.load()
                return rgb
        except ImageDecodeError:
            raise
        except Image.DecompressionBombError as exc:
            raise ImageDecodeError(path, f"decompression bomb ({exc})") from None
        except UnidentifiedImageError:
            raise ImageDecodeError(path, "not an image (unrecognised format)") from None
        except OSError as exc:
            text = str(exc)
            if "truncated" in text or "broken data stream" in text or "premature end" in text.lower():
                raise ImageDecodeError(path, f"truncated image ({text})") from None
            if exc.errno is not None:
                raise ImageDecodeError(path, _os_reason(exc)) from None
            raise ImageDecodeError(path, f"corrupt image ({text})") from None
        except (ValueError, SyntaxError, EOFError, IndexError, struct.error) as exc:
            # PIL plugins raise these on malformed headers.
            raise ImageDecodeError(path, f"corrupt image ({type(exc).__name__}: {exc})") from None


__all__ = [
    "IMAGE_EXTENSIONS",
    "FoundImages",
    "ImageDecodeError",
    "LinkSafeWalk",
    "discover_images",
    "is_image_path",
    "load_image",
]
