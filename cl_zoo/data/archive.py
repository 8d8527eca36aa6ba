"""Dataset archives (.tar, .tar.gz, .tgz, .zip) extracted once into a content-addressed cache.

The cache folder is named after the archive's sha256, so a re-downloaded or moved copy of the same
archive reuses the extraction, and a changed archive never sees stale files. Extraction goes to a
temporary folder beside the final one and is renamed into place with a marker inside, so a killed
run never leaves a half-extracted folder that a later run would trust. Before that, the member
sizes the archive declares are summed against a bound and the free space: a small archive
declaring gigabytes is refused before anything is written.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import atomic_write_text, cache_root, read_bounded_json, sha256_file  # cache_root: re-exported

ARCHIVE_SUFFIXES: tuple[str, ...] = (".tar.gz", ".tgz", ".tar", ".zip")
COMPLETE_MARKER = ".cl-zoo-complete"


def is_archive(path: str | os.PathLike) -> bool:
    return os.fspath(path).lower().endswith(ARCHIVE_SUFFIXES)


def archive_sha256(path: Path) -> str:
    """sha256 of the archive, memoised by (real path, size, mtime) so large archives hash once."""
    st = path.stat()
    memo_dir = cache_root() / "datasets" / ".hashes"
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    memo = memo_dir / key
    try:
        recorded = read_bounded_json(memo, max_bytes=4096, what="hash memo")
        if isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str):
            return recorded["sha256"]
    except ClZooError:
        pass  # absent or damaged: hash again
    digest = sha256_file(path)
    try:
        atomic_write_text(memo, json.dumps({"sha256": digest, "path": str(path.resolve())}))
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return digest


# What an archive may unpack to: this many times its own size (images barely compress, so a dataset
# archive unpacks to about its size), but never less than the floor, for small archives of text.
MAX_EXPANSION = 100
MIN_EXTRACT_BOUND = 256 << 20
FREE_SPACE_MARGIN = 64 << 20  # left free after extraction, for the cache's own files and the run


def _declared_sizes(archive: Path, stop_above: int) -> int:
    """The sum of the member sizes ``archive`` declares, read from its headers; reading stops as soon
    as it passes ``stop_above`` (a bomb's first header is enough)."""
    total = 0
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                total += info.file_size
                if total > stop_above:
                    break
        return total
    with tarfile.open(archive) as tf:
        while (member := tf.next()) is not None:
            total += member.size if member.isfile() else 0
            if total > stop_above:
                break
    return total


def check_extract_size(archive: Path, base: Path) -> None:
    """Refuse, before a byte is written, an archive declaring more than it plausibly holds
    (:data:`MAX_EXPANSION` times its size) or more than ``base`` has free."""
    size = archive.stat().st_size
    bound = max(MAX_EXPANSION * size, MIN_EXTRACT_BOUND)
    try:
        declared = _declared_sizes(archive, bound)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise DataError(f"unreadable archive {archive}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if declared > bound:
        raise DataError(f"archive {archive} declares at least {_mib(declared)} of files, more than the {_mib(bound)} cl-zoo "
                        f"extracts from a {_mib(size)} archive; refusing to extract it (unpack it yourself and pass the folder)")
    free = shutil.disk_usage(base).free
    if declared + FREE_SPACE_MARGIN > free:
        raise DataError(f"archive {archive} unpacks to {_mib(declared)} but the dataset cache {base} has {_mib(free)} free; "
                        "free some space or set CL_ZOO_CACHE to a larger disk")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _extract_into(archive: Path, target: Path) -> None:
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    parts = Path(member).parts
                    if member.startswith(("/", "\\")) or ".." in parts:
                        raise DataError(f"unsafe path {member!r} inside archive {archive}")
                zf.extractall(target)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(target, filter="data")  # refuses absolute paths, '..', devices
    except DataError:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise DataError(f"unreadable archive {archive}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def extract_archive(archive: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Extract ``archive`` once and return the folder holding its contents."""
    path = Path(archive).expanduser()
    if not path.is_file():
        raise DataError(f"archive not found: {path}")
    if not is_archive(path):
        raise DataError(f"not a supported archive: {path} (expected .tar, .tar.gz, .tgz or .zip)")
    base = Path(cache_dir) if cache_dir is not None else cache_root() / "datasets"
    final = base / archive_sha256(path)[:16]
    if (final / COMPLETE_MARKER).exists():
        return final
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create dataset cache {base}: {exc.strerror}") from None
    with open(base / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes extracting the same archive wait for one
        if (final / COMPLETE_MARKER).exists():
            return final
        if final.exists():  # left by a crash from an older layout: never trust it
            shutil.rmtree(final, ignore_errors=True)
        check_extract_size(path, base)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=base))
        try:
            _extract_into(path, tmp)
            (tmp / COMPLETE_MARKER).write_text(json.dumps({"archive": str(path.resolve())}) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
