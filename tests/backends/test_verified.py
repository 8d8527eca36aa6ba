"""The memo of verified cache files: remembered across processes by file identity, in the user's state folder only."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from cl_zoo.backends import cache as cache_mod
from cl_zoo.backends import verified
from cl_zoo.backends.cache import RECORD_FORMAT, RECORD_NAME, entry_problem
from cl_zoo.backends.verified import MAX_RECORDS, MEMO_NAME, VerifiedMemo, file_identity, folder_identity, state_root


def _entry(folder: Path) -> None:
    folder.mkdir(parents=True)
    files = {}
    for name, body in (("model.xml", b"<net/>"), ("model.bin", os.urandom(4096))):
        (folder / name).write_bytes(body)
        files[name] = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    (folder / RECORD_NAME).write_text(json.dumps({"format": RECORD_FORMAT, "weights": "w", "files": files}))


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("CL_ZOO_STATE", str(folder))
    monkeypatch.setattr(verified, "RACY_NS", 0)  # files written just now count as settled
    monkeypatch.setattr(cache_mod, "RACY_NS", 0)
    return folder


@pytest.fixture()
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: calls.append(1) or real(*a))
    return calls


def test_state_root_is_the_users_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CL_ZOO_STATE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "shared-cache"))
    assert state_root() == tmp_path / "xdg" / "cl-zoo"  # never under the cache, which may be shared
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_root() == tmp_path / "home" / ".local" / "state" / "cl-zoo"


def test_a_digest_is_remembered_across_processes_and_a_change_is_still_seen(tmp_path: Path, state: Path, hashes: list[int]) -> None:
    folder = tmp_path / "cache" / "entry"
    _entry(folder)
    hashes.clear()
    assert entry_problem(folder, {"weights": "w"}) is None and len(hashes) == 2
    assert (state / MEMO_NAME).is_file() and sorted(p.name for p in folder.iterdir()) == ["entry.json", "model.bin", "model.xml"]
    cache_mod._VERIFIED.clear()  # a new process: only the state folder remembers
    assert entry_problem(folder, {"weights": "w"}) is None and len(hashes) == 2
    bin_path = folder / "model.bin"
    time.sleep(0.05)  # past the file system's timestamp tick (the memo's settling rule is switched off here)
    st = os.stat(bin_path)
    with open(bin_path, "r+b") as fh:  # same size, mtime put back: the new ctime still shows
        fh.write(b"\0" * 16)
    os.utime(bin_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    cache_mod._VERIFIED.clear()
    assert entry_problem(folder, {"weights": "w"}) == "model.bin is not the file the record lists (sha256 differs)"


def test_a_file_written_moments_ago_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashes: list[int]) -> None:
    monkeypatch.setenv("CL_ZOO_STATE", str(tmp_path / "state"))
    folder = tmp_path / "entry"
    _entry(folder)  # "racy": a write in the same timestamp tick could keep its identity
    hashes.clear()
    assert entry_problem(folder, {"weights": "w"}) is None
    cache_mod._VERIFIED.clear()
    assert entry_problem(folder, {"weights": "w"}) is None
    assert len(hashes) == 4 and not (tmp_path / "state" / MEMO_NAME).exists()


@pytest.mark.parametrize("body", [b"\xff not json", b"[1, 2]", b'{"format": "other"}',
                                  b'{"format": "cl-zoo-verified/1", "digests": 3, "probes": []}'])
def test_an_unreadable_memo_is_an_empty_one(tmp_path: Path, state: Path, hashes: list[int], body: bytes) -> None:
    folder = tmp_path / "entry"
    _entry(folder)
    state.mkdir()
    (state / MEMO_NAME).write_bytes(body)
    hashes.clear()
    assert entry_problem(folder, {"weights": "w"}) is None and len(hashes) == 2
    assert json.loads((state / MEMO_NAME).read_text())["format"] == "cl-zoo-verified/1"  # rewritten whole


def test_an_oversized_or_special_memo_is_not_read(tmp_path: Path, state: Path) -> None:
    state.mkdir()
    memo = VerifiedMemo()
    with open(state / MEMO_NAME, "wb") as fh:
        fh.truncate(64 << 20)  # declared far beyond any memo: refused before a byte is parsed
    identity = (1, 2, 3, 4, 5)
    assert memo.digest(tmp_path / "x", identity) is None
    (state / MEMO_NAME).unlink()
    os.mkfifo(state / MEMO_NAME)  # would block a reader forever
    assert memo.digest(tmp_path / "x", identity) is None


def test_a_read_only_state_folder_only_means_checking_again(tmp_path: Path, state: Path, hashes: list[int]) -> None:
    state.write_text("a file where the folder should be")  # nothing can be written under it
    folder = tmp_path / "entry"
    _entry(folder)
    hashes.clear()
    assert entry_problem(folder, {"weights": "w"}) is None
    cache_mod._VERIFIED.clear()
    assert entry_problem(folder, {"weights": "w"}) is None and len(hashes) == 4


def test_the_memo_keeps_its_newest_records(tmp_path: Path, state: Path) -> None:
    memo = VerifiedMemo()
    for i in range(MAX_RECORDS + 5):
        memo.remember_digest(tmp_path / f"f{i}", (1, i, 3, 4, 5), f"{i:064x}")
    digests = json.loads((state / MEMO_NAME).read_text())["digests"]
    assert len(digests) == MAX_RECORDS
    assert memo.digest(tmp_path / "f0", (1, 0, 3, 4, 5)) is None
    assert memo.digest(tmp_path / f"f{MAX_RECORDS + 4}", (1, MAX_RECORDS + 4, 3, 4, 5)) == f"{MAX_RECORDS + 4:064x}"


def test_folder_identity_covers_named_blob_folders_and_refuses_links(tmp_path: Path) -> None:
    folder = tmp_path / "entry"
    _entry(folder)
    (folder / "compiled-bf16").mkdir()
    (folder / "compiled-bf16" / "1.blob").write_bytes(b"b")
    (folder / "compiled-fp32").mkdir()
    (folder / "compiled-fp32" / "2.blob").write_bytes(b"f")
    got = folder_identity(folder, ["compiled-bf16", "compiled-int8-not-there"])
    assert got is not None and sorted(got) == ["compiled-bf16/1.blob", "entry.json", "model.bin", "model.xml"]
    assert got["model.bin"] == list(file_identity(folder / "model.bin"))  # type: ignore[arg-type]
    (folder / "compiled-bf16" / "link.blob").symlink_to(folder / "model.bin")
    assert folder_identity(folder, ["compiled-bf16"]) is None
    (folder / "compiled-bf16" / "link.blob").unlink()
    (folder / "compiled-bf16" / "1.blob").unlink()
    (folder / "compiled-bf16").rmdir()
    (folder / "compiled-bf16").symlink_to(folder / "compiled-fp32", target_is_directory=True)
    assert folder_identity(folder, ["compiled-bf16"]) is None


def test_a_probe_is_remembered_only_for_identical_settled_files(tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "entry"
    _entry(folder)
    memo = VerifiedMemo()
    files = folder_identity(folder)
    assert not memo.probed("graph", files)
    memo.remember_probe("graph", files)
    assert memo.probed("graph", files) and not memo.probed("other graph", files)
    time.sleep(0.05)  # past the file system's timestamp tick
    (folder / "model.xml").write_bytes(b"<net/>")  # same bytes, written again: a new ctime
    assert not memo.probed("graph", folder_identity(folder))
    assert not memo.probed("graph", None)
    monkeypatch.setattr(verified, "RACY_NS", 10**18)  # nothing has settled
    memo.remember_probe("fresh", folder_identity(folder))
    assert not memo.probed("fresh", folder_identity(folder))
