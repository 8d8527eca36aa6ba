"""Long work is neither silent nor noisy (issue 14, point 5): progress bars, worker defaults that
fit the machine, no "NumPy array is not writable" warning."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cl_zoo.cli import main
from cl_zoo.data.workers import MAX_DEFAULT_WORKERS, default_workers, usable_cpus


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_default_workers_follow_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert usable_cpus() == 2 and default_workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert default_workers() == MAX_DEFAULT_WORKERS


def _folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for ci, cls in enumerate(("a", "b")):
            (root / split / cls).mkdir(parents=True)
            for i in range(3):
                arr = np.clip(np.full((16, 16, 3), 60 + 120 * ci) + rng.normal(0, 20, (16, 16, 3)), 0, 255)
                Image.fromarray(arr.astype(np.uint8)).save(root / split / cls / f"{i}.png")
    return root


@pytest.mark.parametrize("command", ["knn", "linear-eval"])
def test_eval_commands_default_to_usable_cpus_and_terminal_progress(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default used to be 4 workers on any machine (DataLoader warnings on 2 cores) and no bars."""
    import cl_zoo.eval.knn as knn_mod
    import cl_zoo.eval.linear as linear_mod

    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def spy(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(knn_mod, "evaluate_knn", spy)
    monkeypatch.setattr(linear_mod, "evaluate_linear", spy)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    data = _folder(tmp_path / "data")
    args = [command, "-m", "pixels", "--train", str(data), "--test", str(data)]
    monkeypatch.setattr("sys.stderr", _Terminal())
    with pytest.raises(Stop):
        main(args)
    assert seen["workers"] == 1 and seen["progress"] is True
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a log file: no bar
    with pytest.raises(Stop):
        main(args)
    assert seen["progress"] is False
    with pytest.raises(Stop):
        main([*args, "--progress", "--workers", "3"])
    assert seen["workers"] == 3 and seen["progress"] is True


def test_knn_search_shows_progress_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from cl_zoo.eval.knn import search_neighbours

    rng = np.random.default_rng(0)
    memory, queries = rng.normal(size=(50, 8)).astype(np.float32), rng.normal(size=(30, 8)).astype(np.float32)
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    quiet = search_neighbours(memory, queries, 5, query_batch=10, memory_batch=20, use_gpu=False)
    assert terminal.getvalue() == ""
    shown = search_neighbours(memory, queries, 5, query_batch=10, memory_batch=20, use_gpu=False, progress=True)
    assert "knn search" in terminal.getvalue() and "/90 " in terminal.getvalue()  # 30 queries x 3 slices
    np.testing.assert_array_equal(quiet.index, shown.index)


def test_fast_linear_probe_on_cached_memmap_features_does_not_warn(tmp_path: Path) -> None:
    """The feature cache is memory-mapped read-only; torch warned "NumPy array is not writable"."""
    from cl_zoo.eval.linear import linear_fast

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(2), 20)
    feats = (rng.normal(size=(40, 4)) + labels[:, None] * 3).astype(np.float32)
    np.save(tmp_path / "f.npy", feats)
    cached = np.load(tmp_path / "f.npy", mmap_mode="r")
    assert not cached.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = linear_fast(cached, labels, cached, labels, wd_grid=(1e-4,), max_iter=20, device="cpu")
    assert out["metrics"]["linear_fast_top1"] > 0.9


def test_streaming_pretrain_workers_are_capped_at_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe default (8) forked 8 DataLoader workers on a 2-core machine, with warnings."""
    import torch

    from cl_zoo.train.data import StreamingBatches

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    batches = StreamingBatches(["a.jpg"] * 8, 32, [], 4, 0, 1, 0, torch.device("cpu"), 8)
    assert batches.workers == 2
    assert StreamingBatches(["a.jpg"] * 8, 32, [], 4, 0, 1, 0, torch.device("cpu"), 0).workers == 0
