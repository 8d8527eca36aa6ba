"""`cl-zoo pretrain` on what users actually have: a flat or nested folder of photos without class
folders, and a named dataset under --data-root; the exported card says how many images (and which)
the model saw, and its usage snippet loads the exported folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cl_zoo.checkpoint.usage import check_usage
from cl_zoo.cli import main
from cl_zoo.data.folder import content_fingerprint, open_image_folder
from cl_zoo.errors import DataError
from tests.helpers import TINY_PRETRAIN

TINY = [  # tests.helpers' tiny DCL, one epoch
    *TINY_PRETRAIN, "--epochs", "1", "--batch-size", "8", "--no-progress", "--workers", "0",
]


def write_images(folder: Path, names: list[str], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)


pytestmark = pytest.mark.usefixtures("isolated_cache", "one_thread")


def test_flat_and_nested_folders_open_unlabeled(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    write_images(flat, [f"img{i:02d}.png" for i in range(5)])
    nested = tmp_path / "nested"  # loose photos beside sub-folders, and an empty sub-folder
    write_images(nested, ["top.png", "2023/a.png", "2023/trip/b.png", "2024/c.png"])
    (nested / "empty").mkdir()
    with pytest.raises(DataError, match="no class folders"):  # evaluation still needs labels
        open_image_folder(flat)
    data = open_image_folder(flat, require_labels=False)
    assert len(data) == 5 and not data.labeled and (data.labels == -1).all()
    data = open_image_folder(nested, require_labels=False)
    rel = sorted(Path(p).relative_to(nested).as_posix() for p in data.paths)
    assert rel == ["2023/a.png", "2023/trip/b.png", "2024/c.png", "top.png"] and not data.labeled
    # A proper ImageFolder stays labelled, with the same file-list hash as the labelled scan.
    classes = tmp_path / "classes"
    write_images(classes, ["cat/1.png", "cat/2.png", "dog/1.png"])
    relaxed, strict = open_image_folder(classes, require_labels=False), open_image_folder(classes)
    assert relaxed.classes == ["cat", "dog"] and relaxed.file_list_hash == strict.file_list_hash
    # The fingerprint follows content size, not just names.
    before = content_fingerprint(relaxed)
    (classes / "cat" / "1.png").write_bytes((classes / "cat" / "1.png").read_bytes() + b"\0")
    assert content_fingerprint(open_image_folder(classes)) != before


def test_pretrain_on_unlabeled_nested_folder(tmp_path: Path, capsys) -> None:
    photos = tmp_path / "photos"
    names = [f"{i:02d}.png" for i in range(12)] + [f"trip/day{i % 2}/{i:02d}.png" for i in range(12)]
    write_images(photos, names)
    out = tmp_path / "run"
    code = main(["pretrain", "--method", "dcl", *TINY, "--data", str(photos), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    notes = [line for line in captured.out.splitlines() if line.startswith("kNN monitor off")]
    assert len(notes) == 1 and "no class folders" in notes[0]
    config = json.loads((out / "model" / "config.json").read_text())
    data = config["training_data"]
    assert data["images"] == data["trained_images"] == 24 and data["labeled"] is False
    assert data["source"] == str(photos.resolve())
    assert data["fingerprint"] == content_fingerprint(open_image_folder(photos, require_labels=False))
    card = (out / "model" / "README.md").read_text()
    assert "24 images of" in card and data["fingerprint"] in card and "no labels" in card
    check_usage(card, out / "model")  # the exported card's snippet loads the exported folder


def test_pretrain_on_a_named_subset_under_data_root(tmp_path: Path, capsys) -> None:
    root = tmp_path / "datasets"
    # A 40-image "cifar10": the card must say 40 images of cifar10 train, not just "cifar10".
    write_images(root / "cifar10" / "train", [f"class{c}/{i}.png" for c in range(10) for i in range(4)])
    out = tmp_path / "run"
    args = ["pretrain", "--method", "dcl", *TINY, "--set", "data.dataset=cifar10", "--knn-every", "0",
            "--data", "cifar10", "--out", str(out)]
    code = main([*args, "--data-root", str(root)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["training_data"]["images"] == 40 and config["training_data"]["split"] == "train"
    card = (out / "model" / "README.md").read_text()
    assert "on 40 images of cifar10 train" in card
    # Every command calls the option --data-root, and the not-found error names it.
    code = main([*args[:-2], "--out", str(tmp_path / "run2"), "--data-root", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert code == 2 and "--data-root" in err and err.count("\n") == 1
    for command in ("pretrain", "knn", "linear-eval"):
        assert main([command, "--help"]) == 0
        assert "--data-root" in capsys.readouterr().out
