"""Feature extraction on OpenVINO: convert once, cache, run several inference streams.

The converted graph takes the decoded uint8 NHWC batch as it comes out of the DataLoader and does
the float conversion, normalisation, layout change, network and flattening itself, so the Python
side only hands over a buffer and the CPU plugin fuses the preprocessing into the first
convolution.

Cache layout (``$CL_ZOO_CACHE/openvino``, default ``~/.cache/cl-zoo/openvino``)::

    <key>/model.xml, model.bin   the converted graph (fp32 weights; written to a temporary folder
                                 and renamed into place, so a reader never sees half a model)
    <key>/compiled-<precision>/  OpenVINO's own compiled-blob cache for that precision hint

``<key>`` hashes the weights (the same digest as embedding progress files), the preprocessing, the
input size and the OpenVINO version: a retrained checkpoint with the same name never reuses a stale
graph, and compiling from a cached blob takes well under a second instead of a 5-15 s conversion.

Outputs are always float32, whatever the precision hint ran inside.

A model whose first operations cannot run in bf16 says so by defining
``float32_input_transform(rgb)`` and ``forward_transformed(x)`` (CMC's RGB -> Lab, whose a and b
channels are differences of nearly equal cube roots: under the bf16 hint the ab half of the
tier CMC's features fell to cosine 0.961 of float32, the whole to 0.980). For such a model the
transform runs on the host in torch float32 (:class:`HostTransform`) and only the rest is converted,
taking the transform's float32 NCHW output: the same model then keeps min cosine 0.99998 under
bf16 (128 Imagenette val images), and the host-side colour conversion costs less than the bf16
graph saves (347 images/s end to end against fp32's 223, ``benchmarks/int8_fidelity.py
--candidate bf16``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.errors import ClZooError

CACHE_FORMAT = 1
_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8 layers run int8 under any hint (cl_zoo.backends.int8)


class ConversionError(ClZooError):
    """The model cannot be converted to OpenVINO; ``reason`` is one line for the fallback message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def openvino_cache_dir() -> Path:
    from cl_zoo.data.archive import cache_root

    return cache_root() / "openvino"


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
        with torch.no_grad():
            x = self.normalize(torch.from_numpy(np.ascontiguousarray(pixels)))
            return np.ascontiguousarray(self.transform(x).float().numpy())


def conversion_key(fingerprint: str, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float],
                   *, host_transform: bool = False) -> str:
    import openvino

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
    """Whether a converted graph for these weights and input size is already on disk."""
    try:
        key = conversion_key(fingerprint, input_hw, mean, std, host_transform=host_transform)
    except ImportError:
        return False
    return (openvino_cache_dir() / key / "model.xml").is_file()


def _convert(model: nn.Module, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float], folder: Path,
             host_transform: HostTransform | None) -> None:
    """Convert ``model`` into ``folder`` (created atomically: temporary sibling, then rename); with
    ``host_transform`` the graph starts from its output instead of uint8 pixels."""
    import openvino as ov

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
    save_graph_folder(graph, folder, {"source.json": json.dumps({"input": [h, w], "mean": list(mean), "std": list(std)}) + "\n"})


def save_graph_folder(graph: Any, folder: Path, files: dict[str, str], *, replace: bool = False) -> None:
    """Write ``graph`` as ``folder/model.xml`` (+ ``.bin``) with the text ``files`` beside it, atomically.

    Everything goes to a temporary sibling that is renamed into place, so a reader never sees half
    a cache entry; ``replace`` first removes an entry already there (one found damaged). Losing the
    rename to another process that wrote the same entry is fine: theirs is as good.
    """
    import openvino as ov

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        ov.save_model(graph, str(tmp / "model.xml"), compress_to_fp16=False)
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if replace and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "model.xml").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        calibration: np.ndarray | None = None,
        force_int8: bool = False,
    ) -> None:
        """``precision="int8"`` quantizes the converted graph on ``calibration`` (uint8 NHWC pixels
        of the user's images) and raises :class:`~cl_zoo.backends.int8.Int8Rejected` when the result
        fails its fidelity gate, unless ``force_int8``."""
        import openvino as ov

        if precision not in _HINTS:
            raise ClZooError(f"OpenVINO runs fp32, bf16 or int8, not {precision}")
        if precision == "int8" and calibration is None:
            raise ClZooError("int8 needs calibration images")
        self.precision = precision
        self.fidelity = None
        self.int8_folder: Path | None = None
        self.quantized = False  # int8 only: quantized by this call rather than read from the cache
        self.host_transform = HostTransform(model, mean, std) if has_host_transform(model) else None
        self.key = conversion_key(fingerprint, input_hw, mean, std, host_transform=self.host_transform is not None)
        self.folder = openvino_cache_dir() / self.key
        self.converted = False
        if not (self.folder / "model.xml").is_file():
            _convert(model, input_hw, mean, std, self.folder, self.host_transform)
            self.converted = True
        graph_folder, compiled_cache = self.folder, self.folder / f"compiled-{precision}"
        if precision == "int8":
            assert calibration is not None
            if self.host_transform is not None:
                calibration = self.host_transform(calibration)
            graph_folder, self.fidelity, self.quantized = self._int8(model, input_hw, mean, std, calibration, threads)
            self.int8_folder, compiled_cache = graph_folder, graph_folder / "compiled"
            if not force_int8:
                from cl_zoo.backends.int8 import Int8Rejected

                if self.fidelity is None:
                    raise Int8Rejected(None, f"{len(calibration)} calibration images are too few to check int8 against fp32")
                if not self.fidelity.passed:
                    raise Int8Rejected(self.fidelity, f"int8 kept {self.fidelity.describe()}")
        core = ov.Core()
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": _HINTS[precision],
            "PERFORMANCE_HINT": "THROUGHPUT",
            "CACHE_DIR": str(compiled_cache),
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        try:
            graph = core.read_model(str(graph_folder / "model.xml"))
            self.compiled = core.compile_model(graph, "CPU", config)
        except Exception as exc:  # noqa: BLE001 - a damaged cache entry is rebuilt once
            if self.converted or precision == "int8":
                raise ConversionError(f"compile failed ({type(exc).__name__}: {str(exc)[:200]})") from None
            shutil.rmtree(self.folder, ignore_errors=True)
            _convert(model, input_hw, mean, std, self.folder, self.host_transform)
            self.converted = True
            self.compiled = core.compile_model(core.read_model(str(self.folder / "model.xml")), "CPU", config)
        self.jobs = max(1, int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self.dim = int(self.compiled.output(0).get_partial_shape()[1].get_length())
        self.queue = ov.AsyncInferQueue(self.compiled, self.jobs)
        self.queue.set_callback(self._done)

    def _int8(self, model: nn.Module, input_hw: tuple[int, int], mean: Sequence[float], std: Sequence[float],
              calibration: np.ndarray, threads: int | None) -> tuple[Path, Any, bool]:
        """The cached or newly quantized int8 graph; a damaged fp32 cache entry is rebuilt once."""
        from cl_zoo.backends.int8 import quantized_graph

        try:
            return quantized_graph(self.folder, calibration, threads=threads)
        except ClZooError:
            raise
        except Exception as exc:  # noqa: BLE001 - a fp32 graph that cannot be read is rebuilt, then reported
            if self.converted:
                raise ConversionError(f"int8 quantization failed ({type(exc).__name__}: {str(exc)[:200]})") from None
            shutil.rmtree(self.folder, ignore_errors=True)
            _convert(model, input_hw, mean, std, self.folder, self.host_transform)
            self.converted = True
            return quantized_graph(self.folder, calibration, threads=threads)

    @staticmethod
    def _done(request: Any, userdata: tuple[np.ndarray, int]) -> None:
        out, start = userdata
        data = request.get_output_tensor(0).data
        out[start : start + len(data)] = data

    def __call__(self, pixels: torch.Tensor | np.ndarray) -> np.ndarray:
        """Features ``[B, D]`` float32 of a uint8 ``[B, H, W, 3]`` batch."""
        x = np.ascontiguousarray(pixels.numpy() if isinstance(pixels, torch.Tensor) else pixels)
        if self.host_transform is not None:
            x = self.host_transform(x)
        n = len(x)
        out = np.empty((n, self.dim), dtype=np.float32)
        parts = min(self.jobs, n)
        bounds = np.linspace(0, n, parts + 1).astype(int)
        for s, e in zip(bounds[:-1], bounds[1:]):
            self.queue.start_async({0: x[s:e]}, (out, int(s)))
        self.queue.wait_all()
        return out


__all__ = [
    "ConversionError",
    "HostTransform",
    "OpenVINORunner",
    "conversion_key",
    "has_host_transform",
    "is_cached",
    "openvino_cache_dir",
    "save_graph_folder",
]
