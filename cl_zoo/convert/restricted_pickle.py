"""Load a pickled PyTorch checkpoint without running any of it: archive checks first, then torch's
own weights-only unpickler with a short, named allowlist.

Why there is no hand-written unpickler any more. cl-zoo used to read lightly's Lightning ``.ckpt``
files with its own ``pickle.Unpickler`` subclass (unknown classes became placeholders). Hand-made
files broke it: ``BUILD`` could re-target its shared allowlisted objects, so one *refused* file
flipped the sign of every weight in later imports in the same process
(``_rebuild_tensor_v2.__defaults__``) or reinterpreted float16 weights as bfloat16
(``HalfStorage.dtype``); the C unpickler's memo zero-filled 512 MiB for a 392-byte pickle; deflated
storages inflated before their size was checked. ``torch.load(weights_only=True)`` refuses all of
these (its ``BUILD`` only targets fresh instances of allowlisted classes, its memo is a dict), and
it reads what lightly publishes (measured by the issue's author on real files): a PyTorch Lightning
2.6 checkpoint of lightly's benchmark module loads as is; a 2.0-era one additionally needs
Lightning's ``AttributeDict`` (a dict with attribute access) and ``argparse.Namespace`` (an
attribute bag), which :data:`LIGHTNING_GLOBALS` rebuilds as a plain ``dict`` and a
``Namespace``. Nothing is left that only a hand-written reader could read, so there is none: a file
that needs any other global is refused in one line that names them, listed by
``torch.serialization.get_unsafe_globals_in_checkpoint`` before anything is unpickled.

Why the archive is checked before torch sees it (measured on torch 2.14): torch reads entries with
miniz, which inflates a deflated entry whatever it declares (a 261 KB deflated ``byteorder`` entry
peaked at 512 MiB; a 1 MB file may declare, and inflate, a 1 GiB storage), never verifies CRC-32
(a flipped byte in ``data/0`` loads silently), and echoes the ``byteorder`` entry raw into its
error (16 MB of terminal escapes). :func:`check_archive` therefore requires what ``torch.save``
writes: stored (uncompressed) entries whose sizes together fit in the file, correct CRC-32 (read in
1 MiB blocks), a ``byteorder`` of ``little`` or ``big``, a pickle of at most
:data:`MAX_PICKLE_BYTES`, and the same entries at the same offsets and sizes in torch's own reader
(no disagreement between Python's zip parser and miniz to slip a bomb through). Memory is then
bounded by the file size plus what the pickle builds: at most ~240 bytes per pickle byte (measured:
a pickle of empty sets), so about 1 GB for the largest pickle accepted; real ResNet-50 checkpoints
pickle 60-100 KB.
"""

from __future__ import annotations

import argparse
import os
import pickletools
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import torch

from cl_zoo.errors import CheckpointError
from cl_zoo.text import listed

SafeGlobal = Union[Callable[..., Any], "tuple[Callable[..., Any], str]"]

# What a Lightning checkpoint of lightly's benchmarks needs beyond tensors and containers. Each
# name is rebuilt as an inert built-in (never imported): torch's unpickler only lets SETITEMS fill
# a plain ``dict``, and ``BUILD`` on a ``Namespace`` only fills its ``__dict__``.
LIGHTNING_GLOBALS: tuple[SafeGlobal, ...] = (
    (dict, "lightning.fabric.utilities.data.AttributeDict"),  # lightning >= 2.0
    (dict, "lightning_fabric.utilities.data.AttributeDict"),  # pytorch_lightning 2.x
    (dict, "pytorch_lightning.utilities.parsing.AttributeDict"),  # pytorch_lightning 1.x
    argparse.Namespace,  # LightningCLI / argparse hyper-parameters
)
# Allowlisted by torch, never in a checkpoint of weights and training state, and a memory bomb:
# ``bytearray(2**31 - 1)`` zero-fills 2 GiB for a 20-byte pickle (measured: +2.2 GB peak).
DENIED_GLOBALS = {"builtins.bytearray", "__builtin__.bytearray"}
MAX_PICKLE_BYTES = 4 << 20  # 40x the pickle of a ResNet-50 Lightning checkpoint with optimizer state
_BLOCK = 1 << 20


class UnsafePickleError(CheckpointError):
    """The file's pickle needs a global outside the allowlist; nothing was unpickled or run."""


def shown(text: object, limit: int = 120) -> str:
    """Untrusted text for a one-line message: control characters escaped, length bounded."""
    raw = str(text)
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw[: limit + 1])
    return out if len(out) <= limit and len(raw) <= limit else out[:limit] + "..."


def _local_data_offset(fh: Any, info: zipfile.ZipInfo) -> int:
    """Where an entry's bytes start: after its local header, whose name/extra lengths may differ from the central one."""
    fh.seek(info.header_offset)
    header = fh.read(zipfile.sizeFileHeader)
    if len(header) != zipfile.sizeFileHeader or header[:4] != zipfile.stringFileHeader:
        raise CheckpointError(f"entry {shown(info.filename)} has no local header where the directory says")
    fields = struct.unpack(zipfile.structFileHeader, header)
    return info.header_offset + zipfile.sizeFileHeader + fields[10] + fields[11]  # file name and extra field lengths


def _check_entries(path: Path, archive: zipfile.ZipFile, size: int) -> str:
    """Stored entries, sizes within the file, one folder holding data.pkl; returns that folder."""
    infos = archive.infolist()
    names = [info.filename for info in infos]
    prefix = names[0].split("/", 1)[0] if names else ""
    if (not prefix or f"{prefix}/data.pkl" not in names or len(set(names)) != len(names)
            or any(not name.startswith(prefix + "/") for name in names)):
        raise CheckpointError(f"{path} is a zip file but not a PyTorch checkpoint (torch.save writes one folder holding data.pkl)")
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise CheckpointError(
                f"{path}: entry {shown(info.filename)} is compressed (zip method {info.compress_type}); torch.save stores "
                "every entry uncompressed, so this file was not written by it"
            )
        total += info.file_size
        if total > size:
            raise CheckpointError(f"{path}: its entries declare more bytes than the file's {size}; the archive is corrupt or crafted")
    pickle_size = archive.getinfo(f"{prefix}/data.pkl").file_size
    if pickle_size > MAX_PICKLE_BYTES:
        raise CheckpointError(
            f"{path}: its pickle is {pickle_size} bytes, over cl-zoo's limit of {MAX_PICKLE_BYTES} (checkpoints of "
            "weights and training state pickle well under 1 MB)"
        )
    return prefix


def _check_contents(path: Path, archive: zipfile.ZipFile, prefix: str) -> None:
    """Read every entry once, in blocks, so zipfile verifies its CRC-32 (miniz in torch does not); then
    the pickle's globals (:data:`DENIED_GLOBALS`) and the byteorder entry."""
    for info in archive.infolist():
        with archive.open(info) as fh:
            while fh.read(_BLOCK):
                pass
    data = archive.read(f"{prefix}/data.pkl")  # at most MAX_PICKLE_BYTES, checked above
    try:
        names = {str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name in ("GLOBAL", "INST")}
    except Exception as exc:  # noqa: BLE001 - a malformed pickle, not a damaged archive
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint (its pickle: {_first_line(exc)})") from exc
    denied = names & DENIED_GLOBALS
    if denied:
        raise UnsafePickleError(f"refusing to load {path}: its pickle calls {min(denied)}, which can allocate gigabytes "
                                "from a few bytes and is never part of a checkpoint (nothing was executed)")
    if f"{prefix}/byteorder" in archive.namelist():
        info = archive.getinfo(f"{prefix}/byteorder")
        order = repr(archive.read(info)) if info.file_size <= 16 else f"{info.file_size} bytes long"
        if order not in (repr(b"little"), repr(b"big")):
            raise CheckpointError(f"{path}: its byteorder entry is {shown(order, 40)}, not b'little' or b'big'")


def _check_torch_agrees(path: Path, archive: zipfile.ZipFile, prefix: str) -> None:
    """torch's reader (miniz) must see the entries Python's zipfile checked, at the same offsets and sizes."""
    reader = torch._C.PyTorchFileReader(str(path))
    ours = {info.filename[len(prefix) + 1:]: info for info in archive.infolist()}
    if set(reader.get_all_records()) != set(ours):
        raise CheckpointError(f"{path}: torch's zip reader and Python's list different entries; the archive is crafted")
    with open(path, "rb") as fh:
        for name, info in ours.items():
            if (reader.get_record_size(name) != info.file_size
                    or reader.get_record_offset(name) != _local_data_offset(fh, info)):
                raise CheckpointError(f"{path}: torch's zip reader and Python's disagree about entry {shown(name)}; "
                                      "the archive is crafted")


def check_archive(path: Path) -> None:
    """Refuse, in one line, a zip checkpoint that torch.save could not have written (see the module docstring)."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            prefix = _check_entries(path, archive, size)
            _check_contents(path, archive, prefix)
            _check_torch_agrees(path, archive, prefix)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile/miniz errors on a malformed archive become one line
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint (damaged zip archive: {_first_line(exc)})") from exc


def _first_line(exc: BaseException) -> str:
    """The first line of an error, without torch's advice to retry with ``weights_only=False``, made printable."""
    advice = ("weights_only", "weights only load failed", "can still be loaded", "trust the source")
    message = str(exc)
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not any(a in line.lower() for a in advice)]
    first = lines[0] if lines else type(exc).__name__
    opcode = re.fullmatch(r"Unsupported operand (\d+)", first)
    if opcode and 0 <= int(opcode.group(1)) < 256:  # name the opcode (e.g. LONG4) rather than its byte
        info = pickletools.code2op.get(chr(int(opcode.group(1))))
        first = f"its pickle uses opcode {info.name if info else opcode.group(1)}, which torch's weights-only unpickler does not read"
    return shown(first, 200)


def _refusal(path: Path, names: Sequence[str], accepts: str, hint: str) -> UnsafePickleError:
    return UnsafePickleError(
        f"refusing to load {path}: it contains a pickled {listed([shown(n, 80) for n in sorted(names)], 4)}, and unpickling arbitrary objects can run code "
        f"(nothing was executed). cl-zoo accepts only tensors, plain containers and {accepts} here{hint}"
    )


def _is_zip(path: Path) -> bool:
    """torch's own test (the local-header magic at offset 0), not zipfile's (a directory at the end)."""
    with open(path, "rb") as fh:
        return fh.read(4) == b"PK\x03\x04"


def weights_only_load(path: str | os.PathLike[str], allowed: Sequence[SafeGlobal], accepts: str, hint: str = "") -> Any:
    """``torch.load(weights_only=True)`` with ``allowed`` added, after :func:`check_archive`; every failure is one line.

    ``accepts`` names the allowlist in the refusal, ``hint`` (e.g. "; use another command") ends it.
    """
    path = Path(path)
    zipped = _is_zip(path)
    if zipped:
        check_archive(path)
    with torch.serialization.safe_globals(list(allowed)):
        if zipped:  # legacy (pre-1.6) files have no static listing; torch.load refuses their globals below
            try:
                needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            except Exception as exc:  # noqa: BLE001 - a malformed pickle becomes one line
                raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({_first_line(exc)})") from exc
            if needed:
                raise _refusal(path, needed, accepts, hint)
        try:
            with warnings.catch_warnings():  # e.g. "Detected pickle protocol 27": the error line says enough
                warnings.simplefilter("ignore")
                return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - every refusal or parse error becomes a user-facing error
            found = re.search(r"GLOBAL (\S+)", str(exc))
            if found:
                raise _refusal(path, [found.group(1)], accepts, hint) from exc
            raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({_first_line(exc)})") from exc
