"""scripts/train_reference.sh end to end on CPU: pretrain, evaluate, float16 copy and its check.

About a minute on two busy cores (pretraining one epoch, four evaluations), hence ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT


def _archive(tmp_path: Path) -> Path:
    """Two colour-coded classes, 12 train / 8 test images each at 32x32, as train/ and test/."""
    rng = np.random.default_rng(0)
    src = tmp_path / "images"
    for split, n in (("train", 12), ("test", 8)):
        for ci, colour in enumerate(((220, 30, 30), (30, 30, 220))):
            (src / split / f"c{ci}").mkdir(parents=True)
            for i in range(n):
                arr = np.clip(np.array(colour) + rng.normal(0, 25, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(arr).save(src / split / f"c{ci}" / f"{i:03d}.png")
    archive = tmp_path / "tiny.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "train", "train")
        tar.add(src / "test", "test")
    return archive


@pytest.mark.slow
def test_train_reference_script_checks_the_float16_copy(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "ARCHIVE": str(_archive(tmp_path)), "OUT": str(out), "RUN_ROOT": str(tmp_path / "runs"),
           "CL_ZOO_CACHE": str(tmp_path / "cache"), "PYTHON": sys.executable, "EPOCHS": "1", "BUDGET_S": "300",
           "POLL_S": "1", "KNN_K": "5"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "train_reference.sh"), "simclr", "--set", "model_args.width=0.125",
         "--batch-size", "16", "--device", "cpu", "--workers", "0", "--knn-every", "1"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "float16 check passed" in proc.stdout
    assert "knn_k5_top1 " in proc.stdout and "linear_fast_top1 " in proc.stdout and "diff " in proc.stdout

    dest = out / "simclr"
    model = dest / "model"
    config = json.loads((model / "config.json").read_text())
    assert config["weights_dtype"] == "float16"
    fp16 = {t: json.loads((dest / "reports" / f"{t}_fp16.json").read_text()) for t in ("knn", "linear")}
    # The copy's card states the metrics measured on the float16 weights themselves.
    from cl_zoo.eval.features import weights_sha256
    from cl_zoo.factory import load_pretrained

    sha = weights_sha256(load_pretrained(str(model)))
    assert all(r["model"]["weights_sha256"] == sha for r in fp16.values())
    name = fp16["knn"]["data"]["name"]
    assert config["metrics"][f"{name}_knn_k5_top1"] == fp16["knn"]["metrics"]["knn_k5_top1"]
    assert config["metrics"][f"{name}_linear_fast_top1"] == fp16["linear"]["metrics"]["linear_fast_top1"]
    card = (model / "README.md").read_text()
    assert "## Training" in card and "(curves.png)" in card and (model / "curves.png").is_file()


def _env(tmp_path: Path, archive: Path | str, **extra: str) -> dict[str, str]:
    return {**os.environ, "ARCHIVE": str(archive), "OUT": str(tmp_path / "out"), "RUN_ROOT": str(tmp_path / "runs"),
            "CL_ZOO_CACHE": str(tmp_path / "cache"), "PYTHON": sys.executable, **extra}


def _script(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "train_reference.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_detached_modes_without_a_run_say_so(tmp_path):
    """status / collect before any start, and start without the archive: one line each, distinct exits."""
    env = _env(tmp_path, tmp_path / "missing.tar.gz")
    status = _script("status", "simclr", env=env)
    assert status.returncode == 1 and "no detached run started" in status.stdout
    collect = _script("collect", "simclr", env=env)
    assert collect.returncode == 2 and collect.stderr.strip().startswith("error: nothing to collect")
    start = _script("start", "simclr", env=env)
    assert start.returncode == 2 and "missing.tar.gz not found" in start.stderr
    assert not (tmp_path / "out" / "simclr" / "detached").exists()


@pytest.mark.slow
def test_detached_start_then_collect_evaluates_like_a_foreground_run(tmp_path):
    """`start` returns while the run goes on in its own session; `collect` waits for it, then exports,
    evaluates and bundles exactly as the one-call form does (a GPU window shorter than the run)."""
    env = _env(tmp_path, _archive(tmp_path), EPOCHS="1", POLL_S="1", KNN_K="5")
    start = _script("start", "simclr", "--set", "model_args.width=0.125", "--batch-size", "16", "--device", "cpu",
                    "--workers", "0", "--knn-every", "1", env=env, timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    assert "started simclr detached" in start.stdout
    ctl = tmp_path / "out" / "simclr" / "detached"
    pid = int((ctl / "pid").read_text())
    again = _script("start", "simclr", env=env, timeout=60)  # the run is still importing torch
    assert again.returncode == 2 and "already going" in again.stderr
    assert os.getsid(pid) == pid  # its own session: the caller's exit or hang-up does not reach it

    collect = _script("collect", "simclr", env=env)
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    assert (ctl / "status").read_text().strip() == "done"
    assert "float16 check passed" in collect.stdout and "knn_k5_top1 " in collect.stdout
    dest = tmp_path / "out" / "simclr"
    assert json.loads((dest / "model" / "config.json").read_text())["weights_dtype"] == "float16"
    assert {p.name for p in (dest / "reports").iterdir()} >= {"knn.json", "linear.json", "knn_fp16.json", "linear_fp16.json"}
    assert (dest / "run" / "metrics.csv").is_file() and "epoch 1/1" in (dest / "logs" / "pretrain.log").read_text()
    status = _script("status", "simclr", env=env)
    assert status.returncode == 0 and "simclr: done" in status.stdout
