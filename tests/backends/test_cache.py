"""The OpenVINO cache's entry check hashes a file once per process and still sees every change."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from cl_zoo.backends import cache as cache_mod
from cl_zoo.backends.cache import RECORD_FORMAT, RECORD_NAME, entry_problem


def _entry(folder: Path) -> None:
    folder.mkdir()
    files = {}
    for name, body in (("model.xml", b"<net/>"), ("model.bin", os.urandom(4096))):
        (folder / name).write_bytes(body)
        files[name] = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    (folder / RECORD_NAME).write_text(json.dumps({"format": RECORD_FORMAT, "weights": "w", "files": files}))


def test_an_entry_is_hashed_once_per_process_and_a_change_is_still_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "RACY_NS", 0)  # files written just now count as settled
    hashed: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    folder = tmp_path / "entry"
    _entry(folder)
    hashed.clear()
    assert entry_problem(folder, {"weights": "w"}) is None
    assert len(hashed) == 2
    assert entry_problem(folder, {"weights": "w"}) is None and len(hashed) == 2  # remembered: no new hash
    bin_path = folder / "model.bin"
    st = os.stat(bin_path)
    with open(bin_path, "r+b") as fh:  # same size, mtime put back: the change of ctime still shows
        fh.write(b"\0" * 16)
    os.utime(bin_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert entry_problem(folder, {"weights": "w"}) == "model.bin is not the file the record lists (sha256 differs)"


def test_a_file_changed_within_the_timestamp_granularity_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    folder = tmp_path / "entry"
    _entry(folder)  # written just now: "racy", as git calls it
    hashed.clear()
    assert entry_problem(folder, {"weights": "w"}) is None
    assert entry_problem(folder, {"weights": "w"}) is None
    assert len(hashed) == 4  # hashed both times
