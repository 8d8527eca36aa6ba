"""Training checkpoints: everything needed to continue a run bit-for-bit, written atomically.

A checkpoint is one ``torch.save`` file (``RUN_DIR/checkpoint.pt``) holding plain containers of
tensors and numbers only, so it loads with ``weights_only=True`` (no pickled code runs on resume).
It is written through :mod:`cl_zoo.fileio` (temporary name in the same folder, fsync, ``os.replace``):
a crash while saving leaves the previous checkpoint untouched.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cl_zoo.errors import CheckpointError
from cl_zoo.fileio import atomic_save_torch

CHECKPOINT_NAME = "checkpoint.pt"
STATE_FORMAT = 1


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states as tensors and plain values."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def save_state(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    return atomic_save_torch(path, {"format": STATE_FORMAT, **state}, fsync=True)


def load_state(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_state` without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no training checkpoint at {path}; nothing to resume")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means the file is unusable
        msg = " ".join(str(exc).split())[:200]
        raise CheckpointError(f"cannot read training checkpoint {path}: {msg}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path} is not a cl-zoo training checkpoint (format {STATE_FORMAT})")
    return state
