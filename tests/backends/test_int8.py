"""int8 feature extraction: the policy that allows it, the gate that guards it, and where it is recorded.

The quantization itself is NNCF's; what is ours and tested here is the calibration sample (seeded,
from the user's images), the fidelity measure (neighbour recall@10 and min cosine against fp32 on a
held-out half), the fallback when the gate fails, the cache, and that every output says what ran.
Fidelity on trained checkpoints and real photos is measured by ``benchmarks/int8_fidelity.py``.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import cl_zoo
from cl_zoo.backends import int8 as int8_mod
from cl_zoo.backends import select as select_mod
from cl_zoo.backends.int8 import Fidelity, calibration_sample, min_cosine, neighbour_recall, read_fidelity
from cl_zoo.embedding import extract_features
from cl_zoo.errors import ClZooError
from cl_zoo.precision import resolve_precision
from tests.helpers import isolate_cache, tiny_model

HAS_INT8 = int8_mod.int8_available()
needs_int8 = pytest.mark.skipif(not HAS_INT8, reason="nncf/openvino are not installed (pip install 'cl-zoo[int8]')")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache of its own: a test below counts the int8 records in the OpenVINO cache
    isolate_cache(monkeypatch, tmp_path_factory.getbasetemp() / "int8-cache")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """96 smooth random images (blurred noise in 8 colour families): neighbours that mean something."""
    folder = tmp_path_factory.mktemp("int8-images")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(96):
        base = rng.uniform(0, 255, size=3)
        noise = rng.normal(0, 40, size=(8, 8, 3))
        tile = np.clip(base + noise + (i % 8) * 20, 0, 255).astype(np.uint8)
        img = Image.fromarray(tile).resize((40, 40), Image.BILINEAR)
        path = folder / f"img_{i:03d}.png"
        img.save(path)
        paths.append(str(path))
    return paths


# ---------------------------------------------------------------------- pure parts
def test_calibration_sample_is_seeded_and_bounded() -> None:
    paths = [f"/p/{i}.jpg" for i in range(1000)]
    a, b = calibration_sample(paths, 512, seed=0), calibration_sample(paths, 512, seed=0)
    assert a == b and len(a) == 512 and len(set(a)) == 512
    assert calibration_sample(paths, 512, seed=1) != a
    few = calibration_sample(paths[:10], 512, seed=0)
    assert sorted(few) == sorted(paths[:10])
    with pytest.raises(ClZooError, match="at least 1"):
        calibration_sample(paths, 0)


def test_neighbour_recall_and_min_cosine_against_a_naive_loop() -> None:
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(40, 8))
    assert neighbour_recall(ref, ref) == 1.0
    assert neighbour_recall(ref, ref * 3.0) == 1.0  # scale does not change cosine neighbours
    cand = ref + rng.normal(scale=0.5, size=ref.shape)

    def naive(x: np.ndarray) -> list[set[int]]:
        out = []
        for i in range(len(x)):
            sims = [(float(x[i] @ x[j] / np.linalg.norm(x[i]) / np.linalg.norm(x[j])), j) for j in range(len(x)) if j != i]
            out.append({j for _, j in sorted(sims, reverse=True)[:10]})
        return out

    expected = np.mean([len(a & b) / 10 for a, b in zip(naive(ref), naive(cand))])
    assert neighbour_recall(ref, cand) == pytest.approx(expected)
    cosines = [float(r @ c / np.linalg.norm(r) / np.linalg.norm(c)) for r, c in zip(ref, cand)]
    assert min_cosine(ref, cand) == pytest.approx(min(cosines), abs=1e-9)
    with pytest.raises(ClZooError, match="two images"):
        neighbour_recall(ref[:1], ref[:1])


def test_fidelity_gate_thresholds() -> None:
    assert Fidelity(0.96, 0.995, 256, 256).passed
    assert not Fidelity(0.94, 0.999, 256, 256).passed
    assert not Fidelity(0.99, 0.98, 256, 256).passed
    assert "recall@10 0.940" in Fidelity(0.94, 0.999, 256, 256).describe()


@pytest.mark.parametrize("text", ["", "[]", '{"recall_at_10": 2, "min_cosine": 1, "held_out": 1, "calibrated_on": 1}',
                                  '{"recall_at_10": NaN, "min_cosine": 1, "held_out": 1, "calibrated_on": 1}',
                                  '{"recall_at_10": true, "min_cosine": 1, "held_out": 1, "calibrated_on": 1}',
                                  '{"recall_at_10": 0.9}'])
def test_a_damaged_gate_record_is_not_trusted(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fidelity.json"
    path.write_text(text)
    assert read_fidelity(path) is None


def test_auto_never_picks_int8_and_training_refuses_it() -> None:
    assert resolve_precision("auto", "cpu") in ("fp32", "bf16")
    assert resolve_precision("int8", "cpu") == "int8"
    with pytest.raises(ClZooError, match="training takes"):
        resolve_precision("int8", "cpu", training=True)


def test_int8_is_never_a_silent_torch_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ClZooError, match="runs on OpenVINO"):
        select_mod.resolve_backend("torch", "cpu", "int8")
    with pytest.raises(ClZooError, match="the device is cuda"):
        select_mod.resolve_backend("auto", "cuda", "int8")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nncf" else real(name, *a))
    with pytest.raises(ClZooError, match=r"--precision int8 needs nncf, which is not installed: pip install 'cl-zoo\[int8\]'"):
        select_mod.resolve_backend("auto", "cpu", "int8")


# ---------------------------------------------------------------------- end to end (NNCF + OpenVINO)
@needs_int8
def test_int8_features_are_close_and_recorded(images: list[str]) -> None:
    model = tiny_model(seed=0)
    fp32 = extract_features(model, images, precision="fp32", backend="openvino", workers=0)
    result = extract_features(model, images, precision="int8", backend="auto", workers=0, force_int8=True)
    assert (result.precision, result.backend) == ("int8", "openvino")
    record = result.quantization
    assert record["ran"] and record["forced"] and record["calibration_images"] == len(images) and record["calibration_seed"] == 0
    fidelity = record["fidelity"]
    assert fidelity["held_out"] == len(images) // 2 and fidelity["calibrated_on"] == len(images) // 2
    assert 0.0 <= fidelity["recall_at_10"] <= 1.0
    assert min_cosine(fp32.features, result.features) > 0.9
    assert not np.array_equal(fp32.features, result.features)  # it really is another model
    again = extract_features(model, images, precision="int8", backend="auto", workers=0, force_int8=True)
    assert again.backend_reason.startswith("int8 model from the cache")
    np.testing.assert_array_equal(again.features, result.features)
    from cl_zoo.backends.openvino import openvino_cache_dir

    records = sorted(openvino_cache_dir().glob("*/int8-*/fidelity.json"))
    assert records
    for record_file in records:  # a damaged gate record is never trusted: the model is made again
        record_file.write_text("{not json")
    remade = extract_features(model, images, precision="int8", backend="auto", workers=0, force_int8=True)
    assert remade.backend_reason.startswith("quantized now"), remade.backend_reason
    np.testing.assert_array_equal(remade.features, result.features)  # and NNCF is deterministic
    other = extract_features(model, images, precision="int8", backend="auto", workers=0, force_int8=True, calibration_seed=1, calibration_size=80)
    assert other.quantization["calibration_sha256"] != record["calibration_sha256"]


@needs_int8
def test_a_warm_int8_run_finds_its_model_without_decoding_the_calibration_set(
        images: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 44: the int8 cache is keyed by the calibration pixels' digest; a warm run takes it from a
    memo under the files' identity instead of decoding them all again, and nothing stale survives."""
    import os

    from cl_zoo.backends.openvino import openvino_cache_dir
    from cl_zoo.backends.openvino import PROBE_IMAGES
    from cl_zoo.embedding import engine as engine_mod

    own = tmp_path / "calibration"  # files of this test's own: it changes one of them
    own.mkdir()
    paths = []
    for i, src in enumerate(images):
        dst = own / Path(src).name
        dst.write_bytes(Path(src).read_bytes())
        paths.append(str(dst))
    model = tiny_model(seed=0)
    first = extract_features(model, paths, precision="int8", backend="auto", workers=0, force_int8=True)  # made or found
    decoded: list[int] = []
    real = engine_mod.decode_images
    monkeypatch.setattr(engine_mod, "decode_images", lambda p, *a, **k: decoded.append(len(p)) or real(p, *a, **k))

    def warm() -> tuple[object, int]:
        decoded.clear()
        result = extract_features(model, paths, precision="int8", backend="auto", workers=0, force_int8=True)
        assert result.backend_reason.startswith("int8 model from the cache"), result.backend_reason
        np.testing.assert_array_equal(result.features, first.features)
        assert result.quantization["calibration_sha256"] == first.quantization["calibration_sha256"]
        assert result.quantization["calibration_images"] == len(paths)
        return result, sum(decoded)

    assert warm()[1] <= PROBE_IMAGES  # at most the probe's held-out images, never the set
    os.utime(paths[0], ns=(os.stat(paths[0]).st_atime_ns, os.stat(paths[0]).st_mtime_ns + 10**9))
    assert warm()[1] == len(paths)  # another identity: decoded, and the same pixels find the same model
    memos = sorted((openvino_cache_dir() / "calibration").glob("*.json"))
    assert memos
    for memo in memos:  # a memo naming other pixels is not believed over the pixels themselves
        record = json.loads(memo.read_text())
        memo.write_text(json.dumps({**record, "pixels_sha256": "0" * 64}))
    assert warm()[1] == len(paths)
    for memo in memos:
        memo.write_text("{not json")
    assert warm()[1] == len(paths)
    assert warm()[1] <= PROBE_IMAGES  # and remembered again


@needs_int8
def test_a_failed_gate_falls_back_to_float_in_one_warning(images: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Fidelity, "passed", property(lambda self: False))
    model = tiny_model(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = extract_features(model, images, precision="int8", backend="auto", workers=0)
    fallback = resolve_precision("auto", "cpu")
    assert (result.precision, result.backend) == (fallback, "openvino")
    assert result.quantization["ran"] is False and result.quantization["fidelity"]["passed"] is False
    lines = [str(w.message) for w in caught if "int8 rejected" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0] and f"running {fallback} instead" in lines[0] and "--force-int8" in lines[0]
    reference = extract_features(model, images, precision=fallback, backend="openvino", workers=0)
    np.testing.assert_array_equal(result.features, reference.features)


@needs_int8
def test_too_few_images_to_check_fall_back_unless_forced(images: list[str]) -> None:
    model = tiny_model(seed=0)
    few = images[:20]
    with pytest.warns(UserWarning, match="too few to check int8"):
        result = extract_features(model, few, precision="int8", backend="auto", workers=0)
    assert result.precision != "int8" and result.quantization["ran"] is False
    forced = extract_features(model, few, precision="int8", backend="auto", workers=0, force_int8=True)
    assert forced.precision == "int8" and "fidelity" not in forced.quantization
    assert "too few to measure" in forced.backend_reason


@needs_int8
def test_a_host_transform_model_calibrates_on_what_its_graph_takes(images: list[str]) -> None:
    """CMC's graph starts after its float32 Lab conversion, so calibration is converted the same way."""
    torch.manual_seed(0)
    model = cl_zoo.create_model("cmc_alexnet_cifar_lab").eval()
    few = images[:20]
    forced = extract_features(model, few, precision="int8", backend="auto", workers=0, force_int8=True)
    reference = extract_features(model, few, precision="fp32", backend="torch", workers=0)
    assert forced.precision == "int8" and forced.features.shape == reference.features.shape
    assert min_cosine(reference.features, forced.features) > 0.9


@needs_int8
def test_cli_embed_int8_records_the_quantization(images: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from click.testing import CliRunner

    from cl_zoo.cli import cli as main
    from cl_zoo.cli import main as run_command

    folder = tmp_path / "model"
    cl_zoo.save_pretrained(tiny_model(seed=0), folder)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(images) + "\n")
    out = tmp_path / "emb.npy"
    runner = CliRunner()
    done = runner.invoke(main, ["embed", str(listing), "-m", str(folder), "-o", str(out), "--precision", "int8",
                                "--force-int8", "--calibration", str(listing), "-q", "-j", "0"])
    assert done.exit_code == 0, done.output
    meta = json.loads((tmp_path / "emb.meta.json").read_text())
    assert meta["precision"] == "int8" and meta["backend"] == "openvino"
    assert meta["quantization"]["calibration_images"] == len(images) and meta["quantization"]["forced"] is True
    parquet = tmp_path / "emb.parquet"
    done = runner.invoke(main, ["embed", str(listing), "-m", str(folder), "-o", str(parquet), "--precision", "int8",
                                "--force-int8", "-q", "-j", "0"])
    assert done.exit_code == 0, done.output
    import pyarrow.parquet as pq

    recorded = pq.read_schema(parquet).metadata[b"cl_zoo.quantization"]
    assert json.loads(recorded)["ran"] is True
    for args, message in ((["--calibration", str(listing)], "--calibration applies to --precision int8"),
                          (["--force-int8"], "--force-int8 applies to --precision int8"),
                          (["--precision", "int8", "--backend", "torch"], "use --backend openvino or auto")):
        capsys.readouterr()
        code = run_command(["embed", str(listing), "-m", str(folder), "-o", str(tmp_path / "x.npy"), *args])
        err = capsys.readouterr().err.strip()
        assert code != 0 and err.startswith("error:") and message in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "x.npy").exists()


@needs_int8
def test_knn_int8_calibrates_on_train_and_caches_under_its_calibration(tmp_path: Path) -> None:
    from cl_zoo.data.folder import scan_image_folder
    from cl_zoo.eval.knn import evaluate_knn

    rng = np.random.default_rng(2)
    for split, count in (("train", 40), ("test", 10)):
        for label, colour in enumerate(((200, 40, 40), (40, 40, 200))):
            folder = tmp_path / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                tile = np.clip(np.array(colour) + rng.normal(0, 50, size=(8, 8, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(tile).resize((40, 40), Image.BILINEAR).save(folder / f"{i}.png")
    train, test = scan_image_folder(tmp_path / "train"), scan_image_folder(tmp_path / "test")
    model = tiny_model(seed=0)
    opts = dict(ks=(5,), temperature=0.1, workers=0, device="cpu", cache_dir=tmp_path / "features", precision="int8",
                force_int8=True)
    first = evaluate_knn(model, train, test, **opts)
    features = first.report["features"]
    assert (features["precision"], features["backend"]) == ("int8", "openvino")
    assert features["quantization"]["calibration_images"] == len(train.paths)  # drawn from train, not test
    again = evaluate_knn(model, train, test, **opts)
    assert again.report["features"]["train_cached"] and again.report["features"]["train_key"] == features["train_key"]
    reseeded = evaluate_knn(model, train, test, **{**opts, "seed": 1})  # another calibration sample order
    assert reseeded.report["features"]["train_key"] != features["train_key"]
    float_run = evaluate_knn(model, train, test, **{**opts, "precision": "fp32", "force_int8": False})
    assert float_run.report["features"]["train_key"] != features["train_key"]
