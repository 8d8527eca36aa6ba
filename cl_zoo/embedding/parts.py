"""The progress folder of an embed run (``emb.parts/``, ``DIR/.parts/``): recognised before it is touched.

Its name is derived from ``--out``, so a folder of the user's can already hold it (``data.parts/``
beside ``--out data.npy``). A run writes into it and deletes it at the end; before doing either it
checks that every entry is one an embed run writes, by content and not by name: the progress
manifest (a JSON object with the run's digests), ``part-NNNNN.npz`` archives holding exactly the
arrays :func:`cl_zoo.embedding.progress.save_chunk` stores, and the hidden temporaries of
:func:`cl_zoo.fileio.atomic_path` a killed run may leave. Anything else (a file of the user's, a
sub-folder, a link, a folder that is itself a link) is refused in one line naming it, with or
without ``--resume``/``--force``: those flags decide what happens to a run's progress, never to
somebody else's files.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import read_bounded_json

# The progress folder's manifest (written by cl_zoo.embedding.progress, which imports these).
PROGRESS_MANIFEST = "manifest.json"
MAX_PROGRESS_MANIFEST_BYTES = 1 << 16  # ten fields of digests and settings: about 600 bytes

# What progress_manifest() records; a manifest without these keys is not a progress manifest.
PROGRESS_KEYS = frozenset({"count", "paths_sha256", "model_sha256", "preprocess", "batch_size", "chunk_size"})
PART_MEMBERS = frozenset({"features.npy", "indices.npy", "fail_indices.npy", "fail_reasons.npy"})
# Each input's size and modification time when its chunk was saved (absent from older versions' parts).
STATS_MEMBER = "stats.npy"
_PART = re.compile(r"^part-\d{5,}\.npz$")
# atomic_path's temporaries: "." + final name + "." + mkstemp's 8 random characters + suffix.
_TEMPORARY = re.compile(r"^\.(?:part-\d{5,}\.npz\.[a-z0-9_]{8}\.npz|manifest\.json\.[a-z0-9_]{8}\.tmp)$")


def _is_progress_manifest(path: Path) -> bool:
    try:
        data = read_bounded_json(path, max_bytes=MAX_PROGRESS_MANIFEST_BYTES, what="progress manifest")
    except ClZooError:
        return False
    return isinstance(data, dict) and PROGRESS_KEYS <= data.keys()


def _is_progress_part(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return set(archive.namelist()) in (PART_MEMBERS, PART_MEMBERS | {STATS_MEMBER})
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return False


def _foreign_entry(entry: Path) -> str | None:
    """Why ``entry`` is not something an embed run wrote into its progress folder (None: it is)."""
    if entry.is_symlink():
        return "a symbolic link"
    if not entry.is_file():
        return "not a regular file"
    if _TEMPORARY.match(entry.name):
        return None
    if entry.name == PROGRESS_MANIFEST:
        return None if _is_progress_manifest(entry) else "not an embed progress manifest"
    if _PART.match(entry.name):
        return None if _is_progress_part(entry) else "not an embed progress part"
    return "not a file an embed run writes"


def check_progress_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` exists; one :class:`DataError` line when it exists and is not an embed
    run's progress folder (so a run may neither use nor delete it)."""
    folder = Path(folder)
    if not os.path.lexists(folder):
        return False
    advice = "move it away or choose another --out"
    if folder.is_symlink():
        raise DataError(f"{folder} is a symbolic link; cl-zoo keeps an embed run's progress there and will not write "
                        f"through or delete a link: remove it, or choose another --out")
    if not folder.is_dir():
        raise DataError(f"{folder} exists and is not a folder; cl-zoo keeps an embed run's progress there: {advice}")
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise DataError(f"cannot read {folder} ({exc.strerror or exc})") from None
    for entry in entries:
        why = _foreign_entry(entry)
        if why is not None:
            raise DataError(f"{folder} holds {entry.name} ({why}), so it is not an embed run's progress folder; cl-zoo "
                            f"will neither use nor delete it: {advice}")
    return True


def discard_progress(folder: str | os.PathLike[str]) -> None:
    """Delete an embed run's progress folder: its own files, then the folder once empty.

    Refuses (before deleting anything) a folder holding anything else; a file that vanished in the
    meantime (another rank, a second run) is not an error.
    """
    folder = Path(folder)
    if not check_progress_folder(folder):
        return
    for entry in folder.iterdir():
        if _foreign_entry(entry) is None:
            entry.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        # Something was added after the check: it stays, and so does the folder.
        pass


__all__ = ["PART_MEMBERS", "STATS_MEMBER", "PROGRESS_KEYS", "check_progress_folder", "discard_progress"]
