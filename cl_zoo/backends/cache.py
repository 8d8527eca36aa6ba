"""The OpenVINO cache's entries: one folder per converted graph, with a record of what it holds.

An entry is written whole or not at all (a temporary sibling renamed into place) and read only
after its record checks out: the weights digest it was converted from, and every file's size and
sha256. The fp32 conversion (:mod:`cl_zoo.backends.openvino`) and its int8 quantization
(:mod:`cl_zoo.backends.int8`) both keep entries here, which is why this is a module of its own
below both rather than a part of either.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from cl_zoo.backends.verified import RACY_NS, VerifiedMemo
from cl_zoo.errors import ClZooError
from cl_zoo.fileio import cache_root, read_bounded_json
from cl_zoo.optional import require

RECORD_NAME = "entry.json"


RECORD_FORMAT = "cl-zoo-openvino-entry/1"


_RECORD_MAX_BYTES = 1 << 16


_MAX_ENTRY_FILE_BYTES = 8 << 30  # far above any converted backbone; a larger "model.bin" is damage, not hashed


def openvino_cache_dir() -> Path:
    return cache_root() / "openvino"


# (path, device, inode, size, mtime_ns, ctime_ns) -> sha256, in this process: one engine setup
# checks the fp32 entry twice (``is_cached`` for ``auto``, then the runner) and an int8 run checks it a
# third time as the int8 entry's source; without this memo ResNet-50's 94 MB model.bin would be hashed
# three times, about a fifth of a warm int8 setup (docs/benchmarks.md, "On an AMD EPYC without AMX").
# A file changed in between has another stat, so it is hashed again. Across processes the same rule
# holds through the user's own memo (:mod:`cl_zoo.backends.verified`), never through anything kept
# in the cache itself.
_VERIFIED: dict[tuple[str, int, int, int, int, int], str] = {}


def _sha256(path: Path, size: int) -> str:
    try:
        st = os.stat(path)
        key: tuple[str, int, int, int, int, int] | None = (
            os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        key = None
    if key is not None and key[3] == size and key in _VERIFIED:
        return _VERIFIED[key]
    memo = VerifiedMemo()
    if key is not None and key[3] == size:
        remembered = memo.digest(path, key[1:])
        if remembered is not None:
            _VERIFIED[key] = remembered
            return remembered
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        left = size + 1  # a file that grew since it was measured shows up as a wrong digest, not an endless read
        while left > 0:
            chunk = fh.read(min(1 << 20, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    result = digest.hexdigest()
    # remembered only when read exactly ``size`` bytes, as stat said, and not "racy": a file changed
    # within the file system's timestamp granularity of the hash could keep its stat (git's rule)
    if key is not None and left == 1 and time.time_ns() - max(key[4], key[5]) > RACY_NS:
        _VERIFIED[key] = result
        memo.remember_digest(path, key[1:], result)
    return result


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file itself (not a symlink, FIFO or device), else None."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _file_records(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.name: {"size": p.stat().st_size, "sha256": _sha256(p, p.stat().st_size)}
            for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def entry_problem(folder: Path, expect: dict[str, Any]) -> str | None:
    """Why the cache entry ``folder`` cannot be used (None when it can), checked without trusting it.

    ``expect`` holds the record's fields that must match (the weights' sha256 for a converted graph;
    the source graph and calibration digests for an int8 one). Sub-folders named ``compiled*`` (the
    plugin's blob cache) and ``int8-*`` (entries of their own) are allowed; anything else the record
    does not list, and anything that is not a regular file, is damage.
    """
    import stat

    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return "not cached"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    size = _regular_size(folder / RECORD_NAME)
    if size is None or size > _RECORD_MAX_BYTES:
        return f"no readable {RECORD_NAME}"
    try:
        record = read_bounded_json(folder / RECORD_NAME, _RECORD_MAX_BYTES, "cache record")
    except ClZooError:
        return f"{RECORD_NAME} is not JSON"
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return f"{RECORD_NAME} is not a cl-zoo cache record"
    for name, value in expect.items():
        if record.get(name) != value:
            return f"made from other {name}"
    files = record.get("files")
    if not isinstance(files, dict) or not {"model.xml", "model.bin"} <= set(files):
        return f"{RECORD_NAME} lists no graph"
    try:
        present = list(os.scandir(folder))
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    for item in present:
        if item.name == RECORD_NAME or item.name in files:
            continue
        if item.is_dir(follow_symlinks=False) and (item.name.startswith("compiled") or item.name.startswith("int8-")):
            continue
        return f"holds {item.name}, which {RECORD_NAME} does not list"
    for name, want in files.items():
        if not isinstance(want, dict) or "/" in name or name.startswith("."):
            return f"{RECORD_NAME} lists {name!r}"
        size = _regular_size(folder / name)
        if size is None:
            return f"{name} is missing or not a regular file"
        if size != want.get("size") or size > _MAX_ENTRY_FILE_BYTES:
            return f"{name} has {size} bytes, the record says {want.get('size')}"
        if _sha256(folder / name, size) != want.get("sha256"):
            return f"{name} is not the file the record lists (sha256 differs)"
    return None


def entry_files(folder: Path) -> dict[str, Any]:
    """The file records of an entry :func:`entry_problem` passed (what an int8 entry says it came from)."""
    return read_bounded_json(folder / RECORD_NAME, _RECORD_MAX_BYTES, "cache record")["files"]


def discard_entry(folder: Path) -> None:
    """Remove a damaged entry without ever leaving a half-removed one at its key.

    The entry is renamed aside first (atomic), then deleted; a symlink or file at the key is
    unlinked (never followed).
    """
    if not os.path.lexists(folder):
        return
    if folder.is_symlink() or not folder.is_dir():
        try:
            os.unlink(folder)
        except FileNotFoundError:
            pass
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
    try:
        os.rename(folder, aside / "entry")
    except FileNotFoundError:
        pass  # another process discarded it first
    shutil.rmtree(aside, ignore_errors=True)


def save_graph_folder(graph: Any, folder: Path, files: dict[str, str], *, record: dict[str, Any],
                      replace: bool = False) -> None:
    """Write ``graph`` as ``folder/model.xml`` (+ ``.bin``) with the text ``files`` beside it, atomically.

    Everything goes to a temporary sibling that is renamed into place, so a reader never sees half
    a cache entry; the record (``record``'s fields plus every file's size and sha256,
    :func:`entry_problem`) is written last. ``replace`` first discards an entry already there (one
    found damaged or foreign). Losing the rename to another process that wrote the same entry is
    fine when theirs passes the same check.
    """
    ov = require("openvino", "--backend openvino")

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        ov.save_model(graph, str(tmp / "model.xml"), compress_to_fp16=False)
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        body = {"format": RECORD_FORMAT, **record, "files": _file_records(tmp)}
        (tmp / RECORD_NAME).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        if replace:
            discard_entry(folder)
        try:
            os.rename(tmp, folder)
        except OSError:
            if entry_problem(folder, record) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
