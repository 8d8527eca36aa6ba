"""Feature extraction on OpenVINO: convert once, cache, run several inference streams.

The converted graph takes the decoded uint8 NHWC batch as it comes out of the DataLoader and does
the float conversion, normalisation, layout change, network and flattening itself, so the Python
side only hands over a buffer and the CPU plugin fuses the preprocessing into the first
convolution.

Cache layout (``$CL_ZOO_CACHE/openvino``, default ``~/.cache/cl-zoo/openvino``)::

    <key>/model.xml, model.bin   the converted graph (fp32 weights; written to a temporary folder
                                 and renamed into place, so a reader never sees half a model)
    <key>/source.json            what it was converted for (input size, normalisation)
    <key>/entry.json             the entry's record, written last: the sha256 of the weights it was
                                 converted from and the size and sha256 of every file above
    <key>/compiled-<precision>-n8/  OpenVINO's own compiled-blob cache for that precision hint, for
                                 the graph at a static batch of :data:`REQUEST_IMAGES` (8); the
                                 ``compiled-<precision>/`` blobs of the dynamic-batch graph that
                                 older cl-zoo versions cached are removed once the static one compiles

``<key>`` hashes the weights (the same digest as embedding progress files), the preprocessing, the
input size and the OpenVINO version: a retrained checkpoint with the same name never reuses a stale
graph, and compiling from a cached blob takes well under a second instead of a 5-15 s conversion.

Outputs are always float32, whatever the precision hint ran inside.

A cache entry is never trusted for existing at the right key: the key is computable from public
weights, so a cache shared by a team or a CI runner can hold a graph someone else put there, and a
half-deleted entry must not end every later run in a traceback. Before use an entry is checked
(:func:`entry_problem`): its record names the same weights, every file it lists is a regular file
(a symlink, a FIFO or ``/dev/zero`` in its place is damage) of the recorded size and sha256, and it
holds nothing else. Then a graph compiled from the cache is checked once more against the torch
model on a seeded probe batch (:data:`PROBE_MIN_COSINE`), which a forged record or a planted
compiled blob cannot pass. Any failure converts again, atomically, over the old entry. A passed
probe is remembered in the user's own state folder for exactly the files that passed
(:mod:`cl_zoo.backends.verified`: device, inode, size, mtime and ctime of each, unchanged from before
the compile to after it), so an untouched entry is not re-hashed and re-probed by every new process
(that work was about two fifths of a fresh process's warm start: docs/benchmarks.md, "On an Intel
Xeon with AMX"); any file written, replaced or added since is probed again.

A model whose first operations cannot run in bf16 says so by defining
``float32_input_transform(rgb)`` and ``forward_transformed(x)`` (CMC's RGB -> Lab, whose a and b
channels are differences of nearly equal cube roots, which bf16 cancels). For such a model the
transform runs on the host in torch float32 (:class:`HostTransform`) and only the rest is converted,
taking the transform's float32 NCHW output: the bf16 graph then keeps the features at float32's
within rounding, and the host-side colour conversion costs less than the bf16 graph saves
(``benchmarks/int8_fidelity.py --candidate bf16``; docs/benchmarks.md, "CMC's colour conversion
on the host").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.backends.cache import (  # re-exported: callers import the cache's names from this module too
    RECORD_FORMAT,
    RECORD_NAME,
    discard_entry,
    entry_files,
    entry_problem,
    openvino_cache_dir,
    save_graph_folder,
)
from cl_zoo.backends.int8 import CalibrationImages, Int8Rejected, quantized_graph
from cl_zoo.backends.signal_stack import own_signal_stack
from cl_zoo.backends.verified import VerifiedMemo, folder_identity
from cl_zoo.errors import ClZooError
from cl_zoo.optional import require
from cl_zoo.threads import torch_threads

CACHE_FORMAT = 1
# The least cosine a graph compiled from the cache must keep to the torch model on the probe batch.
# A fresh conversion keeps >= 0.99999 in fp32 and >= 0.999 in bf16 (tests/test_precision.py); a planted
# graph of other weights keeps about 0.5, far below every threshold. int8 is probed on held-out
# calibration images, which its gate already measured at >= MIN_COSINE (0.99) against fp32.
PROBE_MIN_COSINE = {"fp32": 0.999, "bf16": 0.99, "int8": 0.98}
# One image: a graph of other weights or a damaged blob is far off on any input (see above), and the
# probe's torch fp32 reference is the costliest step of a warm start (two images were over half of a
# warm bf16 ResNet-50 start: docs/benchmarks.md, "On an Intel Xeon with AMX").
PROBE_IMAGES = 1
_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8 layers run int8 under any hint (cl_zoo.backends.int8)


class ConversionError(ClZooError):
    """The model cannot be converted to OpenVINO; ``reason`` is one line for the fallback message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InferenceError(ClZooError):
    """OpenVINO failed to run a batch; ``reason`` is one line, as :class:`ConversionError`'s."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"OpenVINO inference failed ({reason}); --backend torch runs without OpenVINO")
        self.reason = reason


def _engine_reason(exc: BaseException) -> str:
    """The plugin's own line of an OpenVINO error, below its stack of "Exception from src/...:NNN:" lines."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith("Exception from ")]
    return (lines[-1] if lines else type(exc).__name__)[:300]


# How often a wait for a batch asks its infer requests whether one failed (seconds). A failed
# request never calls back (see OpenVINORunner.submit), so this is how a failure is seen at all; a
# batch that completes wakes the waiter at once, whatever the interval.
_FAILURE_POLL_S = 0.25
# How long every request may sit idle while a batch still waits for a callback before that callback
# counts as lost (seconds): far above the moment a finished request's callback waits for the GIL.
_LOST_CALLBACK_S = 10.0


class _PixelNormalize(nn.Module):
    """uint8 NHWC pixels -> normalised NCHW float32: inside the graph, or on the host before a host transform."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([m * 255.0 for m in mean]).view(1, 3, 1, 1))
        self.register_buffer("inv_std", 1.0 / torch.tensor([s * 255.0 for s in std]).view(1, 3, 1, 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return (pixels.permute(0, 3, 1, 2).float() - self.mean) * self.inv_std


class _UInt8Features(nn.Module):
    """uint8 NHWC pixels -> normalised NCHW float -> ``forward_features`` -> ``[B, D]``."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.model = model
        self.normalize = _PixelNormalize(mean, std)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        fn = getattr(self.model, "forward_features", self.model)
        out = fn(self.normalize(pixels))
        return out.reshape(out.shape[0], -1)


class _TransformedFeatures(nn.Module):
    """The graph of a model with a host-side float32 input transform: ``forward_transformed`` -> ``[B, D]``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model.forward_transformed(x)
        return out.reshape(out.shape[0], -1)


def has_host_transform(model: nn.Module) -> bool:
    """Whether ``model`` asks for its input transform to run in float32 outside the converted graph."""
    return callable(getattr(model, "float32_input_transform", None)) and callable(getattr(model, "forward_transformed", None))


class HostTransform:
    """uint8 NHWC pixels -> normalisation -> the model's ``float32_input_transform``, in torch float32."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        self.transform = model.float32_input_transform
        self.normalize = _PixelNormalize(mean, std)

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        # Runs beside OpenVINO's streams on every batch: one thread, which spins for no one (cl_zoo.threads).
        with torch.no_grad(), torch_threads(1):
            x = self.normalize(torch.from_numpy(np.ascontiguousarray(pixels)))
            return np.ascontiguousarray(self.transform(x).float().numpy())


def conversion_key(fingerprint: str, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float],
                   *, host_transform: bool = False) -> str:
    openvino = require("openvino", "--backend openvino")

    payload: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "weights": fingerprint,
        "input": list(input_hw),
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "openvino": openvino.__version__,
    }
    if host_transform:  # only such models' keys change, so existing caches stay valid
        payload["host_transform"] = True
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def is_cached(fingerprint: str, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float],
              *, host_transform: bool = False) -> bool:
    """Whether a usable converted graph for these weights and input size is on disk (checked, not
    just present: a planted or damaged entry does not make ``auto`` pick OpenVINO)."""
    try:
        key = conversion_key(fingerprint, input_hw, mean, std, host_transform=host_transform)
    except ImportError:
        return False
    return entry_problem(openvino_cache_dir() / key, {"weights": fingerprint}) is None


def _convert(model: nn.Module, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float], folder: Path,
             host_transform: HostTransform | None, fingerprint: str) -> None:
    """Convert ``model`` into ``folder`` (created atomically: temporary sibling, then rename); with
    ``host_transform`` the graph starts from its output instead of uint8 pixels."""
    ov = require("openvino", "--backend openvino")

    h, w = input_hw
    pixels = torch.zeros(2, h, w, 3, dtype=torch.uint8)
    if host_transform is not None:
        wrapped: nn.Module = _TransformedFeatures(model).eval()
        example = torch.from_numpy(host_transform(pixels.numpy()))
        graph_input = ([-1, *example.shape[1:]], ov.Type.f32)
    else:
        wrapped, example, graph_input = _UInt8Features(model, mean, std).eval(), pixels, ([-1, h, w, 3], ov.Type.u8)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer deprecation and shape-assert chatter, not the user's concern
            graph = ov.convert_model(wrapped, example_input=example, input=[graph_input])
    except Exception as exc:  # noqa: BLE001 - any tracer/frontend failure means "not convertible"
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise ConversionError(f"{type(exc).__name__}: {text}") from None
    save_graph_folder(graph, folder, {"source.json": json.dumps({"input": [h, w], "mean": list(mean), "std": list(std)}) + "\n"},
                      record={"weights": fingerprint}, replace=True)


# Every infer request runs exactly this many images: the graph is compiled for a static batch of it,
# and a batch is split into requests of this size (the last one padded). On a dynamic batch
# dimension the CPU plugin re-plans the graph for every new shape and keeps checking shapes on every
# call; static, it plans once at compile time. Of the sizes measured (4, 8, 16 against the dynamic
# graph, ``benchmarks/openvino_requests.py``), 8 costs the least CPU per image on an AMX host (3-7%
# less than the dynamic graph), loses nothing measurable without AMX, and makes the first call cost
# no more than the next (docs/benchmarks.md, ``embed_throughput.py``: "static infer requests of 8
# images" on the AMX Xeon, and "After the static requests" on the AMD EPYC). A fixed size (rather
# than batch size / streams) keeps one compiled blob per precision whatever the batch size; a
# partial last request wastes at most 7 images.
REQUEST_IMAGES = 8


def _blob_folder(precision: str) -> str:
    """The entry's sub-folder that holds the plugin's compiled blobs for ``precision`` at :data:`REQUEST_IMAGES`."""
    return f"compiled-n{REQUEST_IMAGES}" if precision == "int8" else f"compiled-{precision}-n{REQUEST_IMAGES}"


def _legacy_blob_folder(precision: str) -> str:
    """Where older versions cached blobs of the dynamic-batch graph (removed once a static one compiles)."""
    return "compiled" if precision == "int8" else f"compiled-{precision}"


def _probe_key(graph_folder: Path, precision: str, threads: int | None, fingerprint: str) -> str:
    """What a remembered probe stands for: this graph, compiled this way, by this OpenVINO, against these weights."""
    ov = require("openvino", "--backend openvino")
    return json.dumps([os.path.realpath(graph_folder), precision, threads, ov.__version__, fingerprint])


class OpenVINORunner:
    """A compiled model that maps uint8 NHWC batches to float32 features.

    Batches are split across the plugin's optimal number of infer requests (one per CPU stream)
    and run asynchronously, so both cores work on one batch even under the THROUGHPUT hint.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        fingerprint: str,
        input_hw: tuple[int, int],
        mean: Sequence[float],
        std: Sequence[float],
        precision: str,
        threads: int | None = None,
        calibration: np.ndarray | CalibrationImages | None = None,
        force_int8: bool = False,
    ) -> None:
        """``precision="int8"`` quantizes the converted graph on ``calibration`` (the user's images,
        uint8 NHWC pixels or :class:`~cl_zoo.backends.int8.CalibrationImages` that decode only when
        the cache needs them) and raises :class:`~cl_zoo.backends.int8.Int8Rejected` when the result
        fails its fidelity gate, unless ``force_int8``."""
        require("openvino", "--backend openvino")

        if precision not in _HINTS:
            raise ClZooError(f"OpenVINO runs fp32, bf16 or int8, not {precision}")
        if precision == "int8" and calibration is None:
            raise ClZooError("int8 needs calibration images")
        if isinstance(calibration, np.ndarray):
            calibration = CalibrationImages.from_pixels(calibration)
        self.precision = precision
        self.fidelity = None
        self.int8_folder: Path | None = None
        self.quantized = False  # int8 only: quantized by this call rather than read from the cache
        self.host_transform = HostTransform(model, mean, std) if has_host_transform(model) else None
        self.key = conversion_key(fingerprint, input_hw, mean, std, host_transform=self.host_transform is not None)
        self.folder = openvino_cache_dir() / self.key
        self.fingerprint, self.input_hw = fingerprint, (int(input_hw[0]), int(input_hw[1]))
        self.converted = False
        self.checked_by = ""  # how the compiled graph was trusted: converted now, probe, probe remembered, not probed
        self.cache_problem = entry_problem(self.folder, {"weights": fingerprint})  # why the cache was not used, if it was not
        if self.cache_problem is not None:
            self._reconvert(model, input_hw, mean, std)
        memo = VerifiedMemo()
        for _ in (0, 1):  # the cache's graph, then (if it fails) a fresh conversion, which is not probed
            graph_folder = self._graph(model, input_hw, mean, std, calibration, threads, force_int8)
            fresh = self.converted and (precision != "int8" or self.quantized)
            probe_key = _probe_key(graph_folder, precision, threads, fingerprint)
            files_before = folder_identity(graph_folder, [_blob_folder(precision)])
            try:
                self._compile(graph_folder, precision, threads)
            except Exception as exc:  # noqa: BLE001 - a cached graph that does not compile is converted again
                if fresh:
                    raise ConversionError(f"compile failed ({type(exc).__name__}: {str(exc)[:200]})") from None
                self.cache_problem = f"does not compile ({type(exc).__name__})"
                self._reconvert(model, input_hw, mean, std)
                continue
            # Unchanged from before the compile to after it, and as they were when this user's probe
            # passed: the plugin compiled the very bytes that passed (cl_zoo.backends.verified).
            files_after = folder_identity(graph_folder, [_blob_folder(precision)])
            if fresh:
                self.checked_by = "converted now"
                break
            if files_after == files_before and memo.probed(probe_key, files_after):
                self.checked_by = "probe remembered"
                break
            problem, probed = self._probe(model, mean, std, calibration, force_int8)
            if problem is None:
                self.checked_by = "probe" if probed else "not probed"
                if probed:
                    memo.remember_probe(probe_key, files_after)
                break
            self.cache_problem = problem
            self._reconvert(model, input_hw, mean, std)

    def _reconvert(self, model: nn.Module, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> None:
        _convert(model, input_hw, mean, std, self.folder, self.host_transform, self.fingerprint)
        self.converted = True

    def _graph(self, model: nn.Module, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float],
               calibration: CalibrationImages | None, threads: int | None, force_int8: bool) -> Path:
        """The folder of the graph to compile: the converted one, or its int8 version (gated)."""
        if self.precision != "int8":
            return self.folder
        assert calibration is not None
        graph_folder, self.fidelity, self.quantized = self._int8(model, input_hw, mean, std, calibration, threads)
        self.int8_folder = graph_folder
        if not force_int8:
            if self.fidelity is None:
                raise Int8Rejected(None, f"{len(calibration)} calibration images are too few to check int8 against fp32")
            if not self.fidelity.passed:
                raise Int8Rejected(self.fidelity, f"int8 kept {self.fidelity.describe()}")
        return graph_folder

    def _compile(self, graph_folder: Path, precision: str, threads: int | None) -> None:
        ov = require("openvino", "--backend openvino")

        core = ov.Core()
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": _HINTS[precision],
            "PERFORMANCE_HINT": "THROUGHPUT",
            "CACHE_DIR": str(graph_folder / _blob_folder(precision)),
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        graph = core.read_model(str(graph_folder / "model.xml"))
        # Only the batch is dynamic in a graph cl-zoo converts; any other dynamic dimension raises
        # here, and a cached graph that does not compile is converted again (the caller's loop).
        graph.reshape(ov.PartialShape([REQUEST_IMAGES, *(d.get_length() for d in list(graph.input(0).get_partial_shape())[1:])]))
        self.request_images = REQUEST_IMAGES
        self.compiled = core.compile_model(graph, "CPU", config)
        own_signal_stack()  # not the plugin's: it may be freed before the thread stops using it (cl_zoo.backends.signal_stack)
        self.jobs = max(1, int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self.dim = int(self.compiled.output(0).get_partial_shape()[1].get_length())
        self.queue = ov.AsyncInferQueue(self.compiled, self.jobs)
        self.queue.set_callback(self._done)
        legacy = graph_folder / _legacy_blob_folder(precision)
        if legacy.is_dir() and not legacy.is_symlink():  # superseded blobs (90 MB for a bf16 ResNet-50)
            shutil.rmtree(legacy, ignore_errors=True)  # fd-based on Linux: a planted symlink inside is unlinked, not followed

    def _probe(self, model: nn.Module, mean: Sequence[float], std: Sequence[float], calibration: CalibrationImages | None,
               force_int8: bool) -> tuple[str | None, bool]:
        """(Why the compiled graph does not reproduce ``model`` on a few images or None, whether it was compared).

        fp32/bf16 are probed on seeded noise; int8 on held-out calibration images (its ranges were
        calibrated on real pixels), and a forced int8 that failed its gate is not probed: its
        features are known not to match.
        """
        threshold = PROBE_MIN_COSINE[self.precision]
        if self.precision == "int8":
            if calibration is None or self.fidelity is None or (force_int8 and not self.fidelity.passed):
                return None, False
            pixels = calibration.held_out(PROBE_IMAGES)
            if len(pixels) == 0:
                return None, False
        else:
            pixels = np.random.default_rng(0).integers(0, 256, (PROBE_IMAGES, *self.input_hw, 3), dtype=np.uint8)
        # One thread: the decoders already hold the other cores (cl_zoo.threads says what two cost).
        with torch.no_grad(), torch_threads(1):
            if self.host_transform is not None:
                reference = _TransformedFeatures(model).eval()(torch.from_numpy(self.host_transform(pixels)))
            else:
                reference = _UInt8Features(model, mean, std).eval()(torch.from_numpy(pixels))
        reference_np = reference.float().numpy()
        try:
            got = self(pixels)
        except InferenceError as exc:  # a planted or damaged graph that fails at run time
            return f"inference failed ({exc.reason})", True
        if got.shape != reference_np.shape:
            return f"it gives {got.shape[1]} features, the model {reference_np.shape[1]}", True
        a = reference_np / np.maximum(np.linalg.norm(reference_np, axis=1, keepdims=True), 1e-12)
        b = got / np.maximum(np.linalg.norm(got, axis=1, keepdims=True), 1e-12)
        cosine = float((a * b).sum(axis=1).min()) if np.isfinite(got).all() else float("nan")
        if not cosine >= threshold:
            return f"cosine {cosine:.4f} to the torch model on a probe batch, below {threshold}", True
        return None, True

    def _int8(self, model: nn.Module, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float],
              calibration: CalibrationImages, threads: int | None) -> tuple[Path, Any, bool]:
        """The cached or newly quantized int8 graph; a damaged fp32 cache entry is rebuilt once."""
        transform = self.host_transform
        try:
            return quantized_graph(self.folder, calibration, threads=threads, transform=transform)
        except ClZooError:
            raise
        except Exception as exc:  # noqa: BLE001 - a fp32 graph that cannot be read is rebuilt, then reported
            if self.converted:
                raise ConversionError(f"int8 quantization failed ({type(exc).__name__}: {str(exc)[:200]})") from None
            self._reconvert(model, input_hw, mean, std)
            return quantized_graph(self.folder, calibration, threads=threads, transform=transform)

    @staticmethod
    def _done(request: Any, userdata: tuple[np.ndarray, int, int, _Countdown, np.ndarray]) -> None:
        out, start, count, countdown, _ = userdata  # the input slice rides along so it outlives the request
        try:
            data = request.get_output_tensor(0).data
            out[start : start + count] = data[:count]  # a padded request's extra rows are dropped
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread, not lost in OpenVINO's
            countdown.error = exc
        countdown.hit()

    def submit(self, pixels: torch.Tensor | np.ndarray) -> Callable[[], np.ndarray]:
        """Start a uint8 ``[B, H, W, 3]`` batch; the returned call waits for its float32 ``[B, D]`` features.

        The batch is split into infer requests of :data:`REQUEST_IMAGES` (the last one padded with
        zeros, whose features are dropped), which the CPU streams run side by side, and the call
        returns as soon as they are queued, so the caller can fetch and decode the next batch while
        this one runs: decode and inference overlap instead of alternating. ``start_async`` blocks
        only while every request is busy, which is the back-pressure that keeps at most about one
        batch queued behind the running one. Inputs are shared, not copied (``share_inputs``); each
        slice is kept alive in its request's userdata. A request that fails raises
        :class:`InferenceError` from the returned call (:meth:`_wait`), or from a later ``submit``
        that OpenVINO hands the failed request to.
        """
        x = np.ascontiguousarray(pixels.numpy() if isinstance(pixels, torch.Tensor) else pixels)
        if self.host_transform is not None:
            x = self.host_transform(x)
        n = len(x)
        out = np.empty((n, self.dim), dtype=np.float32)
        size = self.request_images
        bounds = np.append(np.arange(0, n, size), n)
        countdown = _Countdown(len(bounds) - 1)
        for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            part = x[s:e]
            if e - s < size:
                part = np.concatenate([part, np.zeros((size - (e - s), *x.shape[1:]), dtype=x.dtype)])
            try:
                self.queue.start_async({0: part}, (out, s, e - s, countdown, part), share_inputs=True)
            except RuntimeError as exc:  # the idle request it picked had failed: OpenVINO rethrows that here
                raise InferenceError(_engine_reason(exc)) from None

        def result() -> np.ndarray:
            self._wait(countdown)
            if countdown.error is not None:
                raise countdown.error
            return out

        return result

    def _wait(self, countdown: _Countdown) -> None:
        """Until every request of a batch called back; :class:`InferenceError` if one of them failed.

        OpenVINO's ``AsyncInferQueue`` calls the Python callback only for a request that succeeded:
        a failed one rethrows its error inside the queue's own completion handler instead (seen with
        openvino 2026.4 on a graph that fails at run time), so a plain wait on the callbacks would
        wait forever. The failure stays on the request, where ``wait_for(0)`` raises it. A batch that
        still has no answer after every request sat idle for :data:`_LOST_CALLBACK_S` (a lost
        callback with no error left to ask for) is reported as well, rather than waited on forever.
        """
        idle_since: float | None = None
        while not countdown.event.wait(_FAILURE_POLL_S):
            busy = False
            for request in self.queue:
                try:
                    busy |= not request.wait_for(0)
                except RuntimeError as exc:
                    raise InferenceError(_engine_reason(exc)) from None
            now = time.monotonic()
            idle_since = None if busy else (now if idle_since is None else idle_since)
            if idle_since is not None and now - idle_since >= _LOST_CALLBACK_S and not countdown.event.is_set():
                raise InferenceError("every infer request is idle, but a batch never reported its features")

    def __call__(self, pixels: torch.Tensor | np.ndarray) -> np.ndarray:
        """Features ``[B, D]`` float32 of a uint8 ``[B, H, W, 3]`` batch."""
        return self.submit(pixels)()


class _Countdown:
    """Set once ``parts`` infer requests of one batch have called back (from OpenVINO's threads)."""

    def __init__(self, parts: int) -> None:
        self.left = parts
        self.error: BaseException | None = None
        self.lock, self.event = threading.Lock(), threading.Event()
        if parts == 0:
            self.event.set()

    def hit(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.event.set()


__all__ = [
    "RECORD_FORMAT",
    "RECORD_NAME",
    "ConversionError",
    "HostTransform",
    "InferenceError",
    "OpenVINORunner",
    "conversion_key",
    "has_host_transform",
    "is_cached",
    "discard_entry",
    "entry_files",
    "entry_problem",
    "openvino_cache_dir",
    "save_graph_folder",
]
