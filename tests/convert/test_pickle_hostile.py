"""Hostile pickled checkpoints, made by hand byte by byte: each is refused in one line, nothing is
written, memory stays bounded, and a refused file leaves no trace on later imports.

The cases are the ones reproduced against cl-zoo's former hand-written unpickler (see the docstring of
:mod:`cl_zoo.convert.restricted_pickle`): ``BUILD`` poisoning of shared allowlisted objects, a memo
index bomb, deflated zip bombs, oversized or deflated ``byteorder`` entries, a 5000-digit ``LONG4``,
zip compression method 99, a corrupt central directory, a bad CRC-32, ``INST``/``OBJ`` on unknown
names and one storage read with two dtypes. The benign file is a PyTorch Lightning 2.0-style
``.ckpt`` of a lightly benchmark module (ResNet-18 backbone for speed) whose ``hyper_parameters``
are Lightning's ``AttributeDict`` under its real module name, holding an ``argparse.Namespace``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.nn as nn
from torchvision.models import resnet as tv

from cl_zoo.cli import main
from cl_zoo.convert.readers import safe_load, safe_load_lightning
from cl_zoo.errors import CheckpointError
from tests.helpers import REPO_ROOT
from tests.lightning_stand_in import AttributeDict, lightning_names
from tests.pickle_bytes import EMPTY_DICT, MARK, NONE, POISONS, PROTO, REDUCE, SETITEMS, STOP, TUPLE1, archive_with, glob, hostile_pickle, text, with_pickle

REPO = REPO_ROOT


# --------------------------------------------------------------------------------------------------
# The benign file: a lightly benchmark module saved the way PyTorch Lightning 2.0 saves it
# --------------------------------------------------------------------------------------------------


def lightly_top(seed: int = 5) -> dict[str, Any]:
    """The checkpoint dict: backbone (conv1 in float16, as amp leaves it), heads, loop and optimizer state."""
    torch.manual_seed(seed)
    backbone = tv.resnet18()
    backbone.fc = nn.Identity()
    with torch.no_grad():
        for m in backbone.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    state = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    state["backbone.conv1.weight"] = state["backbone.conv1.weight"].half()
    state["projection_head.layers.0.weight"] = torch.randn(16, 512)
    hparams = AttributeDict(batch_size_per_device=128, num_classes=1000,
                            args=argparse.Namespace(epochs=100, accelerator="gpu", precision="16-mixed"))
    return {
        "epoch": 99,
        "global_step": 500400,
        "pytorch-lightning_version": "2.0.4",
        "state_dict": state,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 100, "completed": 99}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None, "dirpath": "/runs/x",
                                                            "best_k_models": {}, "last_model_path": ""}},
        "optimizer_states": [{"state": {0: {"momentum_buffer": torch.randn(16, 512)}},
                              "param_groups": [{"lr": 0.3, "weight_decay": 1e-6, "params": [0], "trust_coefficient": 0.001}]}],
        "lr_schedulers": [{"base_lrs": [0.3], "last_epoch": 500400, "lr_lambdas": [None], "_step_count": 500401}],
        "hparams_name": "kwargs",
        "hyper_parameters": hparams,
    }


def lightly_ckpt(path: Path, seed: int = 5) -> Path:
    with lightning_names():
        torch.save(lightly_top(seed), path)
    return path


@pytest.fixture(scope="module")
def benign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lightly_ckpt(tmp_path_factory.mktemp("benign") / "epoch=99-step=500400.ckpt")


# --------------------------------------------------------------------------------------------------
# Hand-made pickles and archives
# --------------------------------------------------------------------------------------------------


def central_entries(raw: bytes) -> Iterator[tuple[int, str]]:
    """(offset, name) of every central directory record."""
    at = raw.find(b"PK\x01\x02")
    while at >= 0:
        n = struct.unpack_from("<H", raw, at + 28)[0]
        yield at, raw[at + 46:at + 46 + n].decode()
        at = raw.find(b"PK\x01\x02", at + 46 + n)


def run_import(path: Path, out: Path, capsys: pytest.CaptureFixture[str], fmt: str = "lightly") -> str:
    """The CLI on a hostile file: exit 2, one ``error:`` line, no traceback, nothing written."""
    assert main(["import", fmt, str(path), "--out", str(out), "--arch", "resnet18"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err[:500]
    assert err.isprintable() and len(err) < 600, err[:600]
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.importing-*"))
    return err


def weights_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.glob("*.safetensors")))


# --------------------------------------------------------------------------------------------------
# The benign file loads through torch's own unpickler with the Lightning stand-ins
# --------------------------------------------------------------------------------------------------


def test_lightning_2_0_file_loads_with_only_the_named_stand_ins(benign: Path, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="AttributeDict"):  # what torch needs beyond the default allowlist
        torch.load(benign, weights_only=True)
    top = safe_load_lightning(benign)
    assert type(top["hyper_parameters"]) is dict and top["hyper_parameters"]["num_classes"] == 1000
    assert type(top["hyper_parameters"]["args"]) is argparse.Namespace and top["hyper_parameters"]["args"].epochs == 100
    expected = lightly_top()
    for key, value in expected["state_dict"].items():
        assert top["state_dict"][key].dtype == value.dtype and torch.equal(top["state_dict"][key], value), key
    out = tmp_path / "zoo"
    assert main(["import", "lightly", str(benign), "--out", str(out), "--arch", "resnet18"]) == 0
    report = json.loads((out / "config.json").read_text())["conversion"]
    assert report["cast_to_float32"] == 1 and report["dropped"] == {"projection_head": 1}
    assert report["top_level"]["hyper_parameters"] == "dict with 3 entries"
    # an author's file must not need Lightning's names: the authors' path does not accept them
    with pytest.raises(CheckpointError, match="refusing to load .*lightning.fabric.utilities.data.AttributeDict"):
        safe_load(benign)


def test_a_file_needing_other_globals_is_refused_naming_them(benign: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    body = (PROTO + EMPTY_DICT + MARK + text("a") + glob("lightning.pytorch.loops", "FitLoop") + NONE + TUPLE1 + REDUCE
            + text("b") + glob("builtins", "eval") + text("1") + TUPLE1 + REDUCE + SETITEMS + STOP)
    err = run_import(with_pickle(benign, tmp_path / "x.ckpt", body), tmp_path / "zoo", capsys)
    assert "refusing to load" in err and "builtins.eval, lightning.pytorch.loops.FitLoop" in err
    assert "nothing was executed" in err and "Lightning's AttributeDict and argparse.Namespace" in err


# --------------------------------------------------------------------------------------------------
# 1. Poisoning: a refused file must not change what later imports read
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("then_system", [True, False], ids=["then-posix.system", "poison-only"])
@pytest.mark.parametrize("name", sorted(POISONS))
def test_poisoning_is_refused_and_leaves_later_imports_identical(
    benign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, then_system: bool
) -> None:
    before = tmp_path / "before"
    assert main(["import", "lightly", str(benign), "--out", str(before), "--arch", "resnet18"]) == 0
    capsys.readouterr()
    hostile = with_pickle(benign, tmp_path / "hostile.ckpt", hostile_pickle(POISONS[name], then_system))
    err = run_import(hostile, tmp_path / "zoo", capsys)
    if then_system:  # listed before anything is unpickled
        assert "refusing to load" in err and "posix.system" in err and "nothing was executed" in err
    else:  # torch's unpickler: BUILD only on fresh instances of allowlisted classes
        assert "Can only build" in err, err
    after = tmp_path / "after"
    assert main(["import", "lightly", str(benign), "--out", str(after), "--arch", "resnet18"]) == 0
    assert weights_bytes(after) == weights_bytes(before)
    top = safe_load_lightning(benign)
    conv1 = top["state_dict"]["backbone.conv1.weight"]
    assert conv1.dtype == torch.float16 and torch.equal(conv1, lightly_top()["state_dict"]["backbone.conv1.weight"])
    assert not conv1.is_neg()
    assert torch._utils._rebuild_tensor_v2.__defaults__ == (None,)


def test_after_every_hostile_file_imports_match_a_fresh_process(benign: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    for i, (name, ops) in enumerate(sorted(POISONS.items())):
        for then_system in (True, False):
            run_import(with_pickle(benign, tmp_path / f"h{i}{then_system}.ckpt", hostile_pickle(ops, then_system)),
                       tmp_path / "zoo", capsys)
    here = tmp_path / "here"
    assert main(["import", "lightly", str(benign), "--out", str(here), "--arch", "resnet18"]) == 0
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "cl_zoo.cli", "import", "lightly", str(benign), "--out", str(fresh),
                    "--arch", "resnet18"], check=True, capture_output=True, cwd=REPO, timeout=300)
    assert weights_bytes(here) == weights_bytes(fresh) and weights_bytes(here)


# --------------------------------------------------------------------------------------------------
# 2. Small files, huge memory: refused in one line, peak memory bounded (measured in a subprocess)
# --------------------------------------------------------------------------------------------------

# VmHWM, not ru_maxrss: a child started by fork + exec inherits its parent's ru_maxrss (pytest's).
PEAK_SCRIPT = """
import json, re, sys
from cl_zoo.convert.readers import convert_checkpoint
from cl_zoo.errors import ClZooError
try:
    convert_checkpoint("lightly", sys.argv[1], "resnet18")
    error = None
except ClZooError as exc:
    error = str(exc)
with open("/proc/self/status") as fh:
    peak_kb = int(re.search(r"VmHWM:\\s+(\\d+) kB", fh.read()).group(1))
print(json.dumps({"peak_mb": peak_kb / 1024, "error": error}))
"""


def _peak(path: Path) -> tuple[float, str | None]:
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["peak_mb"], result["error"]


@pytest.fixture(scope="module")
def control_peak(benign: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    """Peak memory of the same process on a refused one-dict pickle: imports, archive checks, no bomb."""
    peak, error = _peak(with_pickle(benign, tmp_path_factory.mktemp("control") / "empty.ckpt", PROTO + EMPTY_DICT + STOP))
    assert error and "has no 'state_dict' entry" in error
    return peak


def peak_over_baseline(path: Path, control: float) -> tuple[float, str | None]:
    """Peak resident memory of a fresh process converting ``path``, minus the control's (MB)."""
    peak, error = _peak(path)
    return peak - control, error


@pytest.mark.parametrize("index", [2**25, 2**30, 2**32 - 1])
def test_memo_index_bomb_is_bounded(benign: Path, tmp_path: Path, index: int, capsys: pytest.CaptureFixture[str],
                                    control_peak: float) -> None:
    # LONG_BINPUT at a huge index: the C unpickler's memo array grew to the index (2^30 -> 16 GiB)
    body = PROTO + EMPTY_DICT + b"r" + struct.pack("<I", index) + MARK + text("m") + b"j" + struct.pack("<I", index) + SETITEMS + STOP
    path = with_pickle(benign, tmp_path / "memo.ckpt", body)
    err = run_import(path, tmp_path / "zoo", capsys)
    assert "Can only SETITEMS" in err or "has no 'state_dict' entry" in err, err
    mb, error = peak_over_baseline(path, control_peak)
    print(f"memo index {index}: peak {mb:.1f} MB over baseline")
    assert error and mb < 200


def deflated_bomb(benign: Path, out: Path, nbytes: int) -> Path:
    """A pickle declaring one float32 storage of ``nbytes``, stored deflated: kilobytes on disk."""
    body = (PROTO + EMPTY_DICT + MARK + text("state_dict") + EMPTY_DICT + MARK + text("backbone.w")
            + glob("torch._utils", "_rebuild_tensor_v2")
            + MARK + MARK + text("storage") + glob("torch", "FloatStorage") + text("0") + text("cpu")
            + b"J" + struct.pack("<i", nbytes // 4) + b"t" + b"Q"
            + b"K\x00" + b"J" + struct.pack("<i", nbytes // 4) + TUPLE1 + b"K\x01" + TUPLE1
            + b"\x89" + glob("collections", "OrderedDict") + b")" + REDUCE + b"t" + REDUCE
            + SETITEMS + SETITEMS + STOP)
    with zipfile.ZipFile(benign) as src, zipfile.ZipFile(out, "w") as dst:
        prefix = src.namelist()[0].split("/")[0]
        for info in src.infolist():
            tail = info.filename.split("/", 1)[1]
            if tail.startswith("data/"):
                continue
            dst.writestr(zipfile.ZipInfo(info.filename), body if tail == "data.pkl" else src.read(info))
        block = bytes(1 << 20)
        info = zipfile.ZipInfo(f"{prefix}/data/0")
        info.compress_type = zipfile.ZIP_DEFLATED
        with dst.open(info, "w", force_zip64=True) as fh:
            for _ in range(nbytes >> 20):
                fh.write(block)
    return out


def test_deflated_zip_bomb_is_refused_before_inflating(benign: Path, tmp_path: Path, control_peak: float,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = deflated_bomb(benign, tmp_path / "bomb.ckpt", 256 << 20)
    assert path.stat().st_size < 1 << 20  # 256 MiB of zeros deflate to ~260 KB
    err = run_import(path, tmp_path / "zoo", capsys)
    assert "data/0 is compressed (zip method 8)" in err and "not written by it" in err
    mb, error = peak_over_baseline(path, control_peak)
    print(f"deflated 256 MiB storage: peak {mb:.1f} MB over baseline")
    assert error and mb < 200


@pytest.mark.parametrize("case", ["huge", "deflated", "escapes"])
def test_byteorder_is_bounded_and_never_echoed_raw(benign: Path, tmp_path: Path, case: str, control_peak: float,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if case == "huge":  # 16 MiB of terminal escapes, stored
        path = archive_with(benign, tmp_path / "bo.ckpt", {"byteorder": (b"\x1b[2J\x1b[31m" * (2 << 20))[:16 << 20]})
    elif case == "deflated":  # 256 MiB in ~260 KB
        path = archive_with(benign, tmp_path / "bo.ckpt", {"byteorder": b"l" * (256 << 20)}, {"byteorder": zipfile.ZIP_DEFLATED})
    else:
        path = archive_with(benign, tmp_path / "bo.ckpt", {"byteorder": b"\x1b[2J"})
    err = run_import(path, tmp_path / "zoo", capsys)
    assert "\x1b" not in err
    expected = {"huge": "byteorder entry is 16777216 bytes long", "deflated": "byteorder is compressed (zip method 8)",
                "escapes": r"byteorder entry is b'\x1b[2J'"}[case]
    assert expected in err, err
    if case == "deflated":
        mb, error = peak_over_baseline(path, control_peak)
        print(f"deflated byteorder: peak {mb:.1f} MB over baseline")
        assert error and mb < 200


def test_huge_pickle_is_refused_before_unpickling(benign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = PROTO + EMPTY_DICT * (5 << 20) + STOP  # ~240 bytes of Python objects per byte, were it unpickled
    err = run_import(with_pickle(benign, tmp_path / "big.ckpt", body), tmp_path / "zoo", capsys)
    assert "over cl-zoo's limit of 4194304" in err


# --------------------------------------------------------------------------------------------------
# 3. Malformed files: one line, never a traceback
# --------------------------------------------------------------------------------------------------


def test_long4_with_5000_digits(benign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digits = (10**5000 - 1).to_bytes(2077, "little", signed=True)
    body = PROTO + EMPTY_DICT + MARK + text("n") + b"\x8b" + struct.pack("<i", len(digits)) + digits + SETITEMS + STOP
    err = run_import(with_pickle(benign, tmp_path / "long4.ckpt", body), tmp_path / "zoo", capsys)
    assert "opcode LONG4" in err


@pytest.mark.parametrize("opcode", ["INST", "OBJ"])
def test_inst_and_obj_on_unknown_names(benign: Path, tmp_path: Path, opcode: str, capsys: pytest.CaptureFixture[str]) -> None:
    call = b"(ilightly_private\nTrainer\n" if opcode == "INST" else MARK + glob("lightly_private", "Trainer") + b"o"
    body = PROTO + EMPTY_DICT + MARK + text("x") + call + SETITEMS + STOP
    err = run_import(with_pickle(benign, tmp_path / "inst.ckpt", body), tmp_path / "zoo", capsys)
    assert f"opcode {opcode}" in err


def test_compression_method_99(benign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray(benign.read_bytes())
    for at, name in central_entries(bytes(raw)):
        if name.endswith("/data/0"):
            struct.pack_into("<H", raw, at + 10, 99)
            struct.pack_into("<H", raw, struct.unpack_from("<I", raw, at + 42)[0] + 8, 99)
    path = tmp_path / "m99.ckpt"
    path.write_bytes(raw)
    assert "data/0 is compressed (zip method 99)" in run_import(path, tmp_path / "zoo", capsys)


@pytest.mark.parametrize("damage", ["sizes", "signature", "offset", "truncated"])
def test_corrupt_central_directory(benign: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray(benign.read_bytes())
    at, _ = next(central_entries(bytes(raw)))
    if damage == "sizes":
        raw[at + 20:at + 28] = b"\xff" * 8
    elif damage == "signature":
        raw[at:at + 4] = b"PK\x09\x09"
    elif damage == "offset":
        struct.pack_into("<I", raw, at + 42, 7)
    else:
        raw = raw[:at + 30]
    path = tmp_path / "cd.ckpt"
    path.write_bytes(raw)
    err = run_import(path, tmp_path / "zoo", capsys)
    assert "not a readable PyTorch checkpoint" in err or "more bytes than the file" in err or "corrupt" in err, err


@pytest.mark.parametrize("fmt", ["lightly", "moco"])  # the authors' path has the same archive checks
def test_bad_crc(benign: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray(benign.read_bytes())
    offset = torch._C.PyTorchFileReader(str(benign)).get_record_offset("data/0")
    raw[offset] ^= 0x80  # torch itself would load this silently
    path = tmp_path / "crc.ckpt"
    path.write_bytes(raw)
    err = run_import(path, tmp_path / "zoo", capsys, fmt)
    assert "Bad CRC-32" in err and "data/0" in err


def test_one_storage_read_with_two_dtypes_is_not_reinterpreted(benign: Path, tmp_path: Path) -> None:
    def tensor(storage: str) -> bytes:
        return (glob("torch._utils", "_rebuild_tensor_v2") + MARK + MARK + text("storage") + glob("torch", storage)
                + text("0") + text("cpu") + b"K\x04" + b"t" + b"Q" + b"K\x00" + b"K\x04" + TUPLE1 + b"K\x01" + TUPLE1
                + b"\x89" + glob("collections", "OrderedDict") + b")" + REDUCE + b"t" + REDUCE)

    body = (PROTO + EMPTY_DICT + MARK + text("state_dict") + EMPTY_DICT + MARK + text("backbone.a") + tensor("FloatStorage")
            + text("backbone.b") + tensor("IntStorage") + SETITEMS + SETITEMS + STOP)
    data = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    path = archive_with(benign, tmp_path / "two.ckpt", {"data.pkl": body, "data/0": data})
    try:
        top = safe_load_lightning(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc)
        return
    a, b = top["state_dict"]["backbone.a"], top["state_dict"]["backbone.b"]
    assert a.dtype == b.dtype == torch.float32 and torch.equal(a, torch.tensor([1.0, -2.0, 0.5, 3.0]))


def test_nothing_is_executed_by_any_hostile_file(benign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    for op, args in [(glob("posix", "system"), text(f"touch {marker}") + TUPLE1),
                     (glob("builtins", "exec"), text(f"open({str(marker)!r}, 'w')") + TUPLE1),
                     (glob("subprocess", "Popen"), MARK + text("touch") + text(str(marker)) + b"t" + TUPLE1)]:
        body = PROTO + EMPTY_DICT + MARK + text("x") + op + args + REDUCE + SETITEMS + STOP
        err = run_import(with_pickle(benign, tmp_path / "evil.ckpt", body), tmp_path / "zoo", capsys)
        assert "refusing to load" in err and "nothing was executed" in err
    assert not marker.exists()
    assert os.path.exists(benign)


def test_bytearray_bomb_from_torchs_own_allowlist(benign: Path, tmp_path: Path, control_peak: float,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # torch allowlists builtins.bytearray: bytearray(2**31 - 1) zero-fills 2 GiB from this 20-byte call
    body = (PROTO + EMPTY_DICT + MARK + text("x") + glob("__builtin__", "bytearray") + b"J" + struct.pack("<i", 2**31 - 1)
            + TUPLE1 + REDUCE + SETITEMS + STOP)
    path = with_pickle(benign, tmp_path / "ba.ckpt", body)
    err = run_import(path, tmp_path / "zoo", capsys)
    assert "calls __builtin__.bytearray" in err and "nothing was executed" in err
    mb, error = peak_over_baseline(path, control_peak)
    print(f"bytearray(2**31 - 1): peak {mb:.1f} MB over baseline")
    assert error and mb < 200
