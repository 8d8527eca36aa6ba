"""OpenVINO runs fixed-size infer requests: any batch size gives the features each image has alone.

The graph is compiled for a static batch of :data:`~cl_zoo.backends.openvino.REQUEST_IMAGES` and a
batch is split into requests of that size, the last one padded; these tests hold the padding and the
order to account, and check what happens to blobs cached by the dynamic-batch graph before.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.helpers import tiny_model

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed (pip install 'cl-zoo[openvino]')"),
    pytest.mark.usefixtures("isolated_cache"),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


def _runner(model, precision: str = "fp32"):
    from cl_zoo.backends.openvino import OpenVINORunner
    from cl_zoo.embedding import Preprocess, model_fingerprint

    pre = Preprocess.from_model(model)
    return OpenVINORunner(model, fingerprint=model_fingerprint(model), input_hw=pre.crop_size, mean=pre.mean, std=pre.std,
                          precision=precision, threads=2)


def _pixels(count: int) -> np.ndarray:
    return np.random.default_rng(count).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)


def test_the_graph_runs_a_static_batch_of_request_images(model):
    from cl_zoo.backends.openvino import REQUEST_IMAGES

    runner = _runner(model)
    assert runner.request_images == REQUEST_IMAGES
    assert [d.get_length() for d in runner.compiled.input(0).get_partial_shape()] == [REQUEST_IMAGES, 32, 32, 3]


@pytest.mark.parametrize("count", [1, 7, 8, 9, 17, 24])
def test_any_batch_size_gives_each_image_its_own_features(model, count):
    """Padded requests (1, 7, 9, 17) and exact ones (8, 24): every row as that image alone, in order."""
    import torch

    from cl_zoo.backends.openvino import _UInt8Features
    from cl_zoo.embedding import Preprocess

    runner = _runner(model)
    pixels = _pixels(count)
    got = runner(pixels)
    assert got.shape == (count, runner.dim) and got.dtype == np.float32 and np.isfinite(got).all()
    alone = np.concatenate([runner(pixels[i : i + 1]) for i in range(count)])
    np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-5)
    pre = Preprocess.from_model(model)
    with torch.no_grad():
        reference = _UInt8Features(model, pre.mean, pre.std).eval()(torch.from_numpy(pixels)).numpy()
    cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    assert cos.min() >= 0.99999, cos


def test_an_empty_batch_gives_no_rows(model):
    runner = _runner(model)
    assert runner(np.zeros((0, 32, 32, 3), dtype=np.uint8)).shape == (0, runner.dim)


def test_blobs_of_the_dynamic_graph_are_removed_and_a_planted_link_is_not_followed(model, tmp_path):
    from cl_zoo.backends.openvino import _blob_folder, _legacy_blob_folder

    folder = _runner(model, "bf16").folder  # one runner alive at a time, as the pipeline makes them
    legacy = folder / _legacy_blob_folder("bf16")
    legacy.mkdir()
    (legacy / "old.blob").write_bytes(b"stale")
    elsewhere = tmp_path / "not-the-cache"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (legacy / "link").symlink_to(elsewhere)
    again = _runner(model, "bf16")
    assert again.checked_by in {"probe", "probe remembered"}  # the cached entry was used, not converted again
    assert not legacy.exists() and (folder / _blob_folder("bf16")).is_dir()
    assert (elsewhere / "keep.txt").read_text() == "mine"  # unlinked, not followed


@pytest.mark.timeout(60)  # before the fix this waited forever
def test_an_inference_that_fails_raises_instead_of_waiting_forever(model, tmp_path):
    """OpenVINO never calls back for a failed request, so the runner asks the requests for their error.

    Before the fix the batch's wait had no other way to end: it waited forever, in ``embed`` as in
    the probe of a cached graph. Later batches, which OpenVINO hands the failed request, raise too.
    """
    import openvino as ov

    from cl_zoo.backends.openvino import InferenceError
    from tests.helpers import openvino_graph_failing_at_run_time

    runner = _runner(model)
    (tmp_path / "failing").mkdir()
    ov.save_model(openvino_graph_failing_at_run_time(32, 32), str(tmp_path / "failing" / "model.xml"))
    runner._compile(tmp_path / "failing", "fp32", 2)
    for count in (9, 17, 1):  # several requests per batch, then the pool holding failed requests
        with pytest.raises(InferenceError) as raised:
            runner(_pixels(count))
        message = str(raised.value)
        assert "reshape" in message and "--backend torch" in message and "\n" not in message


class _Request:
    """An infer request as the wait sees it: busy until ``busy_until`` (monotonic seconds), then idle."""

    def __init__(self, busy_until: float = 0.0) -> None:
        self.busy_until = busy_until

    def wait_for(self, timeout_ms: int) -> bool:
        import time

        return time.monotonic() >= self.busy_until


@pytest.mark.timeout(30)
def test_a_batch_whose_callback_never_comes_is_reported_once_every_request_idles(monkeypatch):
    import time

    from cl_zoo.backends import openvino as ovb

    monkeypatch.setattr(ovb, "_LOST_CALLBACK_S", 0.6)
    runner = object.__new__(ovb.OpenVINORunner)
    runner.queue = [_Request(), _Request(busy_until=time.monotonic() + 1.0)]
    start = time.monotonic()
    with pytest.raises(ovb.InferenceError, match="never reported its features"):
        runner._wait(ovb._Countdown(1))
    assert time.monotonic() - start >= 1.6  # the busy request's second, then the idle grace


@pytest.mark.timeout(30)
def test_a_slow_batch_is_waited_for_while_its_requests_run(monkeypatch):
    import threading
    import time

    from cl_zoo.backends import openvino as ovb

    monkeypatch.setattr(ovb, "_LOST_CALLBACK_S", 0.3)
    runner = object.__new__(ovb.OpenVINORunner)
    runner.queue = [_Request(busy_until=time.monotonic() + 1.5)]
    countdown = ovb._Countdown(1)
    threading.Timer(1.2, countdown.hit).start()  # the callback, while the request still runs
    runner._wait(countdown)
    assert countdown.event.is_set()
