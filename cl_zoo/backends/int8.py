"""int8 feature extraction: NNCF post-training quantization of the converted OpenVINO graph, gated
by how well it keeps each image's nearest neighbours.

Why int8, and why a gate. On VNNI/AMX CPUs int8 convolutions run about twice as fast as bf16
(model-only rates in docs/benchmarks.md, "Choosing the int8 recipe"). But int8 moves features far
more than bf16 does, and users embed to search and deduplicate, so the measure is neighbour recall,
not accuracy on a label set: every int8 model is checked on images it was not calibrated on before
it is used.

The recipe (MINMAX activation ranges and NNCF's full bias correction, every layer int8) was chosen
by neighbour recall and minimum cosine to fp32 on held-out images, against NNCF's defaults, its
MIXED preset, layers kept in float and the accuracy-aware search; the measurements are in
docs/benchmarks.md, "Choosing the int8 recipe".

NNCF's default activation ranges clip outliers (quantiles), which suits classifiers whose argmax
survives clipping; pooled features are averages over exactly those large activations, so clipping
moves them. Min/max ranges keep them, cost nothing at run time, and match what the slower
accuracy-aware search finds. NNCF's full bias correction (instead of the fast one) then recovers
the per-channel mean shift int8 leaves in each layer's output, also at no run-time cost. Keeping
layers in float cost speed and bought nothing once those two were on.

The int8 graph compiles with an f32 inference hint: int8 layers run int8 either way, and with a
bf16 hint OpenVINO 2026.4's CPU plugin failed on a float convolution left between int8 ones
("Convolution node ... is not initialized"), while plain int8 ran no faster under it.

Cache layout, beside the fp32 graph it was made from (:mod:`cl_zoo.backends.openvino`)::

    <fp32 key>/int8-<key>/model.xml, model.bin, fidelity.json, entry.json, compiled-n8/

``entry.json`` records the sha256 of the fp32 graph it was quantized from, of the calibration pixels
and of its own files, and is checked before the entry is used (:func:`cl_zoo.backends.openvino.entry_problem`):
a mismatch or damage quantizes again.

``<key>`` hashes the calibration pixels, the recipe version and the NNCF and OpenVINO versions, so a
different calibration set, a new NNCF or a new recipe never reuses a stale model; the fp32 key
already covers the weights, the input size and the normalisation.

Beside the entries, ``calibration/<identity>.json`` remembers the pixels' digest of a calibration
set under its files' identity (:class:`CalibrationImages`), so a warm run finds its model without
decoding the set again.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import random
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from cl_zoo.backends.cache import entry_files, entry_problem, save_graph_folder
from cl_zoo.backends.signal_stack import own_signal_stack
from cl_zoo.errors import ClZooError
from cl_zoo.optional import is_installed, missing_message, require
from cl_zoo.fileio import atomic_write_json, cache_root, read_bounded_json

INT8_FEATURE = "--precision int8"
RECIPE_VERSION = 2  # bump when the quantization settings below change: old cache entries are then ignored
CALIBRATION_SIZE = 512  # images sampled from the user's own: half calibrate, half are held out for the gate
MIN_CALIBRATION_IMAGES = 64  # below this the held-out half cannot say anything about neighbours
MIN_RECALL_AT_10 = 0.95
MIN_COSINE = 0.99
NEIGHBOURS = 10


def int8_available() -> bool:
    """Whether ``nncf`` and ``openvino`` (the ``int8`` extra) are importable."""
    return is_installed("nncf") and is_installed("openvino")


def missing_int8_packages() -> str:
    """The one line a command prints when int8 cannot run here."""
    missing = [name for name in ("openvino", "nncf") if not is_installed(name)]
    return missing_message(missing, INT8_FEATURE, extra="int8")


def calibration_sample(paths: Sequence[str], size: int = CALIBRATION_SIZE, seed: int = 0) -> list[str]:
    """``size`` of ``paths`` chosen by ``seed`` (all of them when there are fewer), in a seeded order.

    The order matters: the first half calibrates and the second half is held out for the gate, so
    both halves are random draws from the whole collection rather than its first and last folders.
    """
    if size < 1:
        raise ClZooError(f"calibration size must be at least 1, got {size}")
    rng = random.Random(seed)
    chosen = rng.sample(range(len(paths)), min(size, len(paths)))
    return [os.fspath(paths[i]) for i in chosen]


_MEMO_FORMAT = "cl-zoo-calibration-memo/1"
_MEMO_MAX_BYTES = 4096
_HEX = frozenset("0123456789abcdef")


def _calibration_memo_path(identity: str) -> Path:
    return cache_root() / "openvino" / "calibration" / f"{identity}.json"


class CalibrationImages:
    """The calibration images of an int8 run, decoded only when the cache cannot answer without them.

    Why: the int8 cache is keyed by the sha256 of the decoded calibration pixels, so without a memo a
    warm run would decode every calibration image (up to :data:`CALIBRATION_SIZE`) only to hash them
    and find the model it quantized before, over half of a warm int8 engine setup (docs/benchmarks.md,
    "On an AMD EPYC without AMX"). The pixels' digest is remembered under the files' identity
    (``identity``: the caller's hash of each file's path, size and mtime and of the preprocessing,
    :func:`cl_zoo.fileio.files_fingerprint`), the trust the feature cache already gives file stats. A
    memo that is missing, malformed or for other files is ignored and the images are decoded; the
    int8 entry it leads to is still checked file by file against its record, and the probe still
    runs the compiled graph against the torch model on real held-out images (decoded alone).
    """

    def __init__(self, paths: Sequence[str], decode: Callable[[Sequence[str]], np.ndarray], identity: str | None) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self._decode = decode
        self.identity = identity
        self._pixels: np.ndarray | None = None
        self._digest: str | None = None
        self._memo = self._read_memo()

    @classmethod
    def from_pixels(cls, pixels: np.ndarray) -> "CalibrationImages":
        """Pixels already decoded (no files, no memo)."""
        images = cls([], lambda _: pixels, None)
        images._pixels = pixels
        return images

    def _read_memo(self) -> dict[str, Any] | None:
        if self.identity is None:
            return None
        try:
            memo = read_bounded_json(_calibration_memo_path(self.identity), _MEMO_MAX_BYTES, "calibration memo")
        except ClZooError:
            return None
        if not isinstance(memo, dict) or memo.get("format") != _MEMO_FORMAT or memo.get("identity") != self.identity:
            return None
        images, digest = memo.get("images"), memo.get("pixels_sha256")
        if not (isinstance(images, int) and not isinstance(images, bool) and 0 < images <= len(self.paths)):
            return None
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
            return None
        return memo

    @property
    def pixels(self) -> np.ndarray:
        """uint8 NHWC pixels of the images that decode, in order (decoded once, then remembered)."""
        if self._pixels is None:
            self._pixels = self._decode(self.paths)
            self._digest = pixels_digest(self._pixels)
            if self.identity is not None and len(self._pixels):
                record = {"format": _MEMO_FORMAT, "identity": self.identity, "images": len(self._pixels),
                          "pixels_sha256": self._digest}
                try:
                    atomic_write_json(_calibration_memo_path(self.identity), record)
                except OSError:
                    pass  # a read-only cache only costs the next run its decode
        return self._pixels

    @property
    def decoded(self) -> bool:
        return self._pixels is not None

    @property
    def digest(self) -> str:
        """:func:`pixels_digest` of :attr:`pixels`, from the memo while they are not decoded."""
        if self._pixels is None and self._memo is not None:
            return str(self._memo["pixels_sha256"])
        if self._digest is None:
            self._digest = pixels_digest(self.pixels)
        return self._digest

    def __len__(self) -> int:
        if self._pixels is None and self._memo is not None:
            return int(self._memo["images"])
        return len(self.pixels)

    def held_out(self, count: int) -> np.ndarray:
        """The first ``count`` pixels of the held-out (second) half, decoding only those when it can.

        Without the full decode the positions line up only when every image decoded last time, as
        the memo's count says; otherwise everything is decoded."""
        if self._pixels is None and self._memo is not None and self._memo["images"] == len(self.paths):
            return self._decode(self.paths[len(self.paths) // 2 :][:count])
        return np.ascontiguousarray(self.pixels[len(self.pixels) // 2 :][:count])


@dataclass(frozen=True)
class Fidelity:
    """How close int8 features are to fp32 ones on the held-out calibration images."""

    recall_at_10: float  # mean share of each image's 10 nearest held-out neighbours (cosine) that int8 keeps
    min_cosine: float  # the worst image's cosine between its int8 and fp32 features
    held_out: int  # images it was measured on
    calibrated_on: int  # images the ranges were calibrated on
    min_recall_at_10: float = MIN_RECALL_AT_10
    min_min_cosine: float = MIN_COSINE

    @property
    def passed(self) -> bool:
        return self.recall_at_10 >= self.min_recall_at_10 and self.min_cosine >= self.min_min_cosine

    def describe(self) -> str:
        return (f"recall@10 {self.recall_at_10:.3f} and min cosine {self.min_cosine:.4f} against fp32 on {self.held_out} "
                f"held-out images (gate: {self.min_recall_at_10:.2f} and {self.min_min_cosine:.2f})")


class Int8Rejected(ClZooError):
    """The int8 model failed its fidelity gate; the caller falls back to a float precision."""

    def __init__(self, fidelity: Fidelity | None, reason: str) -> None:
        super().__init__(reason)
        self.fidelity = fidelity
        self.reason = reason


def neighbour_recall(reference: np.ndarray, candidate: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean overlap of each row's ``k`` nearest other rows (cosine) under ``candidate`` vs ``reference``."""
    n = len(reference)
    k = min(k, n - 1)
    if k < 1:
        raise ClZooError("neighbour recall needs at least two images")

    def top_k(x: np.ndarray) -> np.ndarray:
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)
        return np.argpartition(-sim, k - 1, axis=1)[:, :k]

    ref, cand = top_k(reference.astype(np.float64)), top_k(candidate.astype(np.float64))
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref, cand)]))


def min_cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    a = reference / np.maximum(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12)
    b = candidate / np.maximum(np.linalg.norm(candidate, axis=1, keepdims=True), 1e-12)
    return float((a * b).sum(axis=1).min())


def pixels_digest(pixels: np.ndarray) -> str:
    """sha256 of the decoded calibration pixels: two paths to the same images give the same model."""
    digest = hashlib.sha256(f"{pixels.dtype}:{pixels.shape}".encode())
    digest.update(np.ascontiguousarray(pixels).data)
    return digest.hexdigest()


def int8_key(calibration_digest: str) -> str:
    nncf = require("nncf", INT8_FEATURE, extra="int8")
    openvino = require("openvino", INT8_FEATURE, extra="int8")

    payload = {"recipe": RECIPE_VERSION, "calibration": calibration_digest, "nncf": nncf.__version__,
               "openvino": openvino.__version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def run_graph(compiled: Any, pixels: np.ndarray, batch: int = 64) -> np.ndarray:
    request = compiled.create_infer_request()
    parts = [np.array(request.infer({0: pixels[s : s + batch]})[0], dtype=np.float32) for s in range(0, len(pixels), batch)]
    return np.concatenate(parts)


def _quantize(fp32_xml: Path, calibration: np.ndarray) -> Any:
    import logging

    nncf = require("nncf", INT8_FEATURE, extra="int8")
    ov = require("openvino", INT8_FEATURE, extra="int8")
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    nncf.set_log_level(logging.ERROR)  # its progress bars and INFO lines are not the user's concern
    graph = ov.Core().read_model(str(fp32_xml))
    dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
    # NNCF draws rich progress bars on stdout, which would interleave with a command's own output
    # (and land in a piped embedding listing); the quantization takes seconds, the gate says how it went.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return nncf.quantize(
            graph, dataset, subset_size=len(calibration), preset=nncf.QuantizationPreset.PERFORMANCE,
            fast_bias_correction=False,
            advanced_parameters=AdvancedQuantizationParameters(
                activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
            ),
        )


def _record(path: Path) -> Any:
    """The JSON beside a cached int8 model; ``None`` when unreadable (a cache entry is not trusted blindly)."""
    try:
        return read_bounded_json(path, max_bytes=65536, what="int8 cache record")
    except ClZooError:
        return None


def _unmeasured(path: Path) -> bool:
    """Whether the record says the model was made from too few images to measure (forced use only)."""
    raw = _record(path)
    return isinstance(raw, dict) and raw.get("measured") is False


def read_fidelity(path: Path) -> Fidelity | None:
    """The gate result saved beside a cached int8 model, or ``None`` when missing or malformed."""
    raw = _record(path)
    try:
        values = {name: raw[name] for name in ("recall_at_10", "min_cosine", "held_out", "calibrated_on")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values.values()):
        return None
    if not (0.0 <= values["recall_at_10"] <= 1.0 and -1.0 <= values["min_cosine"] <= 1.0001):
        return None
    return Fidelity(float(values["recall_at_10"]), float(values["min_cosine"]), int(values["held_out"]), int(values["calibrated_on"]))


def quantized_graph(fp32_folder: Path, calibration: np.ndarray | CalibrationImages, *, threads: int | None = None,
                    transform: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[Path, Fidelity | None, bool]:
    """The int8 graph for the fp32 graph in ``fp32_folder`` calibrated on ``calibration``: the graph's
    input (uint8 NHWC), or uint8 pixels that ``transform`` (a host transform,
    :mod:`cl_zoo.backends.openvino`) turns into it.

    Returns (folder holding ``model.xml``, the gate's measurement, whether it was made now). The
    first half of the pixels calibrates; the second half, when there are at least
    :data:`MIN_CALIBRATION_IMAGES`, measures fidelity (``None`` otherwise). Without ``transform``, a
    cached entry is found by the images' remembered digest without decoding them.
    """
    ov = require("openvino", INT8_FEATURE, extra="int8")

    images = calibration if isinstance(calibration, CalibrationImages) else CalibrationImages.from_pixels(calibration)
    # what an entry must record: the graph it was quantized from and the pixels it was calibrated on
    # (the fp32 entry was checked by the caller, so its record's digests are the files' own)
    source = {name: entry_files(fp32_folder)[name]["sha256"] for name in ("model.xml", "model.bin")}

    def cached(digest: str) -> tuple[Path, dict[str, Any], tuple[Path, Fidelity | None, bool] | None]:
        folder = fp32_folder / f"int8-{int8_key(digest)}"
        expect = {"converted_from": source, "calibration_sha256": digest}
        if entry_problem(folder, expect) is None:
            fidelity = read_fidelity(folder / "fidelity.json")
            if fidelity is not None or _unmeasured(folder / "fidelity.json"):
                return folder, expect, (folder, fidelity, False)
        return folder, expect, None

    if transform is None and not images.decoded:
        hit = cached(images.digest)[2]  # the remembered digest: found without decoding
        if hit is not None:
            return hit
    pixels = images.pixels if transform is None else transform(images.pixels)
    digest = pixels_digest(pixels)  # the pixels' own (a stale or foreign memo never names what is made)
    folder, expect, hit = cached(digest)
    if hit is not None:
        return hit
    n = len(pixels)
    measurable = n >= MIN_CALIBRATION_IMAGES
    calibrate = pixels[: n // 2] if measurable else pixels
    held = pixels[n // 2 :] if measurable else pixels[:0]
    quantized = _quantize(fp32_folder / "model.xml", calibrate)
    fidelity = None
    if measurable:
        core = ov.Core()
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        reference = run_graph(core.compile_model(core.read_model(str(fp32_folder / "model.xml")), "CPU", config), held)
        candidate = run_graph(core.compile_model(quantized.clone(), "CPU", config), held)
        fidelity = Fidelity(neighbour_recall(reference, candidate), min_cosine(reference, candidate), len(held), len(calibrate))
    own_signal_stack()  # whatever NNCF's and the gate's compiled models left behind (cl_zoo.backends.signal_stack)
    record = {"measured": fidelity is not None, "calibration_sha256": digest, **(asdict(fidelity) if fidelity else {})}
    # replace: an entry without a readable gate record is made again over the old one
    save_graph_folder(quantized, folder, {"fidelity.json": json.dumps(record, indent=1) + "\n"}, record=expect, replace=True)
    return folder, fidelity, True


__all__ = [
    "CALIBRATION_SIZE",
    "CalibrationImages",
    "INT8_FEATURE",
    "MIN_CALIBRATION_IMAGES",
    "MIN_COSINE",
    "MIN_RECALL_AT_10",
    "Fidelity",
    "Int8Rejected",
    "calibration_sample",
    "int8_available",
    "min_cosine",
    "missing_int8_packages",
    "neighbour_recall",
    "pixels_digest",
    "quantized_graph",
    "read_fidelity",
    "run_graph",
]
