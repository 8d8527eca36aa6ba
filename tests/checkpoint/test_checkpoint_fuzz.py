"""Property-based fuzzing of the checkpoint folder (issue 15, point 3).

Mutations of config.json, the shard index, the card's front matter and the safetensors headers
(the 8-byte little-endian length and the JSON header: dtype, shape, data_offsets, lengths, junk
bytes), on a small saved model, unsharded and sharded, with the weights' sha256 re-pinned or not.
Every outcome must be the identical model or one CheckpointError line, no file outside the folder
may be opened (a sentinel beside it, watched by an audit hook), and ``cl-zoo embed --model`` on
each mutated folder must end in a result or an ``error:`` line, never a traceback.

Bounded for CI: derandomized (the same examples every run), 40 per layout, under a minute in all.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME, INDEX_NAME, load_folder, sha256_file
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError
from tests.helpers import REPO_ROOT, tiny_checkpoint_model

# CL_ZOO_FUZZ_EXAMPLES=1000 CL_ZOO_FUZZ_RANDOM=1 explores further than CI does (new examples each run).
FUZZ = settings(max_examples=int(os.environ.get("CL_ZOO_FUZZ_EXAMPLES", "40")), deadline=None,
                derandomize=not os.environ.get("CL_ZOO_FUZZ_RANDOM"), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HOSTILE = [
    "../outside.safetensors", "../outside.json", "/tmp/outside.safetensors", "outside.safetensors", "..", ".", "",
    "model.safetensors", "config.json", "README.md", "sub/model.safetensors", "C:\\outside.safetensors", "a\x00b",
    "resnet50", "pixels", "resnet18_cifar", "F32", "I32", "bilinear", "depth", "width",
]
KEYS = ["depth", "width", "stem", "in_chans", "weight_map", "files", "model_args", "architecture", "input_size",
        "mean", "std", "crop_pct", "interpolation", "dtype", "shape", "data_offsets", "__metadata__", "conv1.weight"]
scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10) | st.sampled_from(HOSTILE) | st.sampled_from([0, 1, 2, 3, 18, 50, 0.125, 1e9, -1, 4096])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-bases")
    return {
        "single": cl_zoo.save_pretrained(tiny_checkpoint_model(), root / "single"),
        "sharded": cl_zoo.save_pretrained(tiny_checkpoint_model(), root / "sharded", max_shard_size="60KB"),
    }


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return tiny_checkpoint_model().state_dict()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz-img") / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)
    return path


class OutsideWatcher:
    """Audit hook: every open of a file named ``outside*`` while active (the sentinels)."""

    def __init__(self) -> None:
        self.active, self.opened = False, []
        sys.addaudithook(self._hook)  # cannot be removed; ``active`` retires it

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            if os.path.basename(os.fsdecode(args[0])).startswith("outside"):
                self.opened.append(os.fsdecode(args[0]))


@pytest.fixture(scope="module")
def watcher() -> Iterator[OutsideWatcher]:
    w = OutsideWatcher()
    yield w
    w.active = False


@contextlib.contextmanager
def mutable_copy(base: Path) -> Iterator[Path]:
    """A fresh copy of ``base`` with loadable sentinels beside it (what a traversal would reach)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        folder = Path(tmp) / "ckpt"
        shutil.copytree(base, folder)
        weights = sorted(folder.glob("*.safetensors"))[0]
        shutil.copy(weights, Path(tmp) / "outside.safetensors")
        shutil.copy(folder / CONFIG_NAME, Path(tmp) / "outside.json")
        yield folder


# ---------------------------------------------------------------------------------------------- mutations
def json_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += json_paths(v, prefix + (i,))
    return out


def mutate_tree(data: st.DataObject, obj: Any) -> Any:
    """Replace, delete or add one node anywhere in a JSON-like tree."""
    path = data.draw(st.sampled_from(json_paths(obj)), label="path")
    op = data.draw(st.sampled_from(["set", "delete", "add"]), label="op")
    if not path:
        return data.draw(json_values, label="root")
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "add" and isinstance(parent, dict):
        parent[data.draw(st.sampled_from(KEYS) | st.text(max_size=6), label="key")] = data.draw(json_values, label="value")
    else:
        parent[last] = data.draw(json_values, label="value")
    return obj


def mutate_json_file(data: st.DataObject, path: Path) -> None:
    if data.draw(st.integers(0, 9), label="junk?") == 0:
        raw = bytearray(path.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at : at + 4] = data.draw(st.binary(min_size=1, max_size=4), label="junk")
        path.write_bytes(bytes(raw))
        return
    obj = json.loads(path.read_text())
    path.write_text(json.dumps(mutate_tree(data, obj)))


def mutate_card(data: st.DataObject, path: Path) -> None:
    text = path.read_text()
    end = text.find("\n---", 3)
    meta = yaml.safe_load(text[3:end])
    meta = mutate_tree(data, json.loads(json.dumps(meta)))
    path.write_text("---\n" + yaml.safe_dump(meta) + text[end + 1 :])


def mutate_header(data: st.DataObject, path: Path) -> None:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header, body = json.loads(raw[8 : 8 + length]), raw[8 + length :]
    op = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "rename", "tree", "length", "junk", "truncate"]), label="header op")
    names = sorted(k for k in header if k != "__metadata__")
    name = data.draw(st.sampled_from(names), label="tensor")
    if op == "dtype":
        header[name]["dtype"] = data.draw(st.sampled_from(["F16", "BF16", "F32", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "X"]) | json_values)
    elif op == "shape":
        header[name]["shape"] = data.draw(st.lists(st.integers(-2, 2**40), max_size=5) | json_values)
    elif op == "data_offsets":
        header[name]["data_offsets"] = data.draw(st.lists(st.integers(-1, 2**64), min_size=2, max_size=2) | json_values)
    elif op == "rename":
        header[data.draw(st.sampled_from(names) | st.text(max_size=8))] = header.pop(name)
    elif op == "tree":
        header = mutate_tree(data, header)
    encoded = json.dumps(header).encode()
    out = struct.pack("<Q", len(encoded)) + encoded + body
    if op == "length":
        out = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1))) + raw[8:]
    elif op == "junk":
        at = data.draw(st.integers(0, 8 + length), label="at")
        out = raw[:at] + data.draw(st.binary(min_size=1, max_size=8)) + raw[at + 8 :]
    elif op == "truncate":
        out = raw[: data.draw(st.integers(0, len(raw) - 1))]
    path.write_bytes(out)


def repin(folder: Path) -> None:
    """Record the current digests of the weights files, as a careful tamperer would."""
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["files"] = {p.name: sha256_file(p) for p in folder.glob("*.safetensors")}
    (folder / CONFIG_NAME).write_text(json.dumps(config))


def mutate(data: st.DataObject, folder: Path) -> str:
    sharded = (folder / INDEX_NAME).is_file()
    # The card is never read by the loader (one share is enough to show that); the rest is.
    choices = ["card"] + ["config", "header"] * 2 + (["index"] * 2 if sharded else [])
    target = data.draw(st.sampled_from(choices), label="target")
    if target == "config":
        mutate_json_file(data, folder / CONFIG_NAME)
    elif target == "index":
        mutate_json_file(data, folder / INDEX_NAME)
    elif target == "card":
        mutate_card(data, folder / CARD_NAME)
    else:
        shard = data.draw(st.sampled_from(sorted(p.name for p in folder.glob("*.safetensors"))), label="file")
        mutate_header(data, folder / shard)
        if data.draw(st.booleans(), label="repin"):
            repin(folder)
    return target


# ---------------------------------------------------------------------------------------------- checks
def check_load(folder: Path, reference: dict[str, torch.Tensor]) -> str | None:
    """The identical model (None) or one CheckpointError line (its text); anything else fails."""
    try:
        model = load_folder(folder)
    except CheckpointError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        return message
    state = model.state_dict()
    assert state.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(state[key], value), f"{key} loaded different values without an error"
    return None


def check_embed(folder: Path, image: Path, refused: str | None) -> None:
    out = folder.parent / "emb.npy"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main(["embed", str(image), "--model", str(folder), "-o", str(out), "-q", "-j", "0"])
    err = stderr.getvalue()
    assert "Traceback" not in err, err
    if refused is not None:
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    else:
        assert code == 0 and out.is_file(), err


@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_fuzzed_folders_load_identically_or_fail_in_one_line(kind, bases, reference, image, watcher):
    outcomes: dict[str, int] = {}

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        with mutable_copy(bases[kind]) as folder:
            target = mutate(data, folder)
            watcher.active = True
            try:
                refused = check_load(folder, reference)
                check_embed(folder, image, refused)
            finally:
                watcher.active = False
            assert watcher.opened == [], watcher.opened
            key = f"{target}:{'refused' if refused else 'identical'}"
            outcomes[key] = outcomes.get(key, 0) + 1

    run()
    print(kind, sorted(outcomes.items()))
    # The fuzz reached both outcomes (a test that only ever refuses, or never does, proves little).
    assert any(k.endswith("refused") for k in outcomes) and any(k.endswith("identical") for k in outcomes), outcomes


@pytest.mark.parametrize(
    "case",
    ["traversal", "header_dtype"],
)
def test_embed_subprocess_on_mutated_folders_prints_one_line(case, bases, image, tmp_path):
    """The real command (a fresh interpreter, as a user runs it) on a few fixed mutations."""
    folder = tmp_path / "ckpt"
    shutil.copytree(bases["sharded"], folder)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    if case == "traversal":
        index = json.loads((folder / INDEX_NAME).read_text())
        key = next(iter(index["weight_map"]))
        index["weight_map"][key] = "../outside.safetensors"
        (folder / INDEX_NAME).write_text(json.dumps(index))
    elif case == "header_dtype":
        raw = shard.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + length])
        name = next(k for k in header if k != "__metadata__" and header[k]["dtype"] == "F32")
        header[name]["dtype"] = "I32"
        encoded = json.dumps(header).encode()
        shard.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])
        repin(folder)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "cl_zoo.cli", "embed", str(image), "--model", str(folder),
                             "-o", str(tmp_path / "e.npy"), "-q", "-j", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "e.npy").exists()
