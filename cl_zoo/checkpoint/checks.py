"""Checks that treat a checkpoint folder as untrusted input.

Folders come from the Hub, from colleagues and from half-finished runs, so every field in them is
input: a file name in the shard index, a value in ``config.json``, a dtype or an offset in a
safetensors header. :func:`cl_zoo.checkpoint.load_folder` runs these checks before it opens a
weights file or allocates a tensor, so a hostile or damaged folder ends in one
:class:`~cl_zoo.errors.CheckpointError` line instead of a read elsewhere on the disk, a traceback,
a gigantic allocation or NaN embeddings.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import stat
import struct
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

from cl_zoo.errors import CheckpointError

# Safetensors dtypes the loader accepts, with their item sizes. Floating ones may hold any weight;
# integer/bool ones only a tensor the architecture itself keeps in that exact dtype (BatchNorm's
# ``num_batches_tracked``).
FLOAT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
OTHER_DTYPES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
TORCH_DTYPE_NAMES = {
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
# pixels. A feature extractor's input side: the largest published ones are a few hundred pixels
# (224-518); 1024 leaves room for detection-sized inputs. A config asking for more is damage or an
# attack: at 8192 one image is 805 MB of float32 input and a batch of 64 needs 51 GB.
MAX_INPUT_SIDE = 1024
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")


# ---------------------------------------------------------------------------------------------- names
def hub_cache_roots() -> list[Path]:
    """The Hugging Face cache folders as the environment names them now (resolved)."""
    candidates = [os.environ.get("HF_HUB_CACHE")]
    if os.environ.get("HF_HOME"):
        candidates.append(os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub"))
    try:
        from huggingface_hub import constants  # a heavy import, made only when a path is checked against the HF cache

        candidates.append(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - a dependency; without it there is no cache to trust
        pass
    return [Path(os.path.expanduser(c)).resolve() for c in candidates if c]


def trusted_roots(folder: Path) -> list[Path]:
    """Where a folder's files may really live once symlinks are followed.

    The folder itself, and, for a snapshot of the real ``huggingface_hub`` cache
    (``<HF cache>/models--o--n/snapshots/<rev>/``), that same repo's ``blobs/`` folder, where the
    cache links every file. The rule holds only inside the cache root the environment names, and
    only when ``blobs`` is a real folder of that repo: a ``snapshots/`` folder made anywhere else,
    or a ``blobs`` that is itself a link (``blobs -> /``), would otherwise let a folder's files
    point at any file on the machine.
    """
    roots = [folder.resolve()]
    snapshots = folder.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith("models--"):
        blobs = repo / "blobs"
        real_repo = repo.resolve()
        if (
            real_repo.parent in hub_cache_roots()
            and blobs.is_dir()
            and not blobs.is_symlink()
            and blobs.resolve() == real_repo / "blobs"
        ):
            roots.append(real_repo / "blobs")
    return roots


def member(folder: Path, name: object, where: str) -> Path:
    """``folder / name`` for a plain file name that stays inside ``folder``; refused otherwise.

    ``where`` says which field gave the name (for the one-line error). Nothing is opened here:
    only the name is checked, then the path's symlinks are resolved (``realpath`` reads links,
    never file contents) and the target must lie under one of :func:`trusted_roots`.
    """
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where}: file name {name!r} is not a non-empty string")
    if (
        name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or os.path.isabs(name)
        or (os.altsep and os.altsep in name)
        or re.match(r"^[A-Za-z]:", name)
    ):
        raise CheckpointError(f"{where}: {name!r} is not a plain file name inside the checkpoint folder; refused")
    path = folder / name
    real = Path(os.path.realpath(path))
    if not any(real == root or root in real.parents for root in trusted_roots(folder)):
        raise CheckpointError(f"{where}: {name!r} is a link leading out of the checkpoint folder ({real}); refused")
    # Only regular files are ever opened: a FIFO would block the reader forever, a device
    # (/dev/zero) would feed it without end. lstat of the resolved path reads no content.
    if os.path.lexists(real) and not stat.S_ISREG(os.stat(real).st_mode):
        raise CheckpointError(f"{where}: {name!r} is not a regular file; refused")
    return path


def weights_name(folder: Path, name: object, where: str) -> Path:
    """A weights file name: plain, inside the folder, and a ``.safetensors`` file."""
    path = member(folder, name, where)
    if not str(name).endswith(".safetensors"):
        raise CheckpointError(f"{where}: {name!r} is not a .safetensors file; refused")
    return path


# ---------------------------------------------------------------------------------------------- headers
def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (safetensors dtype, shape)}`` from a file's header, every field checked.

    The header is an 8-byte little-endian length and a JSON object; it is validated here (dtype
    known, shape of non-negative ints, ``data_offsets`` inside the file and matching the shape)
    so a damaged or hostile header is refused with one line before any tensor is read.
    """

    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"{path} is not a readable safetensors file ({reason})")

    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise bad("shorter than its 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise bad(f"header length {length} exceeds the file ({size} bytes)")
        raw = fh.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit integer
        raise bad(f"its header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    data_size = size - 8 - length
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise bad("its __metadata__ must map names to strings")
            continue
        if not isinstance(info, dict):
            raise bad(f"header entry {name!r} is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or (dtype not in FLOAT_DTYPES and dtype not in OTHER_DTYPES):
            raise bad(f"tensor {name!r} has unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise bad(f"tensor {name!r} has a malformed shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise bad(f"tensor {name!r} has data_offsets {offsets!r} outside the file's data")
        item = FLOAT_DTYPES.get(dtype) or OTHER_DTYPES[dtype]
        if offsets[1] - offsets[0] != math.prod(shape) * item:
            raise bad(f"tensor {name!r} spans {offsets[1] - offsets[0]} bytes, but {dtype}{shape} needs {math.prod(shape) * item}")
        out[name] = (dtype, tuple(shape))
    return out


# ---------------------------------------------------------------------------------------------- config
def _type_ok(value: Any, annotation: Any) -> bool:
    """Whether a JSON value fits a builder parameter's annotation (unknown annotations pass)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    return True


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an unresolvable annotation only disables type checks
        return {}


def accepted_args(builder: Callable[..., Any]) -> dict[str, Any]:
    """``{parameter name: annotation}`` an architecture builder accepts as keyword arguments.

    A builder that forwards ``**kwargs`` to its return type (``def resnet18(**kwargs) -> ResNet``)
    accepts that class's ``__init__`` parameters too; arguments the builder fixes itself (its
    ``depth``) are found when building, see :func:`build_error`.
    """
    out: dict[str, Any] = {}
    sig = inspect.signature(builder)
    hints = _hints(builder)
    forwards = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            forwards = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out[p.name] = hints.get(p.name, p.annotation)
    target = hints.get("return")
    if forwards and inspect.isclass(target):
        init = target.__init__
        init_hints = _hints(init)
        for p in list(inspect.signature(init).parameters.values())[1:]:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                out.setdefault(p.name, init_hints.get(p.name, p.annotation))
    return out


def validate_model_args(arch: str, builder: Callable[..., Any], model_args: Mapping[str, Any], where: str) -> None:
    """Refuse unknown keys and values of the wrong type, naming the field."""
    accepted = accepted_args(builder)
    for key, value in model_args.items():
        if key not in accepted:
            known = ", ".join(sorted(accepted)) or "none"
            raise CheckpointError(f"{where}: model_args.{key} is not an argument of architecture {arch} (accepted: {known})")
        if not _type_ok(value, accepted[key]):
            expected = getattr(accepted[key], "__name__", None) or str(accepted[key]).replace("typing.", "")
            raise CheckpointError(f"{where}: model_args.{key}={value!r} has the wrong type for {arch} (expected {expected})")


def build_error(arch: str, exc: Exception, where: str) -> CheckpointError:
    """One line for a builder that refused the config's ``model_args``."""
    text = " ".join(str(exc).split())
    if m := re.search(r"multiple values for (?:keyword )?argument '(\w+)'", text):
        return CheckpointError(f"{where}: model_args.{m.group(1)} conflicts with an argument architecture {arch} fixes itself")
    if m := re.search(r"unexpected keyword argument '(\w+)'", text):
        return CheckpointError(f"{where}: model_args.{m.group(1)} is not an argument of architecture {arch}")
    return CheckpointError(f"{where}: model_args do not build architecture {arch} ({type(exc).__name__}: {text[:200]})")


def validate_pretrained_cfg(cfg: Any, where: str) -> None:
    """Preprocessing values ``embed``/``knn`` will act on: sizes, statistics, interpolation."""

    def bad(field: str, value: Any, why: str) -> CheckpointError:
        return CheckpointError(f"{where}: pretrained_cfg.{field}={value!r} {why}")

    size = cfg.input_size
    if len(size) != 3 or not all(type(v) is int and 0 < v <= MAX_INPUT_SIDE for v in size) or size[0] != 3:
        raise bad("input_size", list(size), f"must be [3, H, W] with 0 < H, W <= {MAX_INPUT_SIDE}")
    for field in ("mean", "std"):
        value = getattr(cfg, field)
        if len(value) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
            raise bad(field, list(value), "must be 3 finite numbers")
    if not all(v > 0 for v in cfg.std):
        raise bad("std", list(cfg.std), "must be positive")
    crop = cfg.crop_pct
    if isinstance(crop, bool) or not isinstance(crop, (int, float)) or not 0.05 <= crop <= 1:
        raise bad("crop_pct", crop, "must be a number in [0.05, 1]")
    if cfg.interpolation not in INTERPOLATIONS:
        raise bad("interpolation", cfg.interpolation, f"must be one of {', '.join(INTERPOLATIONS)}")
    for field in ("sha256", "metrics"):
        if not isinstance(getattr(cfg, field), dict):
            raise bad(field, getattr(cfg, field), "must be an object")
