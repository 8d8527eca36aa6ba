"""Pickles and torch zip archives made by hand, byte by byte: the hostile-checkpoint tests' material.

Shared by ``test_pickle_hostile.py`` (each case refused in one line) and ``test_pickle_fuzz.py``
(hypothesis mutates the same opcodes), so both speak the same pickle.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


PROTO, STOP, MARK, NONE, TRUE = b"\x80\x02", b".", b"(", b"N", b"\x88"
EMPTY_DICT, SETITEM, SETITEMS, BUILD, REDUCE = b"}", b"s", b"u", b"b", b"R"
TUPLE1, TUPLE2 = b"\x85", b"\x86"


def poison(target: tuple[str, str], attribute: str, value: bytes) -> bytes:
    """``target`` (an allowlisted global) BUILT with slot state ``{attribute: value}``: setattr on a shared object."""
    return glob(*target) + NONE + EMPTY_DICT + text(attribute) + value + SETITEM + TUPLE2 + BUILD


POISONS = {
    # the sign of every weight: metadata={"neg": True} became the rebuild function's default
    "rebuild_defaults": poison(("torch._utils", "_rebuild_tensor_v2"), "__defaults__", EMPTY_DICT + text("neg") + TRUE + SETITEM + TUPLE1 + TUPLE1),
    # float16 storages silently read as bfloat16 (same item size)
    "half_as_bfloat16": poison(("torch", "HalfStorage"), "dtype", glob("torch", "bfloat16")),
    # float32 storages silently read as int32 (same item size)
    "float_as_int32": poison(("torch", "FloatStorage"), "dtype", glob("torch", "int32")),
}


def hostile_pickle(poison_ops: bytes, then_system: bool) -> bytes:
    """``{"poison": <poisoned global>[, "evil": posix.system("true")]}``: the finding's shape."""
    body = PROTO + EMPTY_DICT + MARK + text("poison") + poison_ops
    if then_system:
        body += text("evil") + glob("posix", "system") + text("true") + TUPLE1 + REDUCE
    return body + SETITEMS + STOP


def archive_with(base: Path, out: Path, replace: dict[str, bytes] | None = None,
                 compress: dict[str, int] | None = None) -> Path:
    """``base`` re-zipped with some entries (matched by their name's tail) replaced or compressed."""
    replace, compress = replace or {}, compress or {}
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            tail = info.filename.split("/", 1)[1]
            data = replace.get(tail, None)
            data = src.read(info) if data is None else data
            dst.writestr(zipfile.ZipInfo(info.filename), data, compress_type=compress.get(tail, zipfile.ZIP_STORED))
    return out


def with_pickle(base: Path, out: Path, pickle_bytes: bytes) -> Path:
    return archive_with(base, out, {"data.pkl": pickle_bytes})
