"""Which arithmetic to run on this machine: ``--precision auto|fp32|bf16|fp16|int8``.

bfloat16 halves the bytes every convolution moves and, on CPUs with matrix or bf16 dot-product
units, doubles or triples their throughput; its 8-bit mantissa moves pooled features by cosine
1e-5, well inside what any evaluation can see. Whether it *pays* depends on the hardware, so
``auto`` is decided from what the CPU reports (never assumed) and from measurements:

* CUDA: bf16 (tensor cores).
* CPU with Intel AMX (``amx_tile``): bf16. ResNet-50 inference runs about twice as fast as torch
  fp32 under torch's autocast and about four times as fast on OpenVINO.
* CPU with AVX512_BF16 but no AMX (e.g. AMD Zen 4/5): bf16. ResNet-50 inference runs 1.5x torch
  fp32 under autocast and 3x on OpenVINO, features within cosine 0.99999 of fp32; training
  (``benchmarks/pretrain_throughput.py --compare-precision``, the Imagenette 64 px DCL recipe) runs
  about twice as fast, losses tracking fp32's. Measure on a quiet machine: with other jobs on the
  same cores bf16's threads suffer more from the contention than fp32's.
* any other CPU: fp32. Without hardware bf16 the conversion is emulated and runs slower than fp32.

The measurements are in docs/benchmarks.md, "CPU speed: bfloat16 and OpenVINO" and
"``pretrain_throughput.py --compare-precision``".

The detection goes through torch's own probes (``torch.cpu._is_amx_tile_supported``,
``torch.cpu._is_avx512_bf16_supported``) with ``/proc/cpuinfo`` flags as a fallback, so tests can
mock one function (:func:`cpu_capability`) to play any machine.

``int8`` is never chosen by ``auto``: its features are lossy (neighbour recall 0.97 against fp32
for the bundled default), so a user asks for it; it runs on OpenVINO after NNCF quantization and
a fidelity gate (:mod:`cl_zoo.backends.int8`).

Whatever runs inside, features and losses come back float32 (autocast only touches the matmuls and
convolutions; losses upcast, see :mod:`cl_zoo.losses._common`). In training, the projection head
also runs outside autocast (:class:`cl_zoo.methods.heads.ProjectionHead`): its output is what the
loss compares, and rounding it to bf16 before the loss upcasts costs DCL kNN accuracy, more the
longer it trains, which an fp32 head recovers (docs/results.md, "bf16 and the projection head").
"""

from __future__ import annotations

import contextlib
import functools
import platform
from dataclasses import dataclass

import torch

from cl_zoo.data.workers import usable_cpus
from cl_zoo.errors import ClZooError

PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16", "int8")
# int8 is inference only and runs on OpenVINO (cl_zoo.backends.int8); training takes these.
TRAINING_PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class CpuCapability:
    """What the CPU offers for low-precision matrix work."""

    model: str  # "Intel(R) Xeon(R) Platinum 8481C", "AMD EPYC" ...
    isa: str  # torch's dispatch level: "AVX512", "AVX2", "DEFAULT" ...
    amx: bool  # Intel AMX tiles (amx_tile / amx_bf16)
    avx512_bf16: bool  # AVX512_BF16 dot products (vdpbf16ps)
    cores: int  # cores this process may use

    @property
    def fast_bf16(self) -> bool:
        """Whether bf16 inference runs in hardware (measured faster than fp32; module docstring)."""
        return self.amx or self.avx512_bf16

    @property
    def fast_bf16_training(self) -> bool:
        """Whether bf16 training is known to beat fp32 (measured on AMX and on AVX512_BF16; module docstring)."""
        return self.amx or self.avx512_bf16

    def describe(self) -> str:
        units = [name for name, ok in (("AMX", self.amx), ("AVX512_BF16", self.avx512_bf16)) if ok]
        return f"{self.model} ({self.cores} usable cores, {self.isa}, bf16 units: {', '.join(units) or 'none'})"


def usable_cores() -> int:
    """Cores this process may run on (affinity / cgroup cpusets), not the machine's count."""
    return usable_cpus()


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def _probe(name: str, flags: set[str], flag: str) -> bool:
    fn = getattr(torch.cpu, name, None)
    if fn is not None:
        try:
            return bool(fn())
        except Exception:  # noqa: BLE001 - a probe that fails means "not known to be there"
            pass
    return flag in flags


@functools.lru_cache(maxsize=1)
def cpu_capability() -> CpuCapability:
    """This CPU, probed once per process."""
    model, flags = _cpuinfo()
    try:
        isa = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001
        isa = "unknown"
    return CpuCapability(
        model=model,
        isa=isa,
        amx=_probe("_is_amx_tile_supported", flags, "amx_tile"),
        avx512_bf16=_probe("_is_avx512_bf16_supported", flags, "avx512_bf16"),
        cores=usable_cores(),
    )


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ClZooError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return precision


def resolve_precision(precision: str, device: torch.device | str, *, training: bool = False) -> str:
    """``auto`` -> ``bf16`` or ``fp32`` for ``device``; ``training`` asks the training question
    (the same answer as inference on every machine measured so far); explicit choices are kept."""
    check_precision(precision)
    if training and precision not in TRAINING_PRECISIONS:
        raise ClZooError(f"precision {precision!r} is for feature extraction; training takes {', '.join(TRAINING_PRECISIONS)}")
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    if kind == "cuda":
        return "bf16"
    cap = cpu_capability() if kind == "cpu" else None
    if cap is not None and (cap.fast_bf16_training if training else cap.fast_bf16):
        return "bf16"
    return "fp32"


def why(precision: str, device: torch.device | str, *, training: bool = False) -> str:
    """A short reason for the resolved precision, for the one line a command prints."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "CUDA"
    cap = cpu_capability()
    if precision == "bf16":
        return "CPU with AMX" if cap.amx else ("CPU with AVX512_BF16" if cap.avx512_bf16 else "asked for; no bf16 unit found, expect it slower than fp32")
    return "asked for" if cap.fast_bf16 else "no AMX / AVX512_BF16 on this CPU"


def autocast(device: torch.device | str, precision: str):  # noqa: ANN201 - a context manager
    """Autocast for a resolved precision (``fp32``: disabled). Master weights stay float32."""
    kind = torch.device(device).type
    if precision == "fp32":
        return torch.autocast(kind, enabled=False)
    if precision == "int8":
        raise ClZooError("int8 runs on OpenVINO only (--backend openvino or auto), not on torch")
    if precision not in AUTOCAST_DTYPES:
        raise ClZooError(f"precision {precision!r} must be resolved (fp32, bf16 or fp16) before running")
    return torch.autocast(kind, dtype=AUTOCAST_DTYPES[precision])


def autocast_off(reference: torch.Tensor) -> contextlib.AbstractContextManager[None]:
    """A context where autocast is off on ``reference``'s device, for math that must stay float32
    under a bf16/fp16 step; a no-op where autocast is not on (or does not exist, as on ``meta``)."""
    device = reference.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


__all__ = [
    "PRECISIONS",
    "TRAINING_PRECISIONS",
    "CpuCapability",
    "autocast",
    "autocast_off",
    "check_precision",
    "cpu_capability",
    "resolve_precision",
    "usable_cores",
    "why",
]
