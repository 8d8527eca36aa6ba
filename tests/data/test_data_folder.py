"""ImageFolder / archive / named-dataset discovery and the decoded-tensor cache."""

from __future__ import annotations

import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cl_zoo.data import decode_to_tensor, load_folder_tensor, open_image_folder
from cl_zoo.data.archive import COMPLETE_MARKER, extract_archive
from cl_zoo.errors import DataError
from tests.helpers import isolate_cache


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    isolate_cache(monkeypatch, tmp_path / "cache")  # one per test: the tests look inside it


def _img(path: Path, size=(8, 8), color=(10, 20, 30), fmt=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format=fmt)


def _make_folder(root: Path) -> Path:
    # Deliberately created out of order with mixed-case extensions and a nested subfolder.
    _img(root / "zebra" / "b.PNG")
    _img(root / "zebra" / "a.jpg")
    _img(root / "ant" / "sub" / "x.jpeg")
    _img(root / "ant" / "c.webp")
    (root / "ant" / "notes.txt").write_text("not an image")
    (root / "ant" / ".hidden.jpg").write_bytes(b"")
    return root


def test_folder_order_labels_and_hash(tmp_path):
    root = _make_folder(tmp_path / "data")
    data = open_image_folder(root)
    assert data.classes == ["ant", "zebra"]
    rel = [os.path.relpath(p, root) for p in data.paths]
    assert rel == [os.path.join("ant", "c.webp"), os.path.join("ant", "sub", "x.jpeg"), os.path.join("zebra", "a.jpg"), os.path.join("zebra", "b.PNG")]
    assert data.labels.dtype == np.int64 and data.labels.tolist() == [0, 0, 1, 1]
    assert len(data.file_list_hash) == 64
    # Same relative list elsewhere -> same hash; one more file -> a different one.
    other = _make_folder(tmp_path / "copy")
    assert open_image_folder(other).file_list_hash == data.file_list_hash
    _img(other / "zebra" / "c.bmp")
    assert open_image_folder(other).file_list_hash != data.file_list_hash


def test_split_layout(tmp_path):
    _make_folder(tmp_path / "ds" / "train")
    _img(tmp_path / "ds" / "test" / "ant" / "t.jpg")
    assert len(open_image_folder(tmp_path / "ds", split="test")) == 1
    assert len(open_image_folder(tmp_path / "ds", split="train")) == 4
    with pytest.raises(DataError, match="split folders"):
        open_image_folder(tmp_path / "ds")
    with pytest.raises(DataError, match="'val'"):
        open_image_folder(tmp_path / "ds", split="val")


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz", ".tar", ".zip"])
def test_archives_extract_once(tmp_path, suffix):
    src = _make_folder(tmp_path / "src" / "top" / "train")  # wrapped in one top folder
    archive = tmp_path / f"ds{suffix}"
    if suffix == ".zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for p in sorted((tmp_path / "src").rglob("*")):
                zf.write(p, p.relative_to(tmp_path / "src"))
    else:
        with tarfile.open(archive, "w:gz" if "gz" in suffix else "w") as tf:
            tf.add(tmp_path / "src" / "top", arcname="top")
    data = open_image_folder(archive, split="train")
    assert data.classes == ["ant", "zebra"] and len(data) == 4
    assert data.file_list_hash == open_image_folder(src).file_list_hash
    folder = extract_archive(archive)
    assert (folder / COMPLETE_MARKER).is_file() and folder.parent == tmp_path / "cache" / "datasets"
    mtime = (folder / COMPLETE_MARKER).stat().st_mtime_ns
    assert extract_archive(archive) == folder and (folder / COMPLETE_MARKER).stat().st_mtime_ns == mtime
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".partial")]


def test_user_errors_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    flat = tmp_path / "flat"
    _img(flat / "a.jpg")
    _img(tmp_path / "hollow" / "cls" / "a.jpg")
    (tmp_path / "hollow" / "nothing").mkdir()
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"this is not gzip")
    cases = {
        tmp_path / "missing": "not found",
        tmp_path / "empty": "empty folder",
        flat: "no class folders",
        tmp_path / "hollow": "without images",
        bad: "unreadable archive",
    }
    for spec, pattern in cases.items():
        with pytest.raises(DataError, match=pattern) as info:
            open_image_folder(spec)
        assert "\n" not in str(info.value)
    assert not [p for p in (tmp_path / "cache" / "datasets").iterdir() if not p.name.startswith(".")]


def test_load_folder_tensor(tmp_path):
    data = open_image_folder(_make_folder(tmp_path / "data"))
    images, labels = load_folder_tensor(data, 8, workers=1, progress=False)
    assert images.shape == (4, 3, 8, 8) and labels.tolist() == [0, 0, 1, 1]
    assert images[3, :, 0, 0].tolist() == [10, 20, 30]  # zebra/b.PNG: lossless, kept exactly
    assert list((tmp_path / "cache" / "decoded").glob("*.npy"))


def test_named_dataset_under_root(tmp_path):
    classes = [f"c{i}" for i in range(10)]
    for c in classes:
        _img(tmp_path / "root" / "cifar10-jpeg" / "test" / c / "0.jpg")
    data = open_image_folder("cifar10", root=tmp_path / "root", split="test")
    assert data.classes == classes and data.source == "cifar10:test"
    with pytest.raises(DataError, match=r"cifar10 \(train\) not found under .*expected"):
        open_image_folder("cifar10", root=tmp_path / "root", split="train")
    with pytest.raises(DataError, match="splits train, val"):
        open_image_folder("imagenette", root=tmp_path / "root", split="test")


def test_decode_resize_crop_and_cache(tmp_path):
    from torchvision.transforms.v2 import functional as F

    yy, xx = np.mgrid[0:30, 0:50]
    pix = np.stack([xx * 5, yy * 8, (xx + yy) * 3], axis=-1).astype(np.uint8)  # smooth, non-square
    Image.fromarray(pix).save(tmp_path / "wide.png")
    Image.fromarray(pix[:16, :16]).save(tmp_path / "square.png")
    paths = [str(tmp_path / "wide.png"), str(tmp_path / "square.png")]
    cache = tmp_path / "decoded"
    out = decode_to_tensor(paths, 16, workers=2, cache_dir=cache, progress=False)
    assert out.dtype == torch.uint8 and out.shape == (2, 3, 16, 16)
    assert torch.equal(out[1], torch.from_numpy(pix[:16, :16]).permute(2, 0, 1))  # right size: untouched
    ref = F.to_image(F.center_crop(F.resize(Image.fromarray(pix), 16), 16))  # torchvision on PIL
    assert (out[0].int() - ref.int()).abs().max() <= 1
    files = list(cache.glob("*.npy"))
    assert len(files) == 1
    os.chmod(paths[0], 0o000) if os.geteuid() != 0 else None
    again = decode_to_tensor(paths, 16, workers=2, cache_dir=cache, progress=False)  # from the cache
    assert torch.equal(again, out)
    os.chmod(paths[0], 0o644)
    Image.new("RGB", (8, 8)).save(tmp_path / "broken.jpg")
    (tmp_path / "broken.jpg").write_bytes(b"garbage")
    with pytest.raises(DataError, match="cannot decode"):
        decode_to_tensor([str(tmp_path / "broken.jpg")], 8, use_cache=False, progress=False)


def test_real_cifar10_test_split(cifar10_dir):
    data = open_image_folder(cifar10_dir, split="test")
    assert len(data) == 10_000 and data.num_classes == 10 and data.classes[0] == "airplane"
    assert np.bincount(data.labels).tolist() == [1000] * 10
    subset = data.paths[::500]
    images = decode_to_tensor(subset, 32, workers=2, use_cache=False, progress=False)
    assert images.shape == (20, 3, 32, 32) and images.float().std() > 20
