"""scripts/train_cpu_tier.sh: one command per method of the CPU tier (issue 16).

The end-to-end test runs the real script on two tiny synthetic Imagenette archives (named and laid
out like the shared ones): pretrain one epoch, run it again with two epochs to check that it resumes,
then evaluate on the named dataset and bundle the float16 copy. A minute or two on busy cores: slow.
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
SCRIPT = ROOT / "scripts" / "train_cpu_tier.sh"


def _imagenette_like(folder: Path) -> Path:
    """imagenette128-{train,val}.tar.gz with train/ and val/ inside, 10 colour-coded classes."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for split, n in (("train", 4), ("val", 2)):
        src = folder / "src" / split
        for ci in range(10):
            colour = np.array([25 * ci, 255 - 25 * ci, (97 * ci) % 256])
            (src / f"n{ci:08d}").mkdir(parents=True)
            for i in range(n):
                arr = np.clip(colour + rng.normal(0, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(arr).save(src / f"n{ci:08d}" / f"{i:03d}.JPEG", format="JPEG")
        with tarfile.open(folder / f"imagenette128-{split}.tar.gz", "w:gz") as tar:
            tar.add(src, split)
    return folder


TIER = ("simclr", "mocov2", "dcl", "dclw", "simo", "jcl", "cmc", "cacr")


def test_the_eight_recipes_share_one_protocol() -> None:
    """Same data, crop size, batch, epochs, optimizer and schedule for all eight; standard ResNet-18
    (CMC: the L/ab pair at ResNet-18's size); the augmentation family is MoCo v2's crop + colour
    (CMC: the same crop, no colour ops, as its views are colour channels; L and ab from two crops)."""
    from cl_zoo.data.augment import preset
    from cl_zoo.train.recipe import Recipe

    recipes = {m: Recipe.load(ROOT / "recipes" / f"{m}_imagenette64_cpu_tier.yaml") for m in TIER}
    shared = {m: (r.data.image_size, r.data.dataset, r.optim, r.schedule, r.epochs, r.batch_size, r.seed,
                  r.knn_every, r.model_args) for m, r in recipes.items()}
    assert len({repr(v) for v in shared.values()}) == 1, shared
    assert {m: r.arch for m, r in recipes.items()} == {m: "cmc_resnet18_lab" if m == "cmc" else "resnet18" for m in TIER}
    assert all(r.data.augment == "mocov2" for m, r in recipes.items() if m != "cmc")
    assert preset("cmc").scale == preset("mocov2").scale and recipes["cmc"].data.augment == "cmc"
    simo = recipes["simo"].method_args
    assert simo["num_negatives"] < recipes["simo"].batch_size  # SiMo samples K of the other batch keys
    assert recipes["simo"].schedule.warmup_epochs < recipes["simo"].epochs
    # Fidelity options stay at the papers' forms in the tier.
    assert simo["negative_sampling"] == "per_query" and simo["margin"] is True
    assert recipes["cacr"].method_args["repulsion"] == "same_view"
    assert recipes["cmc"].method_args["view_crops"] == "independent"  # the supplement's "cropping between views"
    # SiMo is MoCo v2 without the queue: in the tier the two differ in their negatives only.
    assert simo["symmetric"] is recipes["mocov2"].method_args["symmetric"] is True
    assert simo["momentum"] == recipes["mocov2"].method_args["momentum"]
    assert simo["temperature"] == recipes["mocov2"].method_args["temperature"]


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=900)


def test_every_tier_method_has_a_recipe_and_bad_input_is_one_line(tmp_path: Path) -> None:
    for method in TIER:
        assert (ROOT / "recipes" / f"{method}_imagenette64_cpu_tier.yaml").is_file(), method
    env = {**os.environ, "PYTHON": sys.executable, "DATA_DIR": str(tmp_path)}
    proc = _run(env, "byol")
    assert proc.returncode == 2 and proc.stderr.startswith("error: no CPU-tier recipe for 'byol'")
    proc = _run(env, "dcl")
    assert proc.returncode == 2 and "imagenette128-train.tar.gz not found" in proc.stderr


@pytest.mark.slow
def test_driver_pretrains_resumes_evaluates_and_bundles(tmp_path: Path) -> None:
    data = _imagenette_like(tmp_path / "datasets")
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "PYTHON": sys.executable, "DATA_DIR": str(data), "OUT": str(out), "RUN_ROOT": str(runs),
           "CL_ZOO_CACHE": str(tmp_path / "cache"), "POLL_S": "1", "KNN_K": "5", "EPOCHS": "1"}
    tiny = ["--set", "model_args.width=0.125", "--batch-size", "16", "--image-size", "32", "--device", "cpu",
            "--workers", "0", "--knn-every", "1"]
    first = _run({**env, "KNN_K": "5"}, "dcl", *tiny)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "--resume" not in first.stdout.splitlines()[0]
    second = _run({**env, "EPOCHS": "2"}, "dcl", *tiny)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "--resume" in second.stdout.splitlines()[0]
    log = (out / "dcl_resnet18.imagenette64_cpu" / "logs" / "pretrain.log").read_text()
    assert "resumed" in log and "epoch 2/2" in log
    assert "float16 check passed" in second.stdout

    dest = out / "dcl_resnet18.imagenette64_cpu"
    config = json.loads((dest / "model" / "config.json").read_text())
    assert config["weights_dtype"] == "float16"
    assert config["recipe"]["method"] == "dcl" and config["recipe"]["epochs"] == 2
    assert "imagenette_knn_k5_top1" in config["metrics"] and "imagenette_linear_fast_top1" in config["metrics"]
    knn = json.loads((dest / "reports" / "knn.json").read_text())
    assert knn["data"]["name"] == "imagenette"
    assert (dest / "run" / "metrics.csv").read_text().count("\n") == 3  # header + two epochs
