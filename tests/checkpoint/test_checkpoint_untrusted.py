"""A checkpoint folder is untrusted input: the four cases of issue 15, each refused in one line by
``cl_zoo.load_pretrained`` and by ``cl-zoo embed --model FOLDER``, and nothing outside the folder read."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import cl_zoo
from cl_zoo.checkpoint import CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError
from tests.helpers import edit_config, fake_cache_repo, repin, tiny_checkpoint_model


def edit_tensor(folder: Path, key: str, value: Callable[[torch.Tensor], torch.Tensor]) -> None:
    state = load_file(str(folder / WEIGHTS_NAME))
    state[key] = value(state[key])
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    repin(folder)


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    return cl_zoo.save_pretrained(tiny_checkpoint_model(1), tmp_path / "trav", max_shard_size="60KB")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)
    return path


class OpenWatcher:
    """Records every file named ``outside*`` under a root that is opened once :meth:`start` ran
    (a ``sys.addaudithook`` hook, so opens from any Python code path are seen)."""

    def __init__(self, root: Path) -> None:
        self.root, self.active, self.opened = str(root), False, []
        sys.addaudithook(self._hook)  # hooks cannot be removed; ``active`` retires this one

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if path.startswith(self.root) and os.path.basename(path).startswith("outside"):
                self.opened.append(path)

    def start(self) -> "OpenWatcher":
        self.active = True
        return self


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[OpenWatcher]:
    w = OpenWatcher(tmp_path)
    yield w
    w.active = False


def one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    return err


def refused_everywhere(folder: Path, image: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], pattern: str) -> None:
    with pytest.raises(CheckpointError, match=pattern) as exc:
        cl_zoo.load_pretrained(folder)
    assert "\n" not in str(exc.value)
    err = one_line_error(capsys, main(["embed", str(image), "--model", str(folder), "-o", str(tmp_path / "e.npy"), "-q"]))
    assert __import__("re").search(pattern, err), err
    assert not (tmp_path / "e.npy").exists()


# ---------------------------------------------------------------------- the four cases of the issue
def test_index_naming_a_file_outside_is_refused_before_opening_it(sharded, image, tmp_path, capsys, watcher):
    outside = tmp_path / "outside.safetensors"
    first = sorted(sharded.glob("model-*.safetensors"))[0]
    outside.write_bytes(first.read_bytes())  # a perfectly loadable file: only its place is wrong
    index = json.loads((sharded / INDEX_NAME).read_text())
    key = next(k for k, v in index["weight_map"].items() if v == first.name)
    index["weight_map"][key] = "../outside.safetensors"
    (sharded / INDEX_NAME).write_text(json.dumps(index))
    watcher.start()
    refused_everywhere(sharded, image, tmp_path, capsys, "not a plain file name inside the checkpoint folder")
    for name in ("/etc/passwd", "sub/model.safetensors", "..", "C:model.safetensors", "a\\b.safetensors"):
        index["weight_map"][key] = name
        (sharded / INDEX_NAME).write_text(json.dumps(index))
        with pytest.raises(CheckpointError, match="plain file name"):
            cl_zoo.load_pretrained(sharded)
    assert watcher.opened == []


def test_nan_weights_are_refused(saved, image, tmp_path, capsys):
    edit_tensor(saved, "layer1.0.conv1.weight", lambda t: torch.full_like(t, float("nan")))
    refused_everywhere(saved, image, tmp_path, capsys, r"layer1\.0\.conv1\.weight contains NaN or infinite values")


def test_integer_weights_are_refused_not_cast(saved, image, tmp_path, capsys):
    edit_tensor(saved, "conv1.weight", lambda t: (t * 100).to(torch.int32))
    refused_everywhere(saved, image, tmp_path, capsys, r"conv1\.weight is int32, expected a floating-point tensor")


def test_model_args_colliding_with_the_architecture(saved, image, tmp_path, capsys):
    edit_config(saved, lambda c: c["model_args"].update(depth=50))
    refused_everywhere(saved, image, tmp_path, capsys, "model_args.depth conflicts with an argument architecture resnet18_cifar fixes")


# ---------------------------------------------------------------------- the rest of points 1 and 2
@pytest.mark.parametrize(
    ("model_args", "pattern"),
    [
        ({"width": 0.125, "colour": 1}, r"model_args\.colour is not an argument of architecture resnet18_cifar"),
        ({"width": "wide"}, r"model_args\.width='wide' has the wrong type"),
        ({"width": 0.125, "zero_init_residual": 1}, r"model_args\.zero_init_residual=1 has the wrong type"),
        ({"width": 0.125, "stem": "giant"}, r"model_args\.stem='giant' has the wrong type"),
        ({"width": 4096.0}, r"conv1\.weight has shape"),  # built on the meta device: no 4096x allocation
    ],
)
def test_model_args_are_checked_against_the_signature(saved, model_args, pattern):
    edit_config(saved, lambda c: c.update(model_args=model_args))
    with pytest.raises(CheckpointError, match=pattern):
        cl_zoo.load_pretrained(saved)


def test_symlink_leading_out_is_refused(saved, tmp_path, watcher):
    outside = tmp_path / "outside.safetensors"
    os.replace(saved / WEIGHTS_NAME, outside)
    (saved / WEIGHTS_NAME).symlink_to(outside)
    watcher.start()
    with pytest.raises(CheckpointError, match="link leading out of the checkpoint folder"):
        cl_zoo.load_pretrained(saved)
    watcher.active = False
    (saved / WEIGHTS_NAME).unlink()
    os.replace(outside, saved / WEIGHTS_NAME)
    os.replace(saved / CONFIG_NAME, tmp_path / "outside.json")
    (saved / CONFIG_NAME).symlink_to(tmp_path / "outside.json")
    watcher.active = True
    with pytest.raises(CheckpointError, match="link leading out"):
        cl_zoo.load_pretrained(saved)
    assert watcher.opened == []


def test_hub_cache_layout_links_into_its_own_blobs_only(saved, tmp_path, monkeypatch):
    """A huggingface_hub snapshot links every file to ../../blobs: allowed for its own repo only."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo, snap = fake_cache_repo(tmp_path / "hub", saved)
    loaded = cl_zoo.load_pretrained(snap)
    torch.testing.assert_close(loaded.state_dict()["conv1.weight"], tiny_checkpoint_model().state_dict()["conv1.weight"])
    other = tmp_path / "hub" / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    os.replace(repo / "blobs" / (WEIGHTS_NAME + ".blob"), other / "w")
    (snap / WEIGHTS_NAME).unlink()
    (snap / WEIGHTS_NAME).symlink_to(os.path.relpath(other / "w", snap))
    with pytest.raises(CheckpointError, match="link leading out"):
        cl_zoo.load_pretrained(snap)


def test_config_files_and_index_must_name_safetensors(saved, sharded):
    edit_config(saved, lambda c: c["files"].update({"../x.safetensors": "0" * 64}))
    with pytest.raises(CheckpointError, match=r"files: '\.\./x\.safetensors' is not a plain file name"):
        cl_zoo.load_pretrained(saved)
    index = json.loads((sharded / INDEX_NAME).read_text())
    key = next(iter(index["weight_map"]))
    index["weight_map"][key] = CONFIG_NAME
    (sharded / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="is not a .safetensors file"):
        cl_zoo.load_pretrained(sharded)


def test_index_must_agree_with_the_shards(sharded):
    index = json.loads((sharded / INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    key = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index["weight_map"][key] = shards[1]
    (sharded / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"is in {shards[0]}, but the index says"):
        cl_zoo.load_pretrained(sharded)


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("input_size", [3, 100000, 100000], "input_size"),
        ("std", [0, 1, 1], "std"),
        ("mean", [0.5, "x", 0.5], "mean"),
        ("interpolation", "sinc", "interpolation"),
        ("crop_pct", 0, "crop_pct"),
    ],
)
def test_preprocessing_values_are_checked(saved, field, value, pattern):
    edit_config(saved, lambda c: c["pretrained_cfg"].update({field: value}))
    with pytest.raises(CheckpointError, match=rf"pretrained_cfg\.{pattern}"):
        cl_zoo.load_pretrained(saved)


def test_bare_integer_file_with_explicit_arch_is_refused(saved, tmp_path):
    state = {k: (v * 100).to(torch.int64) if v.is_floating_point() else v for k, v in tiny_checkpoint_model().state_dict().items()}
    torch.save(state, tmp_path / "ints.pth")
    with pytest.raises(CheckpointError, match="expected a floating-point tensor"):
        cl_zoo.load_pretrained(tmp_path / "ints.pth", arch="resnet18_cifar", width=0.125)
