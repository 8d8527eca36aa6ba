"""What to embed: image files, folders, path lists and WebDataset shards, local or behind URLs.

``cl-zoo embed`` takes any mix of specs and turns them into one :class:`Inputs`: the image
references to decode, or the WebDataset tar shards to stream. Each job is left to the library
that already does it well, so that the rules stay the ones users know:

* local files, folders and path lists (txt/jsonl/csv/tsv/parquet) go through
  :func:`cl_zoo.data.images.discover_images`, the one discovery every command shares (same
  extensions, same hidden-file and symlink rules, same error lines);
* ``scheme://`` URLs (``http``, ``s3``, ``gs``... whatever fsspec has a backend for) are listed,
  checked and read through **fsspec**; ``file://`` URLs simply become local paths;
* brace lists such as ``data-{000..009}.tar`` are expanded by **braceexpand**, the expander
  WebDataset itself uses, so a pattern means here what it means to ``webdataset.WebDataset``;
* the shards themselves are streamed into samples by **webdataset**'s tar iterators, in
  :class:`cl_zoo.embedding.preprocess.TarBatches`; this module only finds and checks them.

Everything read here is bounded (a list by :data:`cl_zoo.data.images.MAX_LIST_BYTES` and
:data:`~cl_zoo.data.images.MAX_LIST_ROWS`, an image by :data:`MAX_IMAGE_BYTES`, a brace pattern by
:data:`MAX_EXPANSION` names, :data:`MAX_EXPANSION_CHARS` characters and :data:`MAX_BRACE_DEPTH`
levels, counted on the pattern before it is expanded; a remote list's rows never leave its scheme)
and every failure is one
:class:`~cl_zoo.errors.DataError` line, because a mistyped URL or a huge file named by accident
is a user's mistake, not a reason for a traceback or an exhausted machine.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import string
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Sequence

from cl_zoo.data import images
from cl_zoo.data.images import (
    IMAGE_EXTENSIONS,
    PATH_LIST_EXTENSIONS,
    discover_images,
    is_image_path,
    is_url,
    list_extension,
    parse_path_list,
)
from cl_zoo.errors import DataError
from cl_zoo.optional import require, require_url_reader
from cl_zoo.text import mib as _mib, one_line as _one_line

# One image read through a URL is refused past this size (a failure for that image, not a crash):
# far above any photo, far below what would hurt a DataLoader worker.
MAX_IMAGE_BYTES: int = 64 << 20
# Names ending so are WebDataset shards (tarfile reads the compressed ones transparently).
TAR_SUFFIXES: tuple[str, ...] = (".tar", ".tar.gz", ".tgz")
# List extensions that are read as lists without asking a remote store whether they are folders:
# the names a local path list may have, one table for both.
LIST_EXTENSIONS: frozenset[str] = PATH_LIST_EXTENSIONS
# A brace pattern expanding to more names than this is refused rather than materialised.
MAX_EXPANSION: int = 1_000_000
# ... or to more characters in all (1M names of 128 characters), or nested deeper than this: both
# are counted on the pattern (:func:`brace_size`) before braceexpand, which builds every range of
# a pattern in memory before yielding its first name, ever sees it.
MAX_EXPANSION_CHARS: int = 1 << 27
MAX_BRACE_DEPTH: int = 16
# Remote folders are walked at most this deep: an HTTP listing of a server-side symlink loop
# (``up -> ..``) has new URLs at every level, so only depth can end it.
MAX_REMOTE_DEPTH: int = 32
_CHUNK = 1 << 20
_CHECKERS = 16  # remote existence checks in flight at once (each is one HEAD or stat request)


class ReadError(DataError):
    """One input that cannot be read; ``reason`` is the short phrase a failures report wants."""

    def __init__(self, ref: str, reason: str) -> None:
        super().__init__(f"cannot read {ref}: {reason}")
        self.ref = ref
        self.reason = reason


@dataclass
class Inputs:
    """What one ``cl-zoo embed`` run reads: image references, or WebDataset shards (never both).

    ``files`` are absolute local paths or URLs kept as URLs, sorted and deduplicated as
    :func:`~cl_zoo.data.images.discover_images` returns them; ``tars`` are shard paths or URLs in
    the order given (a shard's position decides its output rows), deduplicated; ``repeats`` counts
    the linked local folders skipped because they were already walked.
    """

    files: list[str] = field(default_factory=list)
    tars: list[str] = field(default_factory=list)
    repeats: int = 0

    @property
    def is_webdataset(self) -> bool:
        return bool(self.tars)


def _reason(exc: BaseException) -> str:
    """A short phrase for why a read failed, from whichever layer (OS, fsspec, aiohttp) raised."""
    # fsspec's HTTP backend turns every failed request into a bare FileNotFoundError(url) whose
    # cause says what happened (404, refused connection...): that cause is the useful part.
    if isinstance(exc, FileNotFoundError) and exc.__cause__ is not None and not isinstance(exc.__cause__, FileNotFoundError):
        return _reason(exc.__cause__)
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "request_info"):  # aiohttp.ClientResponseError
        return _one_line(f"HTTP {status} {getattr(exc, 'message', '')}")
    if isinstance(exc, OSError) and exc.errno is not None:
        return images.os_reason(exc)
    if isinstance(exc, FileNotFoundError):  # fsspec's, without an errno
        return "not found"
    if isinstance(exc, ImportError):  # a missing fsspec backend: its message names the package
        return _one_line(exc)
    text = _one_line(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _local(ref: str) -> str:
    """``file://`` URLs as local paths (fsspec's reading: the rest of the URL is the path)."""
    if ref.lower().startswith("file://"):
        path = ref[len("file://"):]
        return path[len("localhost"):] if path.startswith("localhost/") else path
    return ref


def _url_path(ref: str) -> str:
    return urllib.parse.urlsplit(ref).path if is_url(ref) else ref


def is_tar(ref: str) -> bool:
    """Whether ``ref`` names a WebDataset shard (by its name: ``.tar``, ``.tar.gz`` or ``.tgz``)."""
    return _url_path(ref).lower().endswith(TAR_SUFFIXES)


def _filesystem(ref: str) -> tuple[Any, str]:
    """fsspec's file system and in-store path for a URL; an unknown scheme or a missing backend is one line."""
    fsspec = require_url_reader(ref)

    try:
        return fsspec.core.url_to_fs(ref)
    except Exception as exc:  # noqa: BLE001 - ValueError (unknown protocol), ImportError (backend)...
        raise ReadError(ref, _reason(exc)) from None


def _open_kwargs(fs: Any) -> dict[str, Any]:
    # fsspec's HTTP files fetch byte ranges by default, which needs Range support and re-requests
    # per block; block_size=0 is one streamed GET, which is how an image or a shard is read anyway.
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return {"block_size": 0} if {"http", "https"} & set(protocols) else {}


def open_input(ref: str) -> IO[bytes]:
    """A binary file for a local path or a URL, read front to back; failures raise :class:`ReadError`."""
    ref = _local(ref)
    if not is_url(ref):
        try:
            return open(ref, "rb")
        except OSError as exc:
            raise ReadError(ref, _reason(exc)) from None
    fs, path = _filesystem(ref)
    try:
        return fs.open(path, "rb", **_open_kwargs(fs))
    except Exception as exc:  # noqa: BLE001 - each backend raises its own types
        raise ReadError(ref, _reason(exc)) from None


def _known_size(fh: IO[bytes]) -> int | None:
    try:
        return os.fstat(fh.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        size = getattr(fh, "size", None)
        return size if isinstance(size, int) else None


def read_bytes(ref: str, max_bytes: int) -> bytes:
    """The content of a local file or URL, refused (:class:`ReadError`, one line) past ``max_bytes``.

    The size is checked before reading where the store tells it, and the read stops one byte past
    the bound where it does not (a streamed HTTP response without a length), so nothing larger
    than the bound is ever held.
    """
    with open_input(ref) as fh:
        try:
            size = _known_size(fh)
            if size is not None and size > max_bytes:
                raise ReadError(ref, f"{_mib(size)}, larger than the {_mib(max_bytes)} limit")
            chunks: list[bytes] = []
            total = 0
            while True:
                chunk = fh.read(min(_CHUNK, max_bytes + 1 - total))
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                total += len(chunk)
                if total > max_bytes:
                    raise ReadError(ref, f"larger than the {_mib(max_bytes)} limit")
        except ReadError:
            raise
        except Exception as exc:  # noqa: BLE001 - a dropped connection mid-read, an I/O error...
            raise ReadError(ref, _reason(exc)) from None


_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")  # braceexpand 0.1.7's own patterns
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase


def _brace_depth(pattern: str) -> int:
    depth = deepest = 0
    skip = False
    for ch in pattern:
        if skip:
            skip = False
        elif ch == "\\":
            skip = True
        elif ch == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "}":
            depth -= 1
    return deepest


def brace_size(pattern: str) -> tuple[int, int]:
    """(names, characters in all) that ``braceexpand(pattern)`` yields, counted without expanding.

    The grammar is braceexpand's, walked the way its ``parse_pattern``/``parse_sequence`` walk it
    (a product of literals and ``{...}`` items; an item is an integer or letter range, a comma
    sequence, or literal braces around a pattern), so ``d-{0..99999999}.tar`` costs microseconds
    instead of 8 GB. Integer ranges count each name at its widest (the wider end), so the
    characters are an upper bound. The caller bounds the depth first (:data:`MAX_BRACE_DEPTH`): the
    walk recurses once per level, as braceexpand does. Raises ``ValueError`` on unbalanced braces.
    """
    count, chars = 1, 0  # a product: count multiplies, each part's characters repeat for the others' names

    def times(part: tuple[int, int]) -> None:
        nonlocal count, chars
        chars = chars * part[0] + part[1] * count
        count *= part[0]

    start = pos = depth = 0
    while pos < len(pattern):
        ch = pattern[pos]
        if ch == "\\":
            pos += 2
            continue
        if ch == "{":
            if depth == 0 and pos > start:
                times((1, len(pattern[start:pos])))
                start = pos
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                expr = pattern[start + 1 : pos]
                item = _expression_size(expr)
                if item is None:  # literal braces around a pattern
                    inner = brace_size(expr)
                    times((inner[0], inner[1] + 2 * inner[0]))
                else:
                    times(item)
                start = pos + 1
        pos += 1
    if depth != 0:
        raise ValueError("unbalanced braces")
    if start < pos:
        times((1, len(pattern) - start))
    return count, chars


def _expression_size(expr: str) -> tuple[int, int] | None:
    match = _INT_RANGE.match(expr)
    if match:
        first, last, step_text = match.groups()
        step = (int(step_text) or 1) if step_text else 1
        a, b = int(first), int(last)
        names = (abs(b - a) // step) + 1
        padding = max(len(first), len(last)) if any(t.startswith(("0", "-0")) for t in (first, last) if t not in ("0", "-0")) else 0
        return names, names * max(padding, len(str(a)), len(str(b)))
    match = _CHAR_RANGE.match(expr)
    if match:
        first, last, step_text = match.groups()
        step = (int(step_text) or 1) if step_text else 1
        a, b = _ALPHABET.index(first), _ALPHABET.index(last)
        return (abs(b - a) // step) + 1, (abs(b - a) // step) + 1
    # a comma sequence: the items at depth 0 between commas, each a pattern of its own
    parts, start, pos, depth = [], 0, 0, 0
    while pos < len(expr):
        ch = expr[pos]
        if ch == "\\":
            pos += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not parts:
        return None
    parts.append(expr[start:])
    sizes = [brace_size(part) for part in parts]
    return sum(n for n, _ in sizes), sum(c for _, c in sizes)


def _check_brace_size(spec: str, ref: str) -> None:
    """Refuse a pattern that is too deep, names too many files or too many characters, before expanding it."""
    depth = _brace_depth(ref)
    if depth > MAX_BRACE_DEPTH:
        raise DataError(f"{spec[:200]} nests braces {depth} deep; at most {MAX_BRACE_DEPTH} levels are expanded")
    try:
        names, chars = brace_size(ref)
    except ValueError as exc:
        if str(exc) == "unbalanced braces":
            return  # not a pattern: braceexpand says so too, and the name is checked as given
        raise DataError(f"{spec[:200]}: {_one_line(exc)}") from None  # a range end too long for int()
    if names > MAX_EXPANSION:
        raise DataError(f"{spec[:200]} expands to {names} names, more than {MAX_EXPANSION}")
    if chars > MAX_EXPANSION_CHARS:
        raise DataError(f"{spec[:200]} expands to {chars} characters of names, more than {MAX_EXPANSION_CHARS}")


def _expand(spec: str) -> list[str]:
    """``spec`` with its brace lists expanded; an existing local path with braces in its name is kept."""
    ref = _local(spec)
    if "{" not in ref or (not is_url(ref) and os.path.lexists(ref)):
        return [ref]
    require("braceexpand", "a brace pattern (data-{000..009}.tar)")
    from braceexpand import UnbalancedBracesError, braceexpand

    _check_brace_size(spec, ref)
    try:
        refs = list(itertools.islice(braceexpand(ref), MAX_EXPANSION + 1))
    except UnbalancedBracesError:
        return [ref]  # not a pattern: the name itself is checked as given
    if refs == [ref]:
        return refs
    if len(refs) > MAX_EXPANSION:
        raise DataError(f"{spec} expands to more than {MAX_EXPANSION} names")
    if not is_url(ref):
        missing = next((r for r in refs if not os.path.lexists(r)), None)
        if missing is not None:
            raise DataError(f"{missing} does not exist (expanded from {spec})")
    return refs


def _scheme_family(scheme: str) -> str:
    scheme = scheme.lower()
    return "http" if scheme in ("http", "https") else scheme


def join_list_entry(list_ref: str, cell: str) -> str:
    """A remote list's entry as a URL: relative entries are relative to the list's own folder.

    A remote list never switches scheme (http and https count as one): its rows are whatever the
    server says, so a ``file:///home/...`` row, or one that joins into a local path, would make
    cl-zoo read local files the user never named and write their names into the outputs.
    """
    parts = urllib.parse.urlsplit(list_ref)
    if is_url(cell):
        joined = cell
    elif parts.scheme.lower() in ("http", "https"):
        joined = urllib.parse.urljoin(list_ref, cell)
    else:
        path = posixpath.normpath(posixpath.join(posixpath.dirname(parts.path), cell))
        joined = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    if not is_url(joined) or _scheme_family(urllib.parse.urlsplit(joined).scheme) != _scheme_family(parts.scheme):
        raise DataError(f"{list_ref} lists {_one_line(repr(cell))}, which is not on {parts.scheme}://; a remote list may only "
                        "name entries relative to itself or on its own scheme")
    return joined


def _remote_list(ref: str) -> list[str]:
    """Entries of a list behind a URL (downloaded whole, within :data:`~cl_zoo.data.images.MAX_LIST_BYTES`)."""
    data = read_bytes(ref, images.MAX_LIST_BYTES)
    return [join_list_entry(ref, cell) for cell in parse_path_list(data, ref)]


def _remote_folder(fs: Any, path: str, ref: str) -> list[str]:
    """Image URLs under a remote folder, hidden names skipped as in local folders."""
    try:
        names = fs.find(path, maxdepth=MAX_REMOTE_DEPTH)
    except Exception as exc:  # noqa: BLE001 - each backend raises its own types
        raise ReadError(ref, _reason(exc)) from None
    prefix = path.rstrip("/") + "/"
    found = []
    for name in names:
        relative = name[len(prefix):] if name.startswith(prefix) else name
        if is_image_path(_url_path(name)) and not any(images.is_hidden_name(p) for p in relative.split("/") if p):
            found.append(fs.unstrip_protocol(name))
    return found


def _is_remote_folder(fs: Any, path: str, ref: str) -> bool:
    if ref.endswith("/"):
        return True
    try:
        return bool(fs.isdir(path))
    except Exception:  # noqa: BLE001 - a store that cannot tell is read as a list, which says why it fails
        return False


def _check_reachable(refs: Sequence[str]) -> None:
    """Raise for the first URL (in the order given) that does not exist or cannot be reached."""

    def check(ref: str) -> str | None:
        try:
            fs, path = _filesystem(ref)
            fs.info(path)
            return None
        except ReadError as exc:
            return exc.reason
        except Exception as exc:  # noqa: BLE001 - each backend raises its own types
            return _reason(exc)

    if not refs:
        return
    with ThreadPoolExecutor(min(_CHECKERS, len(refs))) as pool:
        for ref, reason in zip(refs, pool.map(check, refs), strict=True):
            if reason is not None:
                raise ReadError(ref, reason)


def resolve_inputs(specs: Sequence[str | os.PathLike[str]]) -> Inputs:
    """The image references or WebDataset shards named by ``specs``.

    Each spec is a local path or a URL, with brace lists (``data-{000..009}.tar``) expanded; a local
    pattern whose names do not all exist is refused naming the first missing one. A name ending in
    ``.tar`` (or ``.tar.gz``/``.tgz``) is a shard, given directly or listed in a list file; shards
    are checked to exist, local ones on disk and remote ones with one request each (concurrently).
    Anything else local goes through :func:`~cl_zoo.data.images.discover_images`, keeping its rules
    and errors. A URL is an image by its extension, a list by ``.txt``/``.jsonl``/``.csv``/``.tsv``/
    ``.parquet``, a folder when it ends in ``/`` or its store says so (walked through fsspec), else a list.
    Images named directly by URL are checked to exist; entries of lists are kept unchecked, as
    local lists' are, so that a missing one shows up in the failures report. Mixing shards with
    images in one call is refused: the two are embedded by different loops with different keys.
    """
    given = [os.fspath(s) for s in specs]
    if not given:
        raise DataError("no input paths given")
    files: set[str] = set()
    tars: dict[str, None] = {}
    to_check: list[str] = []  # URLs named directly: checked together at the end
    repeats = 0

    def add(entry: str, *, check: bool) -> None:
        entry = _local(entry)
        if is_tar(entry):
            if is_url(entry):
                if entry not in tars:
                    to_check.append(entry)
                tars.setdefault(entry)
                return
            if not os.path.isfile(entry):
                if os.path.lexists(entry):
                    raise DataError(f"WebDataset shard {entry} is not a file")
                raise DataError(f"WebDataset shard does not exist: {entry}")
            tars.setdefault(os.path.abspath(entry))
        elif is_url(entry):
            if check and entry not in files:
                to_check.append(entry)
            files.add(entry)
        else:
            files.add(os.path.abspath(entry))

    for spec in given:
        for ref in _expand(spec):
            if not is_url(ref):
                if is_tar(ref):
                    add(ref, check=True)
                    continue
                found = discover_images([ref])
                repeats += found.repeats
                for entry in found:
                    add(entry, check=False)
                continue
            fs, path = _filesystem(ref)
            extension = list_extension(ref)
            if is_tar(ref) or extension in IMAGE_EXTENSIONS:
                add(ref, check=True)
            elif extension not in LIST_EXTENSIONS and _is_remote_folder(fs, path, ref):
                found_urls = _remote_folder(fs, path, ref)
                if not found_urls:
                    raise DataError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) found in folder {spec}")
                for entry in found_urls:
                    add(entry, check=False)
            else:
                entries = _remote_list(ref)
                if not entries:
                    raise DataError(f"list file {ref} names no paths")
                for entry in entries:
                    add(entry, check=False)
    if tars and files:
        raise DataError(
            f"{next(iter(tars))} is a WebDataset shard and {min(files)} an image: cannot mix WebDataset "
            "shards with image files; embed them in separate runs"
        )
    _check_reachable(to_check)
    return Inputs(files=sorted(files), tars=list(tars), repeats=repeats)


__all__ = [
    "LIST_EXTENSIONS",
    "MAX_BRACE_DEPTH",
    "MAX_EXPANSION",
    "MAX_EXPANSION_CHARS",
    "MAX_IMAGE_BYTES",
    "MAX_REMOTE_DEPTH",
    "TAR_SUFFIXES",
    "Inputs",
    "brace_size",
    "ReadError",
    "is_tar",
    "is_url",
    "open_input",
    "read_bytes",
    "resolve_inputs",
]
