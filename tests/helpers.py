"""Helpers shared by the test folders: paths, tiny models, image folders, the CLI in-process.

One copy of each, so a change to how the tests build a model or call the CLI is made once. Fixtures
built on these live in ``tests/conftest.py``; domain stand-ins with a file of their own stay beside
this one (``hub_server.py``, ``lightning_stand_in.py``, ``loss_reference.py``,
``official_checkpoints.py``, ``pickle_bytes.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import cl_zoo
from cl_zoo.checkpoint import CONFIG_NAME, sha256_file
from cl_zoo.cli import main

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
# Real photos in every format the embedder reads, plus deliberately broken files (BROKEN in test_embed).
DATA = TESTS_DIR / "data" / "embed"
GOOD = ["photo0.jpg", "photo1.png", "photo2.JPEG", "photo3.webp"]
EXAMPLE_PHOTOS_DIR = REPO_ROOT / "examples" / "photos"


# ------------------------------------------------------------------------------------------ the cache
def isolate_cache(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """Point ``CL_ZOO_CACHE`` at ``folder`` so no test reads or fills the user's cache."""
    monkeypatch.setenv("CL_ZOO_CACHE", str(folder))
    return folder


# ------------------------------------------------------------------------------------------ the CLI
def refuse_model_loads(monkeypatch: pytest.MonkeyPatch, why: str = "a model was loaded before the output was checked") -> None:
    """Make every model load fail, through each name a caller reaches the loaders by.

    Some modules bind the factory's loaders by value (``from cl_zoo.factory import load_model``) and
    ``cl_zoo`` caches its lazy names: they are imported first, so none captures the stand-in for the
    rest of the session, and then each of their names is patched as well as the factory's.
    """
    import cl_zoo.embedding.transforms as transforms
    import cl_zoo.export as export
    import cl_zoo.factory as factory

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(why)

    for owner, name in ((factory, "load_model"), (factory, "load_pretrained"), (cl_zoo, "load_model"),
                        (cl_zoo, "load_pretrained"), (export, "load_model"), (transforms, "load_pretrained")):
        monkeypatch.setattr(owner, name, refuse)


def run_cli(*args: object) -> int:
    """``cl-zoo ARGS`` in this process (paths may be ``Path``s); its exit code."""
    return main([str(a) for a in args])


def run_cli_captured(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``cl-zoo ARGS`` in this process: (exit code, stdout, stderr), for checks on what it printed."""
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def free_port() -> int:
    """A port nothing listens on (bound and released), for a server to start or a refused connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------------ tiny models
def tiny_model(seed: int | None = None) -> torch.nn.Module:
    """A random quarter-width ResNet-18 fed 32 px crops: real code path, milliseconds per image.

    ``seed=None`` leaves torch's generator as the caller set it (the embedding tests seed first).
    """
    if seed is not None:
        torch.manual_seed(seed)
    model = cl_zoo.create_model("resnet18", width=0.25)
    model.pretrained_cfg = dataclasses.replace(model.pretrained_cfg, input_size=(3, 32, 32), crop_pct=0.875)
    return model.eval()


def tiny_cifar_model(seed: int = 0) -> torch.nn.Module:
    """An eighth-width CIFAR ResNet-18 with non-trivial BatchNorm statistics, so buffers are compared too."""
    torch.manual_seed(seed)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return model


def tiny_checkpoint_model(seed: int = 0) -> torch.nn.Module:
    """An eighth-width CIFAR ResNet-18 declared for 16 px inputs: the smallest real checkpoint folder."""
    torch.manual_seed(seed)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    model.pretrained_cfg.input_size = (3, 16, 16)
    return model


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


# ------------------------------------------------------------------------------------------ checkpoint folders
def repin(folder: Path) -> None:
    """Record the weights files' current digests, as a tamperer would."""
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["files"] = {name: sha256_file(folder / name) for name in config["files"]}
    (folder / CONFIG_NAME).write_text(json.dumps(config))


def edit_config(folder: Path, change: Callable[[dict], None]) -> None:
    config = json.loads((folder / CONFIG_NAME).read_text())
    change(config)
    (folder / CONFIG_NAME).write_text(json.dumps(config))


def fake_cache_repo(root: Path, saved: Path) -> tuple[Path, Path]:
    """A huggingface_hub-shaped snapshot of ``saved`` under ``root``: every file linked into ../../blobs."""
    repo = root / "models--me--tiny"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in saved.iterdir():
        blob = repo / "blobs" / (f.name + ".blob")
        os.replace(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return repo, snap


# ------------------------------------------------------------------------------------------ image folders
# A ~40k-parameter DCL: raw 16 px pixels -> small MLP head (no BatchNorm anywhere): seconds per epoch on a CPU.
TINY_PRETRAIN = [
    "--arch", "pixels", "--set", "model_args.input_size=16", "--set", "method_args.head_hidden_dim=32",
    "--set", "method_args.head_out_dim=16", "--set", "data.augment=cifar", "--image-size", "16",
]


def make_folder(root: Path, classes: int = 3, per_class: int = 16, size: int = 20, seed: int = 0) -> Path:
    """An ImageFolder of class-coloured noise images: separable enough for the kNN monitor to beat chance."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = np.zeros(3)
            base[c % 3] = 150
            img = np.clip(rng.normal(base + 50, 30, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / f"class{c}" / f"{i:03d}.png")
    return root


def embed_test_photos(
    tmp_path: Path, copies: dict[str, str] | None = None, *, out: str = "emb.npy", extra: tuple[str, ...] = (), seed: int = 0
) -> Path:
    """The four test photos (plus ``copies``: new name -> photo) embedded by a seeded quarter-width
    ResNet-18 at 32 px into ``tmp_path/emb.npy``; the model is saved in ``tmp_path/model``.

    ``out="shards/"`` (with ``extra=("--shard-size", "2")``, say) writes a shard folder instead;
    another ``seed`` is another model, for folders that must not mix.
    """
    torch.manual_seed(seed)
    model = cl_zoo.create_model("resnet18", width=0.25)
    model.pretrained_cfg = dataclasses.replace(model.pretrained_cfg, input_size=(3, 32, 32))
    cl_zoo.save_pretrained(model, tmp_path / "model")
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in GOOD:
        shutil.copy(DATA / name, photos / name)
    for name, source in (copies or {}).items():
        shutil.copy(DATA / source, photos / name)
    target = f"{tmp_path}/{out}"  # a trailing slash (a shard folder) survives
    assert main(["embed", str(photos), "-m", str(tmp_path / "model"), "-o", target, "-j", "0", "-q", *extra]) == 0
    return tmp_path / out


# ------------------------------------------------------------------------------------------ one-line errors
def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` fail as if the package were not installed.

    Submodules an earlier test imported (``pyarrow.parquet``) are hidden too: ``import_module``
    returns a cached submodule without looking at its parent, so hiding the parent alone made this
    file's results depend on which tests ran before it.
    """
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)
        for loaded in [key for key in sys.modules if key.startswith(f"{name}.")]:
            monkeypatch.setitem(sys.modules, loaded, None)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def expect_extra(capsys: pytest.CaptureFixture[str], code: int, feature: str, package: str, extra: str) -> None:
    assert code == 2
    assert one_error_line(capsys) == f"error: {feature} needs {package}, which is not installed: pip install 'cl-zoo[{extra}]'"


def mutate(data: bytes, changes: list[tuple[str, float, object]]) -> bytes:
    """``data`` with fuzzing edits applied in order: each is (kind, where in [0, 1), value).

    The kinds hit what parsers trust: ``byte`` (one byte), ``int64`` (a little-endian count),
    ``octal`` (text put in place, as tar sizes are octal text or base-256), ``truncate``,
    ``insert`` (``value`` repeated) and ``delete`` (``value`` bytes). The fuzz suites of outputs and
    of inputs draw their own edits and share this one interpreter of them.
    """
    out = bytearray(data)
    for kind, where, value in changes:
        pos = int(where * max(len(out), 1))
        if kind == "byte" and out:
            out[min(pos, len(out) - 1)] = int(value)  # type: ignore[call-overload]
        elif kind == "int64":
            out[pos : pos + 8] = int(value).to_bytes(8, "little")  # type: ignore[call-overload]
        elif kind == "octal":
            out[pos : pos + len(value)] = value  # type: ignore[arg-type]
        elif kind == "truncate":
            del out[pos:]
        elif kind == "insert":
            out[pos:pos] = bytes([int(value)]) * (1 + int(value) % 7)  # type: ignore[call-overload]
        elif kind == "delete":
            del out[pos : pos + int(value)]  # type: ignore[call-overload]
    return bytes(out)


def openvino_graph_failing_at_run_time(height: int, width: int):  # an openvino.Model
    """An OpenVINO graph of cl-zoo's runner's shape (uint8 ``[B, H, W, 3]`` in, ``[B, 3]`` first out)
    whose every inference fails inside the CPU plugin.

    Its second output reshapes the pixels to ``[-1, max pixel]``, a shape known only at run time, so
    the graph compiles and then fails the plugin's reshape check on any batch whose element count
    the largest pixel does not divide, such as ``[8, 32, 32, 3]`` of noise (max 255).
    """
    import openvino as ov
    import openvino.opset13 as ops

    pixels = ops.parameter([-1, height, width, 3], ov.Type.u8, name="pixels")
    values = ops.convert(pixels, ov.Type.f32)
    features = ops.reduce_mean(values, ops.constant(np.array([1, 2], np.int64)), keep_dims=False)
    largest = ops.convert(ops.reduce_max(values, ops.constant(np.array([0, 1, 2, 3], np.int64)), keep_dims=False), ov.Type.i64)
    pattern = ops.concat([ops.constant(np.array([-1], np.int64)), ops.unsqueeze(largest, ops.constant(np.array([0], np.int64)))], 0)
    return ov.Model([features, ops.reshape(values, pattern, special_zero=False)], [pixels], "fails_at_run_time")
