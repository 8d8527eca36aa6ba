"""Issue 40 case 3: the OpenVINO/int8 cache is checked before use, never trusted for existing at its key.

The key is computable from public weights, so a cache shared by a team or a CI runner can hold a
graph someone else put there: before the fix a planted graph of other weights made a plain
``embed`` (backend auto) switch to OpenVINO and return that model's features (min cosine 0.49 to
the true ones), and a damaged entry ended every later run in a traceback.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import REPO_ROOT, tiny_model

REPO = REPO_ROOT
PHOTOS = sorted(str(p) for p in (REPO / "examples" / "photos").glob("*.jpg"))
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model():
    """A quarter-width ResNet-18: the cache's checks do not depend on the model, and a conversion of
    it takes a fraction of the default checkpoint's seconds (this file converts a dozen times)."""
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def other(model):
    """The same architecture with other weights: what a planted graph computes."""
    changed = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std().nan_to_num(0.1) * 0.8)
    return changed


def _embed(model, backend: str, precision: str = "fp32"):
    from cl_zoo.embedding import extract_features

    return extract_features(model, PHOTOS, batch_size=4, workers=0, device="cpu", precision=precision, backend=backend)


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def _entry(model):
    from cl_zoo.backends import openvino as ovb
    from cl_zoo.embedding.engine import model_fingerprint
    from cl_zoo.embedding.preprocess import Preprocess

    pre = Preprocess.from_model(model)
    fp = model_fingerprint(model)
    return ovb.openvino_cache_dir() / ovb.conversion_key(fp, pre.crop_size, pre.mean, pre.std), fp, pre


def _plant(model, other) -> Path:
    """Convert ``other`` under ``model``'s key: an entry with a consistent record, as a forger writes it."""
    from cl_zoo.backends import openvino as ovb

    folder, fp, pre = _entry(model)
    ovb.OpenVINORunner(other, fingerprint=fp, input_hw=pre.crop_size, mean=pre.mean, std=pre.std, precision="fp32")
    assert ovb.entry_problem(folder, {"weights": fp}) is None  # the record is consistent: only the probe can tell
    return folder


@pytest.fixture(scope="module")
def fresh(model, tmp_path_factory):
    """Features of a fresh conversion in an empty cache: what every repaired run must give."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CL_ZOO_CACHE", str(tmp_path_factory.mktemp("fresh-cache")))
    try:
        return _embed(model, "openvino").features
    finally:
        mp.undo()


def test_a_planted_graph_without_a_record_is_not_used(model, other, fresh):
    folder = _plant(model, other)
    (folder / "entry.json").unlink()  # the graph as an attacker leaves it: model.xml/bin at the right key
    truth = _embed(model, "torch").features
    auto = _embed(model, "auto")
    assert auto.backend == "torch" and _min_cos(auto.features, truth) > 0.99999  # not "cached": 8 images stay on torch
    forced = _embed(model, "openvino")
    assert forced.backend_reason == "converted now"
    assert _min_cos(forced.features, fresh) > 0.999999 and _min_cos(forced.features, truth) > 0.99999
    assert _embed(model, "auto").backend_reason == "compiled from the cache"  # the repaired entry is used again


def test_a_forged_record_is_caught_by_the_probe(model, other, fresh):
    _plant(model, other)
    auto = _embed(model, "auto")  # "cached" by its record: auto picks OpenVINO, and the probe refuses the graph
    assert auto.backend == "openvino" and auto.backend_reason == "converted now"
    assert _min_cos(auto.features, fresh) > 0.999999
    again = _embed(model, "auto")
    assert again.backend_reason == "compiled from the cache" and _min_cos(again.features, fresh) > 0.999999


@pytest.mark.timeout(120)  # before the fix the probe waited forever
def test_a_forged_graph_that_fails_at_run_time_is_converted_again(model, fresh):
    """A consistent record over a graph whose inference fails: the probe sees the failure, not a hang.

    OpenVINO does not call back for a failed request; before the runner asked its requests for
    their errors, this probe (and so every ``embed``) waited forever on such an entry.
    """
    from cl_zoo.backends import openvino as ovb
    from tests.helpers import openvino_graph_failing_at_run_time

    folder, fp, pre = _entry(model)
    ovb.save_graph_folder(openvino_graph_failing_at_run_time(*pre.crop_size), folder, {"source.json": "{}\n"},
                          record={"weights": fp}, replace=True)
    assert ovb.entry_problem(folder, {"weights": fp}) is None  # only running it can tell
    auto = _embed(model, "auto")
    assert auto.backend == "openvino" and auto.backend_reason == "converted now"
    assert _min_cos(auto.features, fresh) > 0.999999


DAMAGE = ["missing", "dev-zero", "fifo", "stray", "truncated", "key-is-a-link", "record-junk"]


def _damage(folder: Path, damage: str, elsewhere: Path) -> None:
    xml = folder / "model.xml"
    if damage == "missing":
        xml.unlink()
    elif damage == "dev-zero":
        xml.unlink()
        xml.symlink_to("/dev/zero")
    elif damage == "fifo":
        xml.unlink()
        os.mkfifo(xml)
    elif damage == "stray":
        (folder / "extra.so").write_bytes(b"\0")
    elif damage == "truncated":
        data = (folder / "model.bin").read_bytes()
        (folder / "model.bin").write_bytes(data[: len(data) // 2])
    elif damage == "key-is-a-link":
        folder.rename(elsewhere)
        folder.symlink_to(elsewhere, target_is_directory=True)
    else:
        (folder / "entry.json").write_text(json.dumps({"format": "x"}))


@pytest.fixture(scope="module")
def pristine(model, tmp_path_factory):
    """One converted entry, copied for each kind of damage (a conversion costs seconds, a copy nothing)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CL_ZOO_CACHE", str(tmp_path_factory.mktemp("pristine-cache")))
    try:
        _embed(model, "openvino")
        folder, fp, _ = _entry(model)
        return folder, fp
    finally:
        mp.undo()


@pytest.mark.parametrize("damage", DAMAGE)
def test_every_kind_of_damage_is_seen_before_use(pristine, damage, tmp_path):
    """Read without opening the graph: a link to /dev/zero or a FIFO must not be read (or hang) at all."""
    import shutil

    from cl_zoo.backends import openvino as ovb

    source, fp = pristine
    folder = tmp_path / source.name
    shutil.copytree(source, folder, symlinks=True)
    assert ovb.entry_problem(folder, {"weights": fp}) is None
    _damage(folder, damage, tmp_path / "elsewhere")
    assert ovb.entry_problem(folder, {"weights": fp}) is not None, damage


@pytest.mark.parametrize("damage", ["missing", "dev-zero"])  # the two; the rest are seen the same way (above)
def test_a_damaged_entry_is_converted_again(model, fresh, damage, tmp_path):
    first = _embed(model, "openvino")
    folder, _, _ = _entry(model)
    _damage(folder, damage, tmp_path / "elsewhere")
    for expected in ("converted now", "compiled from the cache"):
        got = _embed(model, "openvino")
        assert got.backend_reason == expected, damage
        assert _min_cos(got.features, fresh) > 0.999999 and _min_cos(got.features, first.features) > 0.999999
    assert folder.is_dir() and not folder.is_symlink()
    assert not any(p.is_symlink() for p in folder.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="nncf is not installed")
def test_a_damaged_or_foreign_int8_entry_is_quantized_again(model):
    from cl_zoo.backends import openvino as ovb
    from cl_zoo.backends.int8 import quantized_graph

    folder, fp, pre = _entry(model)
    ovb.OpenVINORunner(model, fingerprint=fp, input_hw=pre.crop_size, mean=pre.mean, std=pre.std, precision="fp32")
    pixels = np.random.default_rng(0).integers(0, 256, (8, *pre.crop_size, 3), dtype=np.uint8)
    int8, _, made = quantized_graph(folder, pixels)
    assert made and quantized_graph(folder, pixels)[2] is False  # a checked entry is reused
    data = (int8 / "model.bin").read_bytes()
    (int8 / "model.bin").write_bytes(data[: len(data) // 2])
    assert quantized_graph(folder, pixels)[2] is True  # damaged: quantized again, no traceback
    record = json.loads((int8 / "entry.json").read_text())
    record["converted_from"]["model.bin"] = "0" * 64  # an entry quantized from another graph
    (int8 / "entry.json").write_text(json.dumps(record))
    assert quantized_graph(folder, pixels)[2] is True
    assert ovb.entry_problem(int8, {"converted_from": record["converted_from"]}) is not None


def _settle_at_once(monkeypatch) -> None:
    """Files written moments ago count as settled, so a test can remember them (cl_zoo.backends.verified)."""
    from cl_zoo.backends import cache as cache_mod
    from cl_zoo.backends import verified

    monkeypatch.setattr(verified, "RACY_NS", 0)
    monkeypatch.setattr(cache_mod, "RACY_NS", 0)


def _counting_probes(monkeypatch) -> list[int]:
    from cl_zoo.backends import openvino as ovb

    calls: list[int] = []
    real = ovb.OpenVINORunner._probe
    monkeypatch.setattr(ovb.OpenVINORunner, "_probe", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


def test_a_remembered_probe_is_skipped_until_a_file_changes(model, other, fresh, monkeypatch, tmp_path):
    """The memo of a passed probe stands only for the exact files that passed: a graph planted after it is probed and refused."""
    from cl_zoo.backends import cache as cache_mod
    from cl_zoo.backends.openvino import _blob_folder

    _settle_at_once(monkeypatch)
    monkeypatch.setenv("CL_ZOO_STATE", str(tmp_path / "state"))
    probes = _counting_probes(monkeypatch)
    assert _embed(model, "openvino").backend_reason == "converted now" and probes == []  # made here: not probed
    cache_mod._VERIFIED.clear()  # as a new process starts
    assert _embed(model, "openvino").backend_reason == "compiled from the cache" and len(probes) == 1
    cache_mod._VERIFIED.clear()
    again = _embed(model, "openvino")
    assert again.backend_reason == "compiled from the cache" and len(probes) == 1  # remembered: neither hashed nor probed
    assert _min_cos(again.features, fresh) > 0.999999
    folder, _, _ = _entry(model)
    blobs = folder / _blob_folder("fp32")
    assert blobs.is_dir()
    (blobs / "planted.blob").write_bytes(b"\0" * 64)  # anything new beside the plugin's blobs
    cache_mod._VERIFIED.clear()
    assert _embed(model, "openvino").backend_reason == "compiled from the cache" and len(probes) == 2
    (blobs / "planted.blob").unlink()
    _plant(model, other)  # a consistent record and the graph of other weights, after the memo was written
    cache_mod._VERIFIED.clear()
    before = len(probes)
    caught = _embed(model, "openvino")
    assert caught.backend_reason == "converted now" and len(probes) == before + 1
    assert _min_cos(caught.features, fresh) > 0.999999


def test_a_memo_that_is_not_ours_to_trust_changes_nothing(model, fresh, monkeypatch, tmp_path):
    """Garbage, or a memo that names these files with other identities, leaves every check in place."""
    from cl_zoo.backends import cache as cache_mod
    from cl_zoo.backends.verified import MEMO_NAME

    _settle_at_once(monkeypatch)
    state = tmp_path / "state"
    monkeypatch.setenv("CL_ZOO_STATE", str(state))
    probes = _counting_probes(monkeypatch)
    _embed(model, "openvino")
    state.mkdir(exist_ok=True)
    for body in (b"\xff\xfe not json", b'{"format": "cl-zoo-verified/1", "digests": [], "probes": 7}', b"[]"):
        (state / MEMO_NAME).write_bytes(body)
        cache_mod._VERIFIED.clear()
        got = _embed(model, "openvino")
        assert got.backend_reason == "compiled from the cache" and _min_cos(got.features, fresh) > 0.999999
    assert len(probes) == 3  # each garbage memo was ignored, so each run probed (and rewrote the memo)
    memo = json.loads((state / MEMO_NAME).read_text())
    for key in memo["probes"]:
        memo["probes"][key] = {name: [v[0], v[1] + 1, *v[2:]] for name, v in memo["probes"][key].items()}  # other inodes
    (state / MEMO_NAME).write_text(json.dumps(memo))
    cache_mod._VERIFIED.clear()
    _embed(model, "openvino")
    assert len(probes) == 4
