"""The embedding pipeline: one EngineOptions, decode overlapped with inference, the decode split, one road to an output."""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import cl_zoo
from cl_zoo.embedding import extract as extract_mod
from cl_zoo.embedding import run as run_mod
from cl_zoo.embedding.extract import extract_features, overlapped
from cl_zoo.embedding.options import EXACT, EngineOptions
from cl_zoo.errors import ClZooError
from tests.helpers import DATA

PHOTOS = [str(DATA / name) for name in ("photo0.jpg", "photo1.png", "photo2.JPEG", "photo3.webp")]


def small_model() -> torch.nn.Module:
    model = cl_zoo.create_model("resnet18", width=0.25)
    model.pretrained_cfg = dataclasses.replace(model.pretrained_cfg, input_size=(3, 32, 32), crop_pct=0.875)
    return model.eval()


def test_engine_options_merge_keeps_one_set_of_defaults() -> None:
    assert EngineOptions.merge() == EngineOptions()
    assert (EngineOptions().precision, EngineOptions().backend, EngineOptions().batch_size) == ("auto", "auto", 64)
    merged = EngineOptions.merge(EngineOptions(batch_size=8), precision="bf16", workers=None)
    assert (merged.precision, merged.batch_size, merged.workers) == ("bf16", 8, None)
    with pytest.raises(TypeError, match="no field"):
        EngineOptions.merge(precison="bf16")


def test_extract_features_stays_exact_and_the_user_doors_take_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = small_model()
    result = extract_features(model, PHOTOS[:2], workers=0)
    assert (result.precision, result.backend) == ("fp32", "torch")
    assert EXACT == dataclasses.replace(EngineOptions(), precision="fp32", backend="torch")
    # cl_zoo.embed goes through embed_to_output with the auto defaults, keywords on top.
    seen: list[EngineOptions] = []

    def spy(net, files, *, options, progress):  # noqa: ANN001, ANN202
        seen.append(options)
        return extract_features(net, files, options=dataclasses.replace(options, precision="fp32", backend="torch"))

    monkeypatch.setattr(run_mod, "extract_features", spy)
    features, paths = cl_zoo.embed(PHOTOS[:2], model=model, workers=0, batch_size=3)
    assert features.shape[0] == 2 and len(paths) == 2
    assert (seen[0].precision, seen[0].backend, seen[0].batch_size, seen[0].workers) == ("auto", "auto", 3, 0)


class _Deferred:
    """A forward whose results arrive later, recording how many batches were in flight at once."""

    def __init__(self) -> None:
        self.inflight = 0
        self.most = 0

    def submit(self, pixels):  # noqa: ANN001, ANN202
        self.inflight += 1
        self.most = max(self.most, self.inflight)

        def result() -> np.ndarray:
            self.inflight -= 1
            return np.full((1, 1), pixels, np.float32)

        return result


def test_overlapped_keeps_one_batch_in_flight_in_order_and_stops_after_max_batches() -> None:
    forward = _Deferred()
    done: list[tuple[int, float]] = []
    overlapped(range(5), forward, lambda b: b, lambda b, f: done.append((b, float(f[0, 0]))))  # type: ignore[arg-type]
    assert done == [(i, float(i)) for i in range(5)]
    assert forward.most == 2  # batch k+1 is fetched and started while batch k runs
    done.clear()
    with pytest.raises(KeyboardInterrupt, match="after 3 batches"):
        overlapped(range(5), forward, lambda b: b, lambda b, f: done.append((b, float(f[0, 0]))), max_batches=3)  # type: ignore[arg-type]
    assert [b for b, _ in done] == [0, 1, 2]  # every batch started before the stop is finished, as the synchronous loop did


def children() -> set[int]:
    """This process's live child processes (DataLoader workers among them), by pid."""
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def test_decoding_starts_before_the_engine_and_gives_the_same_features(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = small_model()
    paths = PHOTOS * 4
    in_process = extract_features(model, paths, batch_size=2, workers=0)
    decoders_at_prepare: list[int] = []
    real_prepare = extract_mod.prepare_engine
    before = children()  # processes other tests left behind are not this test's

    def watched(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        decoders_at_prepare.append(len(children() - before))
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(extract_mod, "prepare_engine", watched)
    ahead = extract_features(model, paths, batch_size=2, workers=2)
    assert decoders_at_prepare == [2]  # both decoders were already running while the engine was prepared
    assert ahead.workers == 2
    assert ahead.features.tobytes() == in_process.features.tobytes() and ahead.paths == in_process.paths
    assert children() - before == set()  # and they are gone once the call returns


def _tar_shards(folder: Path) -> list[str]:
    from tests.embedding.test_embed_inputs import good_sample, write_shard

    colours = ("red", "blue", "green")
    return [str(write_shard(folder / f"d-{i}.tar", [good_sample(f"{i}{k}", c) for k, c in enumerate(colours)])) for i in range(2)]


def test_webdataset_tars_decode_before_the_engine_and_give_the_same_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cl_zoo.embedding import tars as tars_mod

    torch.manual_seed(0)
    model = small_model()
    shards = _tar_shards(tmp_path)
    in_process = tars_mod.extract_tar_features(model, shards, batch_size=2, workers=0)
    decoders_at_prepare: list[int] = []
    real_prepare = tars_mod.prepare_engine
    before = children()

    def watched(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        decoders_at_prepare.append(len(children() - before))
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(tars_mod, "prepare_engine", watched)
    ahead = tars_mod.extract_tar_features(model, shards, batch_size=2, workers=2)
    assert decoders_at_prepare == [2]  # one reader per tar, already running while the engine was prepared
    assert ahead.features.tobytes() == in_process.features.tobytes() and ahead.paths == in_process.paths
    assert len(ahead.paths) == 6
    assert children() - before == set()

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise ClZooError("no engine here")

    monkeypatch.setattr(tars_mod, "prepare_engine", broken)
    for call in (lambda: tars_mod.extract_tar_features(model, shards, batch_size=2, workers=2),
                 lambda: tars_mod.embed_tars_to_shards(model, shards, tmp_path / "out", metadata={}, batch_size=2, workers=2)):
        with pytest.raises(ClZooError, match="no engine here"):
            call()
        assert children() - before == set()  # the readers started ahead are stopped


def test_webdataset_int8_without_calibration_fails_before_any_reader_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cl_zoo.embedding import tars as tars_mod

    started: list[object] = []
    monkeypatch.setattr(tars_mod, "DecodeAhead", lambda *args: started.append(args))
    with pytest.raises(ClZooError, match="needs --calibration"):
        tars_mod.extract_tar_features(small_model(), _tar_shards(tmp_path), precision="int8", workers=2)
    assert started == []


def test_decoders_started_ahead_stop_when_the_engine_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = small_model()
    before = children()

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        assert len(children() - before) == 2
        raise ClZooError("no engine here")

    monkeypatch.setattr(extract_mod, "prepare_engine", broken)
    with pytest.raises(ClZooError, match="no engine here"):
        extract_features(model, PHOTOS * 4, batch_size=2, workers=2)
    assert children() - before == set()


def test_a_bad_setting_fails_before_any_decoder_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(extract_mod, "DecodeAhead", lambda *args: started.append(args))
    for bad, message in (({"batch_size": 0}, "batch size"), ({"workers": -1}, "workers"), ({"precision": "fp8"}, "precision")):
        with pytest.raises(ClZooError, match=message):
            extract_features(small_model(), PHOTOS, **bad)  # type: ignore[arg-type]
    assert started == []


def test_resume_prepares_the_engine_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = small_model()
    full = extract_features(model, PHOTOS * 2, batch_size=2, workers=0)
    with pytest.raises(KeyboardInterrupt):
        extract_features(model, PHOTOS * 2, batch_size=2, workers=2, progress_dir=tmp_path / "parts", chunk_batches=1, max_batches=2)
    started: list[object] = []
    real = extract_mod.DecodeAhead
    monkeypatch.setattr(extract_mod, "DecodeAhead", lambda *args: started.append(args) or real(*args))
    resumed = extract_features(model, PHOTOS * 2, batch_size=2, workers=2, progress_dir=tmp_path / "parts", chunk_batches=1,
                               resume=True)
    assert started == []  # which parts to keep is known only once the engine's manifest is checked
    assert resumed.resumed == 4 and resumed.computed == 4
    assert resumed.features.tobytes() == full.features.tobytes()


def test_openvino_submit_overlaps_and_matches_the_synchronous_call() -> None:
    pytest.importorskip("openvino")
    from cl_zoo.embedding.engine import model_fingerprint
    from cl_zoo.backends.openvino import OpenVINORunner

    torch.manual_seed(0)
    model = small_model()
    pre = extract_mod.Preprocess.from_model(model)
    runner = OpenVINORunner(model, fingerprint=model_fingerprint(model), input_hw=pre.crop_size, mean=pre.mean, std=pre.std,
                            precision="fp32", threads=1)
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8) for _ in range(2))
    first, second = runner.submit(a), runner.submit(b)  # two batches queued before either is read
    assert np.array_equal(second(), runner(b)) and np.array_equal(first(), runner(a))
    assert threading.active_count() >= 1


def test_cli_embed_module_imports_nothing_heavy_at_the_top() -> None:
    source = Path(extract_mod.__file__).parents[1] / "cli" / "embed.py"
    tree = ast.parse(source.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module)
    assert top <= {"__future__", "json", "os", "shlex", "pathlib", "click", "cl_zoo.errors"}, top


def test_embed_to_output_writes_what_the_cli_writes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = small_model()
    out = tmp_path / "emb.npy"
    run = run_mod.embed_to_output(PHOTOS, str(out), model=model, options=EngineOptions(precision="fp32", backend="torch", workers=0))
    features, paths, _ = cl_zoo.embedding.load_embeddings(out)
    assert run.summary["images"] == 4 and len(paths) == 4 and features.shape[0] == 4
    assert run.line.startswith("embedded 4 images") and run.warning is None
    again = run_mod.embed_to_output(PHOTOS, str(out), model=model, resume=True,
                                    options=EngineOptions(precision="fp32", backend="torch", workers=0))
    assert again.summary == {"output": str(out), "images": 4, "finished": True}


def test_cli_defaults_are_the_engine_options_defaults() -> None:
    from cl_zoo.cli.embed import embed_command

    defaults = {p.name: p.default for p in embed_command.params}
    options = EngineOptions()
    for name in ("precision", "backend", "device", "batch_size", "workers", "calibration_seed"):
        assert defaults[name] == getattr(options, name), name
