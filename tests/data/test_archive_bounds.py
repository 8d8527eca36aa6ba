"""A dataset archive declaring far more than it can hold, or more than the cache has free, is refused before extraction."""

from __future__ import annotations

import gzip
import io
import shutil
import struct
import tarfile
import zipfile
from collections import namedtuple
from pathlib import Path

import pytest

from cl_zoo.data import archive as archive_mod
from cl_zoo.data.archive import extract_archive
from cl_zoo.errors import DataError
from tests.helpers import run_cli_captured

GIB = 1 << 30


def tar_gz_declaring(path: Path, size: int) -> Path:
    """A .tar.gz whose one member's header declares ``size`` bytes (followed by a little of them)."""
    info = tarfile.TarInfo("train/cls/big.bin")
    info.size = size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    path.write_bytes(gzip.compress(header + b"\0" * 65536, compresslevel=1))
    return path


def zip_declaring(path: Path, size: int) -> Path:
    """A .zip whose central directory declares one member of ``size`` bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train/cls/big.bin", b"\0" * 1024)
    data = bytearray(buffer.getvalue())
    central = data.rindex(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, size)  # uncompressed size
    path.write_bytes(bytes(data))
    return path


def cache_entries(cache: Path) -> list[str]:
    base = cache / "datasets"
    return sorted(p.name for p in base.iterdir() if not p.name.endswith(".lock") and p.name != ".hashes") if base.is_dir() else []


@pytest.mark.parametrize("make", [tar_gz_declaring, zip_declaring], ids=["tar.gz", "zip"])
def test_an_archive_declaring_a_gibibyte_is_refused_before_anything_is_extracted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], make) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("CL_ZOO_CACHE", str(cache))
    bomb = make(tmp_path / ("bomb.zip" if make is zip_declaring else "bomb.tar.gz"), GIB)
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(DataError, match="declares at least"):
        extract_archive(bomb)
    assert cache_entries(cache) == []  # nothing extracted, no partial folder left
    code, _, err = run_cli_captured(["knn", "--train", str(bomb), "--test", str(bomb)], capsys)
    assert code == 2 and "declares at least" in err and len(err.strip().splitlines()) == 1, err
    assert cache_entries(cache) == []


def test_an_archive_larger_than_the_free_space_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("CL_ZOO_CACHE", str(cache))
    small = tmp_path / "ds.zip"
    with zipfile.ZipFile(small, "w") as zf:
        zf.writestr("train/cls/a.bin", b"x" * 4096)
    usage = namedtuple("usage", "total used free")
    real_disk_usage = shutil.disk_usage
    monkeypatch.setattr(archive_mod.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(DataError, match="free"):
        extract_archive(small)
    assert cache_entries(cache) == []
    monkeypatch.setattr(archive_mod.shutil, "disk_usage", real_disk_usage)
    assert (extract_archive(small) / "train" / "cls" / "a.bin").read_bytes() == b"x" * 4096
