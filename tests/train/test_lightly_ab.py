"""benchmarks/lightly_ab.py on a tiny CIFAR-like archive: both sides train, score and write their line.

Skipped without lightly (``pip install lightly``; not a cl-zoo extra).
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import cl_zoo
from tests.helpers import REPO_ROOT

pytest.importorskip("lightly")

ROOT = REPO_ROOT


def _load_harness():
    spec = importlib.util.spec_from_file_location("lightly_ab", ROOT / "benchmarks" / "lightly_ab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lightly_ab"] = module
    spec.loader.exec_module(module)
    return module


ab = _load_harness()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cifar10-jpeg.tar.gz's layout: train/<class>/NNNN.jpg and test/<class>/NNNN.jpg, 2 classes."""
    from PIL import Image

    path = tmp_path_factory.mktemp("ab") / "tiny-cifar.tar.gz"
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for split, n in (("train", 10), ("test", 5)):
            for c, name in enumerate(("cat", "ship")):
                for i in range(n):
                    pixels = rng.integers(0, 80, (32, 32, 3), dtype=np.uint8) + (150 if c else 0)
                    buf = io.BytesIO()
                    Image.fromarray(pixels.astype(np.uint8)).save(buf, format="JPEG")
                    info = tarfile.TarInfo(f"{split}/{name}/{i:04d}.jpg")
                    info.size = buf.tell()
                    buf.seek(0)
                    tar.addfile(info, buf)
    return path


def test_subset_takes_the_first_images_of_each_class(archive: Path, tmp_path: Path) -> None:
    folder = ab.prepare_subset(archive, tmp_path, 4, 2)
    assert sorted(p.name for p in (folder / "train" / "cat").iterdir()) == ["0000.jpg", "0001.jpg", "0002.jpg", "0003.jpg"]
    assert len(list((folder / "test").rglob("*.jpg"))) == 4
    assert ab.prepare_subset(archive, tmp_path, 4, 2) == folder  # unpacked once


def test_factors_change_one_recipe_value_each() -> None:
    def recipe(factor: str):
        return ab.ours_recipe(ab.parse_args(["--factor", factor, "--epochs", "20", "--batch-size", "512"]))

    base = recipe("baseline")
    assert (base.effective_lr, base.schedule.warmup_epochs, base.precision) == (pytest.approx(0.24), 0, "fp32")
    assert recipe("old_lr").effective_lr == pytest.approx(0.12)
    assert recipe("warmup").schedule.warmup_epochs == 1.0
    old = recipe("old_recipe")
    assert (old.effective_lr, old.schedule.warmup_epochs) == (pytest.approx(0.12), 1.0)
    assert recipe("wd_groups").method_args["no_decay_norm_bias"] is True
    bf16 = recipe("bf16")
    assert bf16.precision == "bf16"
    assert bf16.to_dict() == {**base.to_dict(), "precision": "bf16"}  # the one change
    assert recipe("bf16_head_autocast").to_dict() == bf16.to_dict()  # its other change is the head's module


def test_autocast_head_puts_the_head_back_under_autocast() -> None:
    from cl_zoo.methods.heads import ProjectionHead

    head = ProjectionHead(8, 16, 4, batch_norm=True)
    x = torch.randn(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert head(x).dtype == torch.float32  # cl-zoo's head leaves autocast
        out = ab.AutocastHead(head)(x)
    assert out.dtype == torch.bfloat16
    assert dict(ab.AutocastHead(head).named_parameters()).keys() == {f"head.{k}" for k, _ in head.named_parameters()}
    with pytest.raises(ab.ABError, match="not one of"):
        ab.parse_args(["--side", "lightly", "--factor", "warmup"])


def test_lightly_transform_batches_feed_the_trainer(archive: Path, tmp_path: Path) -> None:
    folder = ab.prepare_subset(archive, tmp_path, 4, 2)
    paths = sorted(str(p) for p in (folder / "train").rglob("*.jpg"))
    batches = ab.LightlyTransformBatches(paths, 4, 0, seed=0)
    steps = list(batches.epoch(0))
    assert len(batches) == len(steps) == 2
    index, views = steps[0]
    assert len(views) == 2 and views[0].shape == (4, 3, 32, 32) and index.shape == (4,)
    assert [i for i, _ in batches.epoch(0, start_step=1)][0].tolist() == steps[1][0].tolist()  # same order on resume


def test_both_sides_train_and_the_table_compares_them(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "results.jsonl"
    common = ["--archive", str(archive), "--data", str(tmp_path / "data"), "--results", str(results), "--epochs", "1",
              "--batch-size", "8", "--train-per-class", "8", "--test-per-class", "3", "--workers", "0", "--width", "0.125"]
    assert ab.main(["--side", "lightly", *common]) == 0
    assert ab.main(["--side", "ours", "--factor", "backbone_lightly", *common]) == 0
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["side"], r["factor"]) for r in lines] == [("lightly", "reference"), ("ours", "backbone_lightly")]
    for r in lines:
        assert len(r["knn_top1"]) == len(r["loss"]) == len(r["epoch_time_s"]) == 1 and 0 <= r["knn_top1"][0] <= 1
        assert r["knn"] == {"k": 16, "t": 0.1, "train_images": 16, "test_images": 6}  # k=200 capped by the bank
        assert r["steps_per_epoch"] == 2 and np.isfinite(r["loss"][0])
        assert r["host"].endswith(")") and " usable cores, " in r["host"]  # which kernels made the numbers
        assert Path(r["cl_zoo"]) == Path(cl_zoo.__file__).resolve().parent  # which code made them
    capsys.readouterr()
    assert ab.main(["--side", "lightly", *common, "--skip-done"]) == 0
    assert "done already" in capsys.readouterr().out
    assert len(results.read_text().splitlines()) == 2
    assert ab.main(["--table", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert "| lightly | reference | 0 |" in table and "| ours | backbone_lightly | 0 |" in table


def test_backbone_swap_is_lightlys_resnet() -> None:
    """The ``backbone_lightly`` factor's module: lightly's children minus the classifier (no stem ReLU)."""
    adapter = ab.LightlyBackboneAdapter()
    names = [type(m).__name__ for m in adapter.net]
    assert names[:2] == ["Conv2d", "BatchNorm2d"] and "ReLU" not in names and names[-1] == "AdaptiveAvgPool2d"
    assert adapter.forward_features(torch.zeros(2, 3, 32, 32)).shape == (2, 512)


def test_width_narrows_both_sides_alike() -> None:
    """``--width`` (the queue's compute knob) gives lightly's and cl-zoo's ResNet-18 the same shapes."""
    from cl_zoo.methods import build_method_from_recipe

    args = ab.parse_args(["--width", "0.25", "--factor", "head_lightly"])
    ours = build_method_from_recipe(ab.ours_recipe(args))
    theirs = ab.LightlyBackboneAdapter(0.25)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(ours.backbone) == count(theirs) and ours.backbone.num_features == theirs.num_features == 128
    assert ours.head.hidden_dim == 128
