"""What this user already checked in the OpenVINO cache, remembered across processes by file identity.

Checking a cache entry from scratch means hashing ResNet-50's 94 MB ``model.bin`` against the
entry's record and running the compiled graph and the torch model on a probe image. Done by every
new process, that is a few percent of a 512-image embedding on 2 cores (docs/benchmarks.md, "On an
Intel Xeon with AMX"). Both checks give the same answer for the same bytes, so the answer is kept,
keyed by what the files are:

* a file's identity is ``(device, inode, size, mtime_ns, ctime_ns)`` of the file itself (never a
  symlink). Any write or replacement gives a new ctime or a new inode, and no unprivileged process
  can set ctime back, so a file with an identity seen before holds the bytes seen then;
* an identity within :data:`RACY_NS` of the clock when it is recorded is not recorded: a write in
  the same timestamp tick could keep it (git's "racy" rule, and the in-process memo's,
  :mod:`cl_zoo.backends.cache`). Files written moments ago are checked in full until they settle;
* the memo lives in the user's own state folder (:func:`state_root`: ``$CL_ZOO_STATE``, else
  ``$XDG_STATE_HOME/cl-zoo``, else ``~/.local/state/cl-zoo``), never in the cache, which may be a
  team's or a CI runner's. A cache restored from elsewhere has new inodes and ctimes, so nothing
  remembered here matches it, even if the state folder travelled with it.

The memo is advice, never required: a missing, unreadable, oversized or malformed memo file is an
empty memo, and a state folder that cannot be written only means checking again next time.
Writers replace the file atomically; two processes racing lose each other's additions, which costs a
check, not a wrong answer. Each table keeps its newest :data:`MAX_RECORDS` records.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Iterable

from cl_zoo.errors import ClZooError
from cl_zoo.fileio import atomic_write_text, read_bounded_json

MEMO_FORMAT = "cl-zoo-verified/1"
MEMO_NAME = "openvino-verified.json"
RACY_NS = 2_000_000_000
MAX_RECORDS = 256
_MEMO_MAX_BYTES = 1 << 20
_MAX_FOLDER_FILES = 64  # an entry holds 4-6 files and a blob or two; more is not an entry to remember

Identity = tuple[int, int, int, int, int]


def state_root() -> Path:
    """``$CL_ZOO_STATE``, else ``$XDG_STATE_HOME/cl-zoo``, else ``~/.local/state/cl-zoo``: this user's, never shared."""
    if os.environ.get("CL_ZOO_STATE"):
        return Path(os.environ["CL_ZOO_STATE"]).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path("~/.local/state").expanduser()) / "cl-zoo"


def file_identity(path: str | os.PathLike[str]) -> Identity | None:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of ``path`` if it is a regular file itself, else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(identity: Identity, now_ns: int | None = None) -> bool:
    """Whether ``identity`` is old enough to stand for its bytes (not changed within :data:`RACY_NS` of now)."""
    now = time.time_ns() if now_ns is None else now_ns
    return 0 < identity[4] and now - max(identity[3], identity[4]) > RACY_NS


def folder_identity(folder: Path, subfolders: Iterable[str] = ()) -> dict[str, list[int]] | None:
    """The identity of every file in ``folder`` and in its named ``subfolders`` (one level each).

    None when anything there is not a regular file or a folder (a symlink, a FIFO), when a named
    subfolder is itself not a plain folder, or when there are more files than an entry holds: such
    a folder is always checked in full.
    """
    out: dict[str, list[int]] = {}
    for prefix, where in (("", folder), *((f"{name}/", folder / name) for name in subfolders)):
        try:
            st = os.lstat(where)
        except FileNotFoundError:
            if prefix:
                continue  # a blob folder the plugin has not written yet
            return None
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        try:
            items = sorted(os.scandir(where), key=lambda e: e.name)
        except OSError:
            return None
        for item in items:
            if item.is_dir(follow_symlinks=False):
                continue  # sub-folders are covered only where named (another precision's blobs are not this graph's)
            identity = file_identity(item.path)
            if identity is None or len(out) >= _MAX_FOLDER_FILES:
                return None
            out[prefix + item.name] = list(identity)
    return out


class VerifiedMemo:
    """The state folder's memo: file digests by identity, and graphs that passed their probe."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else state_root() / MEMO_NAME

    def _load(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"format": MEMO_FORMAT, "digests": {}, "probes": {}}
        if file_identity(self.path) is None:
            return empty
        try:
            memo = read_bounded_json(self.path, _MEMO_MAX_BYTES, "verified-files memo")
        except ClZooError:
            return empty
        if not isinstance(memo, dict) or memo.get("format") != MEMO_FORMAT:
            return empty
        for table in ("digests", "probes"):
            if not isinstance(memo.get(table), dict):
                memo[table] = {}
        return memo

    def _store(self, table: str, key: str, value: Any) -> None:
        memo = self._load()
        records = memo[table]
        records.pop(key, None)
        records[key] = value  # newest last, so trimming drops the oldest
        for old in list(records)[: max(0, len(records) - MAX_RECORDS)]:
            del records[old]
        try:
            atomic_write_text(self.path, json.dumps(memo, separators=(",", ":")) + "\n")
        except OSError:
            pass  # a read-only state folder: the next process checks again

    def digest(self, path: Path, identity: Identity) -> str | None:
        """The sha256 remembered for the file at ``path`` with exactly ``identity``, if any."""
        record = self._load()["digests"].get(os.path.abspath(path))
        if isinstance(record, list) and len(record) == 6 and tuple(record[:5]) == identity and isinstance(record[5], str):
            return record[5]
        return None

    def remember_digest(self, path: Path, identity: Identity, sha256: str) -> None:
        if settled(identity):
            self._store("digests", os.path.abspath(path), [*identity, sha256])

    def probed(self, key: str, identity: dict[str, list[int]] | None) -> bool:
        """Whether the graph named ``key`` passed its probe with its files exactly as ``identity`` says."""
        return identity is not None and self._load()["probes"].get(key) == identity

    def remember_probe(self, key: str, identity: dict[str, list[int]] | None) -> None:
        """Record that ``key``'s graph passed, if every one of its files has settled."""
        if identity is not None and identity and all(settled(tuple(v)) for v in identity.values()):  # type: ignore[arg-type]
            self._store("probes", key, identity)


__all__ = ["MAX_RECORDS", "MEMO_FORMAT", "MEMO_NAME", "RACY_NS", "VerifiedMemo", "file_identity", "folder_identity",
           "settled", "state_root"]
