"""cl_zoo.fileio: the one atomic-write implementation every writer uses, and the one bounded JSON reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from cl_zoo.fileio import (
    atomic_path,
    atomic_save_npy,
    atomic_save_torch,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_bounded_json,
)
from cl_zoo.errors import CheckpointError, DataError


def test_success_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "old")
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".out.txt.") and tmp.name.endswith(".tmp")
        tmp.write_text("new")
        assert target.read_text() == "old"  # nothing visible until the block ends
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_failure_keeps_old_file_and_removes_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    atomic_write_bytes(target, b"keep")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"keep"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_unserialisable_json_raises_before_touching_disk(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "r.json", {"x": float("nan")}, allow_nan=False)
    assert list(tmp_path.iterdir()) == []
    atomic_write_json(tmp_path / "r.json", {"x": 1})
    assert (tmp_path / "r.json").read_text() == json.dumps({"x": 1}, indent=2) + "\n"


def test_concurrent_temporaries_are_distinct(tmp_path: Path) -> None:
    target = tmp_path / "f"
    with atomic_path(target) as a, atomic_path(target) as b:
        assert a != b
        a.write_text("a")
        b.write_text("b")
    assert target.read_text() == "a"  # the outer block finished last


def test_permissions_follow_umask_not_mkstemp(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "p.txt", "x", fsync=True)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_missing_folder_without_mkdir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write_text(tmp_path / "absent" / "x.txt", "x", mkdir=False)


def test_npy_and_torch_land_at_the_exact_name(tmp_path: Path) -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    atomic_save_npy(tmp_path / "cache.bin", arr)  # np.save given a name would append ".npy"
    assert np.array_equal(np.load(tmp_path / "cache.bin"), arr)
    atomic_save_torch(tmp_path / "s.pt", {"w": torch.ones(2)}, fsync=True)
    assert torch.equal(torch.load(tmp_path / "s.pt", weights_only=True)["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.bin", "s.pt"]


def test_read_json_reads_a_file_within_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text('{"a": [1, 2.5, "\u00e9"]}')
    assert read_bounded_json(path, max_bytes=path.stat().st_size) == {"a": [1, 2.5, "é"]}


@pytest.mark.parametrize("content, message", [
    (b"{" + b" " * 200 + b"}", r"is 202 bytes, more than a test file can be \(100 bytes\)"),
    (b"{not json", "is not valid JSON"),
    (b'{"a": "\xff"}', "is not valid JSON"),  # not UTF-8
])
def test_read_json_refuses_oversized_and_malformed_files_in_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        read_bounded_json(path, max_bytes=100, what="test file")
    assert "\n" not in str(info.value)


def test_read_json_an_integer_too_long_to_convert_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "digits.json"
    path.write_bytes(b"9" * 5000)  # Python refuses to convert more than 4300 digits by default
    with pytest.raises(DataError, match="is not valid JSON"):
        read_bounded_json(path, max_bytes=10_000)


def test_read_json_nesting_deep_enough_to_exhaust_recursion_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 200_000)
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        read_bounded_json(path, max_bytes=1 << 20, error=CheckpointError)


def test_read_json_nesting_that_parses_but_no_file_has_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"a": ' + b"[" * 700 + b"]" * 700 + b"}")  # json parses it; a recursive walk would not
    with pytest.raises(CheckpointError, match="nests deeper than 32 levels, so it cannot be a config") as info:
        read_bounded_json(path, max_bytes=1 << 20, what="config", error=CheckpointError)
    assert "\n" not in str(info.value)


def test_read_json_refuses_what_is_not_a_regular_file_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # opened for reading without O_NONBLOCK this would wait for a writer forever
    with pytest.raises(DataError, match="is not a regular file"):
        read_bounded_json(fifo, max_bytes=100)
    with pytest.raises(DataError, match="is not a regular file"):
        read_bounded_json(tmp_path, max_bytes=100)
    with pytest.raises(DataError, match="is missing"):
        read_bounded_json(tmp_path / "gone.json", max_bytes=100)


def test_read_bounded_json_refuses_an_oversized_file_before_reading_a_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cl_zoo import fileio
    from cl_zoo.fileio import read_bounded_json

    path = tmp_path / "manifest.json"
    with open(path, "wb") as fh:
        fh.truncate(8 << 30)  # sparse: 8 GiB by its size, nothing on disk; reading it would take minutes

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file was opened for reading")

    monkeypatch.setattr(fileio.os, "fdopen", no_reading)
    with pytest.raises(DataError, match=r"is 8589934592 bytes, more than a shard manifest can be \(1048576 bytes\)") as info:
        read_bounded_json(path, 1 << 20, "shard manifest")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("error", [DataError, CheckpointError])
def test_read_bounded_json_bad_json_is_one_line_of_the_callers_error(tmp_path: Path, error: type[DataError]) -> None:
    from cl_zoo.fileio import read_bounded_json

    path = tmp_path / "config.json"
    path.write_text('{\n  "a": 1,\n  "b": [1, 2,\n}\n')
    with pytest.raises(error, match=r"config.json is not valid JSON \(.*line 4") as info:
        read_bounded_json(path, 1 << 10, "checkpoint config", error=error)
    assert "\n" not in str(info.value) and type(info.value) is error


def test_open_regular_file_refuses_a_fifo_and_a_device_without_blocking(tmp_path: Path) -> None:
    from cl_zoo.fileio import open_regular_file

    plain = tmp_path / "photo.jpg"
    plain.write_bytes(b"bytes")
    with open_regular_file(plain) as fh:
        assert fh.read() == b"bytes"  # blocking reads again once opened
    os.mkfifo(tmp_path / "pipe.jpg")  # a plain open() would wait here for a writer, forever
    for other in (tmp_path / "pipe.jpg", Path("/dev/zero")):
        with pytest.raises(OSError, match="not a regular file"):
            open_regular_file(other)
    with pytest.raises(FileNotFoundError):
        open_regular_file(tmp_path / "missing.jpg")
