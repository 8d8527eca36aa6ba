"""Read a PyTorch zip checkpoint that pickles more than tensors, without running any of it.

Why: PyTorch Lightning ``.ckpt`` files (lightly's ImageNet releases among them) pickle training
state beside the weights -- hyper-parameters, loop and callback state, objects of the training
code's own classes. ``torch.load(weights_only=True)`` refuses them, and ``weights_only=False``
would import and call whatever the file names. This reader sits between the two:

* tensors are rebuilt from the archive's storages (``persistent_load`` reads ``data/<key>``
  bytes; ``torch._utils._rebuild_tensor_v2`` / ``_rebuild_parameter`` lay them out), and plain
  containers and scalars (dict, OrderedDict, list, tuple, set, bytes, dtypes, ``torch.Size``) are
  rebuilt as usual;
* any other global becomes an inert placeholder class named after it. It is never imported and
  never called: building an object of it the protocol-2 way (``NEWOBJ`` + ``BUILD``/``SETITEMS``)
  just records its state in a placeholder instance;
* a ``REDUCE``/``INST``/``OBJ`` -- the opcodes through which a pickle *calls* something while
  loading (``os.system``, ``builtins.eval``, ``subprocess.Popen``...) -- aimed at anything outside
  the allowlist is refused with one line, before anything is called.

The caller keeps only the ``state_dict``; the placeholders serve to describe what was dropped.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import os
import pickle
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

from cl_zoo.errors import CheckpointError


class UnsafePickleError(CheckpointError):
    """The file asks the unpickler to call something outside the allowlist."""


class _OpaqueMeta(type):
    """Metaclass of placeholders: calling one (what REDUCE/INST/OBJ do) is refused."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise UnsafePickleError(f"its pickle calls {cls.qualified_name} while loading")


class Opaque(metaclass=_OpaqueMeta):
    """Stand-in for an object of a class the reader does not rebuild; holds its pickled state."""

    qualified_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "Opaque":  # NEWOBJ(_EX): ``cls.__new__(cls, *args)``
        obj = super().__new__(cls)
        obj.__dict__["_args"] = (args, kwargs)
        return obj

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_state"] = state

    def __setitem__(self, key: Any, value: Any) -> None:  # SETITEM(S) on a dict subclass
        self.__dict__.setdefault("_items", {})[key] = value

    def append(self, value: Any) -> None:  # APPEND(S) on a list subclass
        self.__dict__.setdefault("_list", []).append(value)

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)

    def __repr__(self) -> str:
        return f"<opaque {type(self).qualified_name}>"


def _placeholder(module: str, name: str) -> type:
    return _OpaqueMeta(name, (Opaque,), {"qualified_name": f"{module}.{name}", "__module__": "cl_zoo.opaque"})


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocol 2 pickles ``bytes`` as ``_codecs.encode(str, 'latin1')``; allow exactly that."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"its pickle calls _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


_STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
}
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128", "float", "double", "half", "long", "int", "short",
)


class _StorageType:
    """What ``torch.FloatStorage`` & co. stand for in a persistent id: only their dtype matters."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


def _no_hooks(hooks: Any) -> None:
    if hooks:  # a tensor arriving with backward hooks would call them later
        raise UnsafePickleError("its pickle attaches backward hooks to a tensor")


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any, requires_grad: bool, hooks: Any,
                    metadata: Any = None) -> torch.Tensor:
    """torch's own ``_rebuild_tensor_v2`` (what ``weights_only=True`` uses), minus hooks."""
    _no_hooks(hooks)
    return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, collections.OrderedDict(), metadata)


def _rebuild_parameter(data: torch.Tensor, requires_grad: bool, hooks: Any) -> torch.Tensor:
    _no_hooks(hooks)
    return torch._utils._rebuild_parameter(data, requires_grad, collections.OrderedDict())


def _allowlist() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "list"): list,
        ("builtins", "dict"): dict,
        ("builtins", "tuple"): tuple,
        ("builtins", "slice"): slice,
        ("builtins", "complex"): complex,
        ("builtins", "bytearray"): bytearray,
        ("_codecs", "encode"): _latin1_bytes,
        ("torch", "Size"): torch.Size,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch", "UntypedStorage"): _StorageType(torch.uint8),
    }
    for name, dtype in _STORAGE_DTYPES.items():
        allowed[("torch", name)] = _StorageType(dtype)
    for name in _DTYPE_NAMES:
        allowed[("torch", name)] = getattr(torch, name)
    return allowed


ALLOWED_GLOBALS = _allowlist()


class RestrictedUnpickler(pickle.Unpickler):
    """``find_class`` never imports: allowlisted objects, or a placeholder class per name."""

    def __init__(self, file: io.BufferedIOBase, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(file)
        self._archive, self._prefix = archive, prefix
        self._storages: dict[str, torch.UntypedStorage] = {}
        self.placeholders: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Protocol-2 pickles (torch.save's default) spell Python 3 names the Python 2 way
        # (``__builtin__.set``); map them back as the stock unpickler does, without importing.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        found = ALLOWED_GLOBALS.get((module, name))
        if found is not None:
            return found
        key = f"{module}.{name}"
        if key not in self.placeholders:
            self.placeholders[key] = _placeholder(module, name)
        return self.placeholders[key]

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise CheckpointError(f"unexpected persistent id {str(pid)[:60]}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not key.isalnum():
            raise CheckpointError(f"unexpected storage reference {str(pid)[:60]}")
        if key not in self._storages:
            try:
                data = self._archive.read(f"{self._prefix}/data/{key}")
            except KeyError as exc:
                raise CheckpointError(f"storage {key} is missing from the archive") from exc
            self._storages[key] = torch.UntypedStorage.from_buffer(data, dtype=torch.uint8) if data else torch.UntypedStorage(0)
        untyped = self._storages[key]
        itemsize = torch.empty((), dtype=storage_type.dtype).element_size()
        if untyped.nbytes() != int(numel) * itemsize:
            raise CheckpointError(f"storage {key} holds {untyped.nbytes()} bytes, expected {numel} x {itemsize}")
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=storage_type.dtype, _internal=True)


def restricted_load(path: str | os.PathLike[str]) -> tuple[Any, list[str]]:
    """Unpickle a zip-format PyTorch file; returns the object and the placeholder class names."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is not a zip-format PyTorch checkpoint (torch.save since PyTorch 1.6)")
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise CheckpointError(f"{path} is a zip file but not a PyTorch checkpoint (no single */data.pkl)")
        prefix = pickles[0].split("/")[0]
        if f"{prefix}/byteorder" in archive.namelist():
            order = archive.read(f"{prefix}/byteorder").decode("ascii", "replace").strip()
            if order != sys.byteorder:
                raise CheckpointError(f"{path} was saved {order}-endian; this machine is {sys.byteorder}-endian")
        with archive.open(pickles[0]) as fh:
            unpickler = RestrictedUnpickler(io.BufferedReader(fh), archive, prefix)  # type: ignore[arg-type]
            try:
                obj = unpickler.load()
            except UnsafePickleError:
                raise
            except CheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - malformed pickles become one-line errors
                first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
                raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({first[:160]})") from exc
    return obj, sorted(unpickler.placeholders)
