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
    from cl_zoo.checkpoint.hub import load_pretrained

    sha = weights_sha256(load_pretrained(str(model)))
    assert all(r["model"]["weights_sha256"] == sha for r in fp16.values())
    name = fp16["knn"]["data"]["name"]
    assert config["metrics"][f"{name}_knn_k5_top1"] == fp16["knn"]["metrics"]["knn_k5_top1"]
    assert config["metrics"][f"{name}_linear_fast_top1"] == fp16["linear"]["metrics"]["linear_fast_top1"]
    card = (model / "README.md").read_text()
    assert "## Training" in card and "(curves.png)" in card and (model / "curves.png").is_file()
