"""Property-based fuzzing of the pickled-checkpoint reader (``cl-zoo import lightly``).

Opcode-level mutations -- delete, duplicate, swap, insert or replace whole opcodes (from a library
of benign and hostile ones: calls of a sentinel that would write a file, ``posix.system``,
``BUILD`` poisoning, memo bombs, ``bytearray`` bombs, ``LONG4``, ``INST``/``OBJ``, odd persistent
ids...) and overwrite bytes of their arguments -- of a small Lightning-style checkpoint's pickle
and of hostile pickles, re-zipped as a checkpoint. Every input must load to a dict whose
``state_dict`` is a dict of tensors or raise one ``CheckpointError`` line; never another
exception, never a hang (per-test timeout), never a call of the sentinel or of ``os.system`` /
``subprocess`` (an audit hook watches).

Bounded for CI: derandomized, 500 examples per seed family, about 10 s in all.
``CL_ZOO_FUZZ_EXAMPLES=2000 CL_ZOO_FUZZ_RANDOM=1`` explores further.
"""

from __future__ import annotations

import argparse
import collections
import os
import pickletools
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cl_zoo.convert.readers import safe_load_lightning, unwrap_state
from cl_zoo.errors import CheckpointError
from tests.lightning_stand_in import AttributeDict, lightning_names
from tests.pickle_bytes import (
    EMPTY_DICT, MARK, NONE, POISONS, PROTO, REDUCE, SETITEMS, STOP, TUPLE1, TUPLE2, glob, hostile_pickle, text, with_pickle,
)

FUZZ = settings(max_examples=int(os.environ.get("CL_ZOO_FUZZ_EXAMPLES", "500")), deadline=None,
                derandomize=not os.environ.get("CL_ZOO_FUZZ_RANDOM"), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

SENTINEL_HITS: list[Any] = []


def sentinel(*args: Any) -> None:
    """What a pickle would call if anything were executed (``<this module>.sentinel``, by the name the tests package gives it)."""
    SENTINEL_HITS.append(args)


class Watcher:
    """Audit hook: process creation or ``os.system`` while a fuzz example runs."""

    def __init__(self) -> None:
        self.active, self.events = False, []
        sys.addaudithook(self._hook)  # cannot be removed; ``active`` retires it

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.fork"):
            self.events.append(event)


WATCHER = Watcher()
COUNTS: collections.Counter[str] = collections.Counter()


def _int(op: bytes, value: int, fmt: str) -> bytes:
    return op + struct.pack(fmt, value)


# Whole opcodes (with arguments) to insert or substitute: the benign vocabulary of torch.save's
# pickles and the hostile one of the findings.
FRAGMENTS = [
    glob(__name__, "sentinel") + text("ran") + TUPLE1 + REDUCE,
    glob(__name__, "sentinel"), glob("posix", "system"), glob("builtins", "eval"),
    glob("subprocess", "Popen"), glob("builtins", "bytearray"), glob("torch", "Tensor"),
    glob("torch._utils", "_rebuild_tensor_v2"), glob("torch._utils", "_rebuild_parameter"),
    glob("torch", "FloatStorage"), glob("torch", "HalfStorage"), glob("torch", "bfloat16"),
    glob("collections", "OrderedDict"), glob("lightning.fabric.utilities.data", "AttributeDict"),
    glob("argparse", "Namespace"), glob("torch._tensor", "_rebuild_from_type_v2"),
    *POISONS.values(),
    MARK + text("storage") + glob("torch", "FloatStorage") + text("0") + text("cpu") + b"K\x04t" + b"Q",
    MARK + text("storage") + glob("torch", "HalfStorage") + text("0") + text("cpu") + _int(b"J", 2**30, "<i") + b"t" + b"Q",
    _int(b"r", 2**30, "<I"), _int(b"j", 2**30, "<I"), _int(b"r", 2**32 - 1, "<I"), b"q\x00", b"h\x00",
    b"\x8b" + struct.pack("<i", 2077) + b"\x7f" * 2077,  # LONG4, 5000 digits
    b"\x8a\x08" + b"\xff" * 8, _int(b"J", 2**31 - 1, "<i"), b"K\xff", b"M\xff\xff",
    b"(ilightly_private\nTrainer\n", b"o", b"0", b"2", b"1", b"l", b"a", b"e", b"d", b"S'x'\n", b"I99\n",
    b"\x81", b"b", b"R", b"Q", b"s", b"u", b"(", b")", b"]", b"}", b"\x85", b"\x86", b"\x87", b"t", b"N",
    b"\x88", b"\x89", b".", text("backbone.conv1.weight"), text("state_dict"), text("\x1b[2J" * 3),
    b"G" + struct.pack(">d", float("nan")), b"\x8f", b"\x95" + struct.pack("<Q", 2**40),
]

mutation = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("duplicate"), st.integers(0, 10**6)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.sampled_from(FRAGMENTS)),
    st.tuples(st.just("replace"), st.integers(0, 10**6), st.sampled_from(FRAGMENTS)),
    st.tuples(st.just("byte"), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 255)),
)


def opcodes(data: bytes) -> list[bytes]:
    """A pickle split into its opcodes, each with its argument bytes."""
    starts = [pos for _, _, pos in pickletools.genops(data)] + [len(data)]
    return [data[a:b] for a, b in zip(starts, starts[1:])]


def mutate(ops: list[bytes], edits: list[tuple[Any, ...]]) -> bytes:
    ops = list(ops)
    for edit in edits:
        kind, at = edit[0], edit[1] % max(len(ops), 1)
        if kind == "delete" and ops:
            del ops[at]
        elif kind == "duplicate" and ops:
            ops.insert(at, ops[at])
        elif kind == "swap" and ops:
            other = edit[2] % len(ops)
            ops[at], ops[other] = ops[other], ops[at]
        elif kind == "insert":
            ops.insert(at, edit[2])
        elif kind == "replace" and ops:
            ops[at] = edit[2]
        elif kind == "byte" and ops and len(ops[at]) > 1:  # an argument byte (length, index, name...)
            chunk = bytearray(ops[at])
            chunk[1 + edit[2] % (len(chunk) - 1)] = edit[3]
            ops[at] = bytes(chunk)
    return b"".join(ops)


def small_top() -> dict[str, Any]:
    """A Lightning 2.0-style checkpoint with a few small tensors (shared storage, float16, int64)."""
    torch.manual_seed(0)
    weight = torch.randn(4, 3, 1, 1)
    return {
        "epoch": 9, "global_step": 100, "pytorch-lightning_version": "2.0.4",
        "state_dict": {"backbone.conv1.weight": weight.half(), "backbone.bn1.running_var": torch.rand(4) + 0.5,
                       "backbone.bn1.num_batches_tracked": torch.tensor(100), "projection_head.w": weight[:2]},
        "optimizer_states": [{"state": {0: {"momentum_buffer": torch.zeros(4)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
        "hyper_parameters": AttributeDict(lr=0.1, args=argparse.Namespace(epochs=10)),
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 10}}}},
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "small.ckpt"
    with lightning_names():
        torch.save(small_top(), path)
    return path


def benign_pickle(base: Path) -> bytes:
    import zipfile

    with zipfile.ZipFile(base) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


def hostile_seeds() -> list[bytes]:
    memo = PROTO + EMPTY_DICT + _int(b"r", 2**30, "<I") + MARK + text("m") + _int(b"j", 2**30, "<I") + SETITEMS + STOP
    calls = PROTO + EMPTY_DICT + MARK + text("x") + glob(__name__, "sentinel") + text("ran") + TUPLE1 + REDUCE \
        + text("y") + glob("argparse", "Namespace") + NONE + TUPLE2 + REDUCE + SETITEMS + STOP
    return [hostile_pickle(ops, system) for ops in POISONS.values() for system in (True, False)] + [memo, calls]


def check(path: Path) -> str:
    """Load ``path`` as ``cl-zoo import lightly`` does: a dict of tensors, or one CheckpointError line."""
    WATCHER.active = True
    started = time.monotonic()
    try:
        top = safe_load_lightning(path)
        state, _, _ = unwrap_state(top, ("state_dict",), path, "lightly")
        assert all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
        outcome = "loaded"
    except CheckpointError as exc:
        message = str(exc)
        assert "\n" not in message and message.isprintable() and len(message) < 1000, message[:1000]
        outcome = "refused"
    finally:
        WATCHER.active = False
    assert time.monotonic() - started < 10, "an example took over 10 s"
    assert not SENTINEL_HITS and not WATCHER.events, (SENTINEL_HITS, WATCHER.events)
    return outcome


@pytest.mark.timeout(120)
def test_benign_checkpoint_loads_unmutated(base: Path) -> None:
    assert check(base) == "loaded"
    assert len(opcodes(benign_pickle(base))) > 100


@pytest.mark.timeout(180)
@FUZZ
@given(edits=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_benign_pickle(base: Path, tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[Any, ...]]) -> None:
    data = mutate(opcodes(benign_pickle(base)), edits)
    outcome = check(with_pickle(base, tmp_path_factory.mktemp("m") / "m.ckpt", data))
    COUNTS[f"benign:{outcome}"] += 1


@pytest.mark.timeout(180)
@FUZZ
@given(seed=st.sampled_from(range(len(hostile_seeds()))), edits=st.lists(mutation, min_size=0, max_size=4))
def test_mutated_hostile_pickles(base: Path, tmp_path_factory: pytest.TempPathFactory, seed: int,
                                 edits: list[tuple[Any, ...]]) -> None:
    data = mutate(opcodes(hostile_seeds()[seed]), edits)
    outcome = check(with_pickle(base, tmp_path_factory.mktemp("h") / "h.ckpt", data))
    COUNTS[f"hostile:{outcome}"] += 1


def test_report_counts() -> None:
    """Printed with ``-s``: how many examples ran and how they ended (the fuzz must have run)."""
    print("pickle fuzz outcomes:", dict(sorted(COUNTS.items())))
    if COUNTS:
        assert COUNTS["benign:loaded"] + COUNTS["benign:refused"] > 0
