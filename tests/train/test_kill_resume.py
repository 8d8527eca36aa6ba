"""SIGKILL at random moments (issue 15, point 4): ``embed`` over a few thousand images and a short
``pretrain`` are each killed from outside at five seeded random points, resumed after each kill,
and must end with the uninterrupted run's outputs (embeddings byte for byte, weights equal).

Kill points are seeded progress targets (progress files on disk reached) plus a seeded delay of
up to a fraction of a second, so kills land anywhere: between batches, inside a write, during
start-up of the resumed process. Each test prints its figures (runs, kill points, identical).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import cl_zoo
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow

KILLS = 5
SEED = 15


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "cl_zoo.cli", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> None:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


def kill_when(proc: subprocess.Popen, progress: Callable[[], int], target: int, delay: float, timeout: float = 300) -> bool:
    """SIGKILL ``proc`` ``delay`` seconds after ``progress()`` reaches ``target``; False if it ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and progress() < target:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)
    time.sleep(delay)
    if proc.poll() is not None:
        proc.communicate()
        assert proc.returncode == 0, f"the run ended by itself with exit {proc.returncode} before its kill"
        return False
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return True


def kill_and_resume(start: Callable[[bool], subprocess.Popen], progress: Callable[[], int], total: int) -> list[tuple[int, float]]:
    """Five kills at seeded progress targets in (0, total), a resume after each, then run to the end."""
    rng = random.Random(SEED)
    # Not in the last few chunks: a run that is that close to the end can finish inside the kill's
    # delay (0.2 s a chunk on a quiet 2-core CI host), and the kill would miss.
    targets = sorted(rng.sample(range(1, total - 3), KILLS))
    points: list[tuple[int, float]] = []
    resume = False
    for target in targets:
        delay = round(rng.uniform(0, 0.3), 3)
        if kill_when(start(resume), progress, target, delay):
            points.append((target, delay))
        resume = True
    finish(start(True))
    return points


# ---------------------------------------------------------------------------------------------- embed
def make_images(root: Path, count: int) -> Path:
    rng = np.random.default_rng(0)
    for i in range(count):
        sub = root / f"d{i % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(sub / f"{i:05d}.jpg", quality=80)
    return root


def test_embed_killed_five_times_resumes_to_identical_bytes(tmp_path: Path) -> None:
    images = make_images(tmp_path / "images", 2500)
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18", width=0.125)
    model.pretrained_cfg.input_size = (3, 32, 32)
    model.pretrained_cfg.crop_pct = 1.0
    folder = cl_zoo.save_pretrained(model, tmp_path / "model")
    common = ["--model", str(folder), "-b", "50", "--save-every", "2", "-q", "-j", "1"]  # 25 chunks of 100 images

    reference = tmp_path / "full.npy"
    t0 = time.perf_counter()
    finish(cli("embed", str(images), "-o", str(reference), *common))
    seconds = time.perf_counter() - t0

    out = tmp_path / "killed.npy"
    parts = tmp_path / "killed.parts"
    chunks = lambda: len(list(parts.glob("part-*.npz"))) if parts.is_dir() else 0  # noqa: E731
    start = lambda resume: cli("embed", str(images), "-o", str(out), *common, *(["--resume"] if resume else []))  # noqa: E731
    points = kill_and_resume(start, chunks, 25)

    identical = out.read_bytes() == reference.read_bytes()
    same_paths = Path(str(out)[:-4] + ".paths.jsonl").read_text() == Path(str(reference)[:-4] + ".paths.jsonl").read_text()
    print(f"\nembed: 2500 images, uninterrupted {seconds:.1f} s; {len(points) + 2} runs; "
          f"kill points (chunks done, extra delay s) {points}; identical: {'yes' if identical and same_paths else 'no'}")
    assert len(points) == KILLS
    assert identical and same_paths
    assert not parts.exists()


# ---------------------------------------------------------------------------------------------- pretrain
ARGS = [
    "--method", "dcl", "--arch", "resnet18_cifar", "--set", "model_args.width=0.125",
    "--set", "method_args.head_hidden_dim=32", "--set", "method_args.head_out_dim=16",
    "--set", "data.augment=cifar", "--image-size", "16", "--batch-size", "16", "--epochs", "3",
    "--lr", "0.3", "--knn-every", "0", "--workers", "1", "--no-progress",
]
STEPS = 3 * 6  # 96 images / batch 16 = 6 steps per epoch, 3 epochs


def test_pretrain_killed_five_times_resumes_to_equal_weights(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = np.random.default_rng(1)
    for c in range(3):
        (data / f"c{c}").mkdir(parents=True)
        for i in range(32):
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(data / f"c{c}" / f"{i}.png")
    env = {"CL_ZOO_CACHE": str(tmp_path / "cache")}

    t0 = time.perf_counter()
    finish(cli("pretrain", *ARGS, "--data", str(data), "--out", str(tmp_path / "full"), env=env))
    seconds = time.perf_counter() - t0

    run = tmp_path / "killed"
    run.mkdir()
    ckpt = run / "checkpoint.pt"
    seen = {"mtime": 0.0, "step": 0}

    def steps_done() -> int:
        try:
            mtime = ckpt.stat().st_mtime
            if mtime != seen["mtime"]:
                seen["step"], seen["mtime"] = int(torch.load(ckpt, weights_only=True)["global_step"]), mtime
        except (FileNotFoundError, RuntimeError, EOFError):
            pass
        return seen["step"]

    def start(resume: bool) -> subprocess.Popen:
        seen["mtime"] = 0.0  # re-read: the resumed process starts from the saved step
        return cli("pretrain", *ARGS, "--checkpoint-every", "1", "--data", str(data), "--out", str(run),
                   *(["--resume"] if resume else []), env=env)

    points = kill_and_resume(start, steps_done, STEPS)

    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    equal = a["global_step"] == b["global_step"] == STEPS and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    exported_a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    exported_b = load_file(str(run / "model" / "model.safetensors"))
    equal_export = exported_a.keys() == exported_b.keys() and all(torch.equal(exported_a[k], exported_b[k]) for k in exported_a)
    print(f"\npretrain: {STEPS} steps, uninterrupted {seconds:.1f} s; {len(points) + 2} runs; "
          f"kill points (steps checkpointed, extra delay s) {points}; identical weights: {'yes' if equal and equal_export else 'no'}")
    assert len(points) == KILLS
    assert equal and equal_export
